"""A short local run with W&B and the coordinator's spans, as an operator sets them up:
`psyche-coordinator run --otlp-tracing-url` pushing to a real OTLP/HTTP receiver, and one
`psyche-client train --wandb-project --wandb-group` in W&B's offline mode (a temporary
WANDB_DIR). The local-testnet config cut to 8 steps and one client (~35 s on a busy
2-core machine). Then:
  * the W&B run's transaction log holds each trained step's loss, lr, tokens/s, and
    confidence and efficiency computed from the real model's vocabulary (tiny-llama:
    4096 tokens) and the real step times;
  * the coordinator's spans arrived over OTLP: its join, the ticks that moved the run
    (WaitingForMembers -> Warmup, RoundWitness -> RoundTrain each round, -> Cooldown ->
    Finished), and the client's warm-up and round witnesses.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from telemetry_helpers import OtlpReceiver, attributes, free_port
from test_telemetry_local_run import RUN_ID, SECRET_HEX, TESTNET, stop

from psyche_common.identity import Identity
from tests.telemetry.wandb_records import OfflineRun, read_offline_run

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
VOCAB_BITS = math.log2(4096)  # assets/tiny-llama
TOTAL_STEPS = 8


def write_config(directory: Path, data_port: int) -> tuple[Path, Path]:
    """The local-testnet config for one client and TOTAL_STEPS steps (the run's and the
    lr schedule's), its data served on `data_port`."""
    state = (TESTNET / "state.toml").read_text()
    state = state.replace("127.0.0.1:20001", f"127.0.0.1:{data_port}")
    state = re.sub(r"init_min_clients = \d+", "init_min_clients = 1", state)
    state = re.sub(r"total_steps = \d+", f"total_steps = {TOTAL_STEPS}", state)
    (directory / "state.toml").write_text(state)
    data = (TESTNET / "data.toml").read_text().replace(
        "../../assets/data/train", str(REPO / "assets" / "data" / "train"))
    (directory / "data.toml").write_text(data)
    return directory / "state.toml", directory / "data.toml"


@dataclass
class Run:
    client_exit: int
    client_output: str
    wandb: OfflineRun
    spans: dict[str, list[dict[str, Any]]]  # coordinator span name -> attributes, in order


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    work = tmp_path_factory.mktemp("wandb_spans_run")
    server_port, data_port = free_port(), free_port()
    state, data = write_config(work, data_port)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("CLIENT_VERSION", None)
    with OtlpReceiver() as receiver, (work / "coordinator.log").open("w") as coordinator_log:
        coordinator = subprocess.Popen(
            [sys.executable, "-m", "coordinator_tcp", "run", "--state", str(state),
             "--data-config", str(data), "--server-port", str(server_port),
             "--bind-host", "127.0.0.1", "--tick-interval", "0.2",
             "--otlp-tracing-url", receiver.url("traces")],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=coordinator_log, text=True)
        try:
            client_env = {**env, "RAW_IDENTITY_SECRET_KEY": SECRET_HEX, "WANDB_MODE": "offline",
                          "WANDB_DIR": str(work), "WANDB_SILENT": "true"}
            client = subprocess.run(
                [sys.executable, "-m", "client_image.cli", "train", "--run-id", RUN_ID,
                 "--server-addr", f"127.0.0.1:{server_port}", "--iroh-relay", "disabled",
                 "--bind-p2p-interface", "127.0.0.1", "--torch-threads", "1",
                 "--wandb-project", "psyche-local", "--wandb-group", RUN_ID],
                cwd=REPO, env=client_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True, timeout=240, check=False)
        finally:
            stop(coordinator)  # its telemetry flushes the last spans on the way out
        spans: dict[str, list[dict[str, Any]]] = {}
        for request in receiver.traces():
            for group in request.resource_spans:
                service = attributes(group.resource.attributes)["service.name"]
                for scope in group.scope_spans:
                    for span in sorted(scope.spans, key=lambda s: s.start_time_unix_nano):
                        assert service == "psyche-coordinator"
                        spans.setdefault(span.name, []).append(attributes(span.attributes))
    assert client.returncode == 0, client.stdout[-3000:]
    yield Run(client.returncode, client.stdout, read_offline_run(work), spans)


def test_the_wandb_run_has_each_steps_metrics(run: Run) -> None:
    assert (run.wandb.run.project, run.wandb.run.run_group) == ("psyche-local", RUN_ID)
    rows = run.wandb.by_step()
    assert len(rows) >= TOTAL_STEPS - 4, sorted(rows)
    for step, row in rows.items():
        loss = row["train/loss"]
        assert math.isfinite(loss) and 0 < loss < 20, (step, row)
        assert row["train/confidence"] == pytest.approx(1 - loss / VOCAB_BITS, abs=1e-6)
        assert 0 < row["train/lr"] <= 2e-3 and row["train/tokens_per_sec"] > 0
    efficiencies = [row["train/efficency"] for row in rows.values() if "train/efficency" in row]
    assert len(efficiencies) == len(rows) - 1  # every step but the first
    assert all(0 < e <= 1.0 for e in efficiencies), efficiencies


def test_the_coordinator_exported_its_spans_over_otlp(run: Run) -> None:
    node_id = Identity.from_hex(SECRET_HEX).node_id
    [join, *_] = run.spans["coordinator.join"]
    assert join["psyche.client"] == Identity.from_hex(SECRET_HEX).public_key.hex()
    assert join["psyche.p2p_address"].startswith(node_id)
    moves = [(t["psyche.from_run_state"], t["psyche.run_state"])
             for t in run.spans["coordinator.tick"]]
    # The ticks that moved the run; the client's witnesses moved it the other times
    # (Warmup -> RoundTrain, RoundTrain -> RoundWitness): those are witness spans.
    assert moves[0] == ("WaitingForMembers", "Warmup"), moves
    assert moves[-2:] == [("RoundWitness", "Cooldown"), ("Cooldown", "Finished")], moves
    assert set(moves[1:-2]) == {("RoundWitness", "RoundTrain")}, moves
    assert len(moves[1:-2]) >= TOTAL_STEPS - 3, moves
    witnesses = run.spans["coordinator.witness"]
    kinds = [w["psyche.kind"] for w in witnesses]
    assert kinds[0] == "warmup" and set(kinds[1:]) == {"round"}, kinds
    assert len(kinds) - 1 >= TOTAL_STEPS - 2, kinds
    assert all(w["psyche.accepted"] for w in witnesses), witnesses
