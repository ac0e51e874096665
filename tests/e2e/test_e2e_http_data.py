"""A short whole run on HTTP data, the way many of Psyche's configs read theirs: a
`WeightedHttp` JSON blending a `SingleUrl` token file and a `NumberedFiles` set, served
by a real HTTP server on loopback (tests/data/range_http_server.py), no data server; and
the run's `architecture = "HfAuto"` (the bundled Llama loaded through
AutoModelForCausalLM). Coordinator + 2 clients, which end identical."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from data.range_http_server import serve_directory
from e2e_helpers import events, log_tails
from loopback import free_port

from coordinator import load_state_file
from coordinator.config import WeightedHttpDataLocation
from local_testnet.config_variant import write_config_variant
from local_testnet.testnet import Testnet, TestnetOptions, run_headless

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def http(location: dict[str, object]) -> dict[str, object]:
    return {"location": location, "token_size_in_bytes": "TwoBytes", "shuffle": "DontShuffle"}


async def test_two_clients_train_on_a_weighted_http_blend_with_an_hfauto_model(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    served = tmp_path / "www"
    files = sorted((ROOT / "assets" / "data" / "train").glob("*.ds"))
    (served / "single").mkdir(parents=True)
    (served / "numbered").mkdir()
    shutil.copy(files[0], served / "single" / "train.ds")
    for n, file in enumerate(files):
        shutil.copy(file, served / "numbered" / f"{n:03}.ds")
    with serve_directory(served) as server:
        (served / "mix.json").write_text(json.dumps({"shuffle": "DontShuffle", "providers": [
            [http({"SingleUrl": f"{server.url}/single/train.ds"}), 0.25],
            [http({"NumberedFiles": {"url_template": f"{server.url}/numbered/{{}}.ds",
                                     "start_index": 0, "n_left_pad_zeros": 3,
                                     "num_files": len(files)}}), 0.75]]}))
        config_dir = write_config_variant(tmp_path / "config", free_port(), total_steps=4,
                                          init_min_clients=2, min_clients=2,
                                          epoch_time=25, warmup_time=20)
        state = load_state_file(config_dir / "state.toml")
        state = state.model_copy(update={"model": state.model.model_copy(update={
            "architecture": "HfAuto",
            "data_location": WeightedHttpDataLocation(url=f"{server.url}/mix.json")})})
        (config_dir / "state.toml").write_text(state.to_toml())
        (config_dir / "data.toml").unlink()  # no data server: the clients read over HTTP
        testnet = Testnet(TestnetOptions(
            num_clients=2, config_path=config_dir, work_dir=tmp_path / "work",
            server_port=free_port(), metrics_base_port=free_port() - 2, timeout_s=300))
        summary = await run_headless(testnet)
    work = testnet.options.work_dir
    assert summary["error"] is None, f"{summary}\n{log_tails(work)}"
    assert summary["finished"] and summary["final_step"] == 4
    assert summary["clients_identical"], summary
    # Both token sources were read over HTTP (range requests), and training happened.
    paths = {path for _method, path, _range in server.requests}
    assert "/single/train.ds" in paths and any(p.startswith("/numbered/") for p in paths)
    trained = [event for client in (1, 2) for event in events(work, client, "trained")]
    assert trained and all(event["loss"] > 0 for event in trained)
