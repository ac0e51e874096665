"""A short whole run kept in GCS, against a real GCS-API server (gcp-storage-emulator on
loopback, tests/gcs_emulator.py; the clients inherit STORAGE_EMULATOR_HOST): the data is
a `Gcp` bucket location (no data server), the run starts from a `Gcs` checkpoint (the
initial model uploaded as step 0), and every client uploads its cooldown checkpoint with
`--gcs-bucket`, reported to the coordinator. Coordinator + 2 clients."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_helpers import checkpoint_digests, events, log_tails
from gcs_emulator import gcs_emulator
from loopback import free_base_port, free_port

from client_image.training.gcs_checkpoint import upload_checkpoint_to_gcs
from coordinator import load_state_file
from coordinator.config import (
    DontShuffle,
    GcpBucket,
    GcsCheckpoint,
    HttpDataLocation,
    P2PGcsCheckpoint,
    TokenSize,
)
from local_testnet.config_variant import write_config_variant
from local_testnet.testnet import Testnet, TestnetOptions, run_headless

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


async def test_a_run_reads_its_data_and_keeps_its_checkpoints_in_a_bucket(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the clients' downloads
    with gcs_emulator(monkeypatch) as gcs:
        data = gcs.create_bucket("tokens")
        for file in sorted((ROOT / "assets" / "data" / "train").glob("*.ds")):
            data.blob(f"train/{file.name}").upload_from_filename(str(file))
        data.blob("train/README.txt").upload_from_string(b"not a token file")
        gcs.create_bucket("ckpts")
        config_dir = write_config_variant(tmp_path / "config", free_port(), total_steps=4,
                                          init_min_clients=2, min_clients=2,
                                          epoch_time=25, warmup_time=20)
        state = load_state_file(config_dir / "state.toml")
        initial = Path(state.model.checkpoint.repo_id)
        initial = initial if initial.is_absolute() else ROOT / initial
        upload_checkpoint_to_gcs(initial, "ckpts", "run", run_id=state.run_id, epoch=0, step=0)
        state = state.model_copy(update={"model": state.model.model_copy(update={
            "data_location": HttpDataLocation(
                location=GcpBucket(bucket_name="tokens", filter_directory="train"),
                token_size_in_bytes=TokenSize.TwoBytes, shuffle=DontShuffle()),
            "checkpoint": GcsCheckpoint(bucket="ckpts", prefix="run")})})
        (config_dir / "state.toml").write_text(state.to_toml())
        (config_dir / "data.toml").unlink()  # no data server: the clients read the bucket
        testnet = Testnet(TestnetOptions(
            num_clients=2, config_path=config_dir, work_dir=tmp_path / "work",
            server_port=free_port(), metrics_base_port=free_base_port(1), timeout_s=300,
            client_args=["--gcs-bucket", "ckpts", "--gcs-prefix", "run"]))
        summary = await run_headless(testnet)
        work = testnet.options.work_dir
        assert summary["error"] is None, f"{summary}\n{log_tails(work)}"
        assert summary["finished"] and summary["final_step"] == 4
        assert summary["clients_identical"], summary
        for client in (1, 2):
            loads = events(work, client, "model_loaded")
            assert loads[0]["source"] == "gcs" and loads[0]["detail"] == "step0", loads
            assert any(event["repo"] == "gs://ckpts/run"
                       for event in events(work, client, "uploaded"))
        # The bucket holds the run's last cooldown checkpoint, the clients' own bytes.
        manifest = gcs.bucket("ckpts").blob("run/manifest.json").download_as_bytes()
        last = max(checkpoint_digests(work, 1))
        assert f'"step": {last}' in manifest.decode()
        stored = gcs.bucket("ckpts").blob("run/model.safetensors").download_as_bytes()
        saved = next((work / "client-1" / "checkpoints").glob(f"*-step{last}"))
        assert stored == (saved / "model.safetensors").read_bytes()
        # The coordinator took the reports: the run's checkpoint is the bucket (P2PGcs
        # between epochs, as Psyche's end_cooldown makes it).
        assert isinstance(testnet.state.model.checkpoint, GcsCheckpoint | P2PGcsCheckpoint)
