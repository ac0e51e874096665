"""One set of optimizer defaults: the local testnet's config is DISTRO_PSYCHE, and the
simulation starts from the same values."""

from pathlib import Path

from client_image.training.defaults import DISTRO_PSYCHE, SPARSELOCO
from client_image.training.simulate import SimulationConfig
from coordinator import load_state_file

CONFIG = Path(__file__).resolve().parents[2] / "config"


def test_the_testnet_config_and_the_simulation_share_distro_defaults():
    state = load_state_file(CONFIG / "local-testnet" / "state.toml")
    assert state.model.optimizer == DISTRO_PSYCHE
    simulation = SimulationConfig(model=Path("m"), data=Path("d"), steps=1)
    assert simulation.distro == DISTRO_PSYCHE and simulation.sparseloco == SPARSELOCO


def test_the_sparseloco_testnet_config_differs_only_where_the_model_is_smaller():
    """Its coding, decay and inner rate are the defaults'; its inner steps, density and
    outer step suit 3 CPU clients and 24 rounds (a sequence per inner step)."""
    optimizer = load_state_file(CONFIG / "local-testnet-sparseloco" / "state.toml").model.optimizer
    same = ("chunk", "quant_bits", "error_decay", "inner_lr", "clip_grad_norm")
    assert {k: getattr(optimizer, k) for k in same} == {k: getattr(SPARSELOCO, k) for k in same}
