"""A DeepSeek-V3-style MoE (Psyche's HfDeepseek) trains with DisTrO like any other model:
fused 3-D experts, router, shared expert and MLA attention included; its checkpoints
round-trip; the run's architecture is checked against the checkpoint's config."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from tiny_deepseek import write_tiny_deepseek
from training_assets import TINY_MODEL, TRAIN_DATA
from transformers import AutoConfig

from client_image.training.architecture import (
    ArchitectureMismatch,
    check_architecture,
    check_tensor_parallel,
)
from client_image.training.checkpoint import bf16_state_dict, read_checkpoint, save_checkpoint
from client_image.training.distro import plan_parameter
from client_image.training.layout_check import check_layout
from client_image.training.model import load_causal_lm, round_to_bf16_
from client_image.training.parallel import ParallelDims
from client_image.training.trainer import DistroTrainer
from coordinator.config import ConstantLR, DistroOptimizer
from psyche_common.token_files.local import LocalDataProvider

DISTRO = DistroOptimizer(
    compression_decay=0.999, compression_topk=8, compression_chunk=64, quantize_1bit=True,
    clip_grad_norm=1.0, weight_decay=0.1,
)
EXPERTS = 4  # tests/tiny_deepseek.py


@pytest.fixture(scope="module")
def deepseek_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_deepseek(tmp_path_factory.mktemp("tiny-deepseek"))


def _trainer(model_dir: Path) -> DistroTrainer:
    model = load_causal_lm(model_dir, device="cpu")
    schedule = ConstantLR(base_lr=6e-3, warmup_init_lr=0.0, warmup_steps=0)
    return DistroTrainer(model, DISTRO, schedule, micro_batch_size=2)


def _run_two_peers(model_dir: Path, steps: int) -> tuple[DistroTrainer, DistroTrainer,
                                                         list[float]]:
    """Two peers, each on its own batches, applying both results of step - 2 each step."""
    data = LocalDataProvider(TRAIN_DATA, 32)
    first, second = _trainer(model_dir), _trainer(model_dir)
    published: dict[int, list[bytes]] = {}
    losses = []
    for step in range(steps):
        if step - 2 in published:
            assert first.apply_payloads(step, published[step - 2]) == 2
            assert second.apply_payloads(step, published[step - 2]) == 2
        ours = first.train(step, data.get_samples(8 * step, 8 * step + 3),
                           batch_id=(8 * step, 8 * step + 3))
        theirs = second.train(step, data.get_samples(8 * step + 4, 8 * step + 7),
                              batch_id=(8 * step + 4, 8 * step + 7))
        assert ours.payload is not None and theirs.payload is not None
        published[step] = [ours.payload, theirs.payload]
        losses.append(ours.loss)
    return first, second, losses


def test_the_checkpoint_is_a_deepseek_v3_moe_with_fused_experts(deepseek_dir: Path) -> None:
    model = load_causal_lm(deepseek_dir, device="cpu")
    assert type(model).__name__ == "DeepseekV3ForCausalLM"
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    assert shapes["model.layers.1.mlp.experts.gate_up_proj"] == (EXPERTS, 64, 64)
    assert shapes["model.layers.1.mlp.experts.down_proj"] == (EXPERTS, 64, 32)
    assert "model.layers.1.mlp.shared_experts.gate_proj.weight" in shapes
    assert "model.layers.1.self_attn.kv_a_proj_with_mqa.weight" in shapes  # MLA
    assert "model.layers.0.mlp.gate_proj.weight" in shapes  # the first layer is dense
    # The router's score correction is a buffer: saved and loaded, never trained.
    assert "model.layers.1.mlp.gate.e_score_correction_bias" not in shapes
    # DisTrO cuts a fused [experts, out, in] parameter into one matrix per expert.
    plan = plan_parameter("experts", shapes["model.layers.1.mlp.experts.down_proj"], 64, 8)
    assert (plan.leading, plan.rows, plan.cols) == (EXPERTS, 64, 32)


def test_distro_trains_every_parameter_experts_included(deepseek_dir: Path) -> None:
    first, second, losses = _run_two_peers(deepseek_dir, steps=8)
    assert losses[-1] < losses[0] - 0.3, losses
    initial = load_causal_lm(deepseek_dir, device="cpu")
    before = dict(initial.named_parameters())
    trained = [(name, p) for name, p in first.model.named_parameters() if p.requires_grad]
    moved = [name for name, p in trained if not torch.equal(p, before[name])]
    assert len(trained) == 30 and moved == [name for name, _ in trained]
    # Every routed expert of the fused weights moved, not only some of them.
    for name in ("model.layers.1.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.down_proj"):
        now = dict(first.model.named_parameters())[name]
        assert all(not torch.equal(now[e], before[name][e]) for e in range(EXPERTS)), name
    bias = "model.layers.1.mlp.gate.e_score_correction_bias"
    assert torch.equal(first.model.get_buffer(bias), initial.get_buffer(bias))
    # Two clients that applied the same results hold the same model, bit for bit.
    ours, theirs = first.model.state_dict(), second.model.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[key], theirs[key]) for key in ours)


def test_the_checkpoint_round_trips_in_deepseek_layout(deepseek_dir: Path,
                                                       tmp_path: Path) -> None:
    trainer = _trainer(deepseek_dir)
    data = LocalDataProvider(TRAIN_DATA, 32)
    trainer.train(0, data.get_samples(0, 3))
    payload = trainer.train(1, data.get_samples(4, 7)).payload
    assert payload is not None
    trainer.apply_payloads(2, [payload])
    round_to_bf16_(trainer.model)
    written = save_checkpoint(trainer.model, tmp_path, "run", 2, tokenizer_dir=deepseek_dir)
    with safe_open(str(written / "model.safetensors"), "pt") as weights:
        keys = set(weights.keys())
    # On disk, DeepSeek's own per-expert tensors (what Psyche and the Hub's models hold).
    assert {f"model.layers.1.mlp.experts.{e}.down_proj.weight" for e in range(EXPERTS)} <= keys
    assert (written / "tokenizer.json").is_file()
    loaded = load_causal_lm(written, device="cpu")
    ours, theirs = trainer.model.state_dict(), loaded.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[key], theirs[key]) for key in ours)
    # A restarted holder reads it back as the fused weights its peers share.
    _, _, shared = read_checkpoint(written)
    sharing = bf16_state_dict(trainer.model)
    assert shared.keys() == sharing.keys()
    assert all(torch.equal(shared[key], sharing[key]) for key in sharing)


def test_the_architecture_is_checked_against_the_checkpoint(deepseek_dir: Path) -> None:
    deepseek, llama = AutoConfig.from_pretrained(deepseek_dir), AutoConfig.from_pretrained(TINY_MODEL)
    check_architecture(deepseek, "HfDeepseek")
    check_architecture(llama, "HfLlama")
    check_architecture(deepseek, "HfAuto")
    check_architecture(llama, "HfAuto")
    with pytest.raises(ArchitectureMismatch) as mismatch:
        check_architecture(deepseek, "HfLlama")
    assert str(mismatch.value) == ("the run says HfLlama, the checkpoint is deepseek_v3 "
                                   "(DeepseekV3ForCausalLM): HfLlama needs a llama checkpoint")
    with pytest.raises(ArchitectureMismatch, match="the run says HfDeepseek, the checkpoint is "
                                                   r"llama \(LlamaForCausalLM\)"):
        check_architecture(llama, "HfDeepseek")
    with pytest.raises(ArchitectureMismatch, match="the run says Torchtitan: this client loads"):
        check_architecture(llama, "Torchtitan")
    check_tensor_parallel(llama, 2)
    check_tensor_parallel(deepseek, 1)
    with pytest.raises(ArchitectureMismatch, match=r"tensor parallelism \(T = 2\) splits Llama "
                                                   "models only, the checkpoint is deepseek_v3"):
        check_tensor_parallel(deepseek, 2)


@pytest.mark.slow
def test_two_data_parallel_ranks_train_the_moe_like_one_device(deepseek_dir: Path) -> None:
    # FSDP2 over D shards any decoder (model.model.layers): real rank processes, gloo.
    report = check_layout(ParallelDims(2, 1), model_dir=str(deepseek_dir), steps=3)
    assert report["result_max_abs_diff"] <= 1e-4, report
    assert report["grad_max_abs_diff"] <= 1e-5, report
    assert report["weights_identical"], report
