"""run-manager upload-data and download-results against a real GCS-API emulator and the
local validator (both on loopback); where they go is read from the run on chain."""

from __future__ import annotations

import json
import tomllib

import pytest
import tomli_w
from gcs_emulator import gcs_emulator

from psyche_solana.localnet import Localnet
from tests.solana.test_cli import STATE, funded_wallet, run_cli


@pytest.fixture(scope="module")
def localnet():
    with Localnet() as net:
        yield net


@pytest.fixture
def gcs(monkeypatch):
    with gcs_emulator(monkeypatch) as client:
        yield client


def _run_with(localnet, tmp_path, run_id: str, *, checkpoint=None, data_location=None) -> None:
    owner_path, _ = funded_wallet(tmp_path, "owner", localnet)
    assert run_cli(localnet, owner_path, "create-run", "-r", run_id, "-c", "v1").exit_code == 0
    state = tomllib.loads(STATE.read_text())
    if checkpoint is not None:
        state["model"]["LLM"]["checkpoint"] = checkpoint
    if data_location is not None:
        state["model"]["LLM"]["data_location"] = data_location
    config = tmp_path / f"{run_id}.toml"
    config.write_text(tomli_w.dumps(state))
    updated = run_cli(localnet, owner_path, "update-config", "-r", run_id, "--config-path", str(config))
    assert updated.exit_code == 0, updated.output


def test_upload_data_goes_to_the_runs_gcp_data_location(localnet, gcs, tmp_path):
    gcs.create_bucket("training-data")
    _run_with(localnet, tmp_path, "gcp-data", data_location={"Http": {
        "location": {"Gcp": {"bucket_name": "training-data", "filter_directory": "tokens"}},
        "token_size_in_bytes": "TwoBytes", "shuffle": "DontShuffle"}})
    data = tmp_path / "data"
    (data / "part").mkdir(parents=True)
    (data / "000.ds").write_bytes(b"\x01\x00" * 100)
    (data / "part" / "001.ds").write_bytes(b"\x02\x00" * 50)
    sent = run_cli(localnet, None, "upload-data", str(data), "-r", "gcp-data")
    assert sent.exit_code == 0, sent.output
    assert "uploaded 2 file(s), 300 bytes, to gs://training-data/tokens" in sent.output
    blobs = {b.name: b.download_as_bytes() for b in gcs.list_blobs("training-data")}
    assert blobs == {"tokens/000.ds": b"\x01\x00" * 100, "tokens/part/001.ds": b"\x02\x00" * 50}

    one = run_cli(localnet, None, "upload-data", str(data / "000.ds"), "--bucket", "training-data",
               "--prefix", "single")
    assert one.exit_code == 0 and gcs.bucket("training-data").blob("single/000.ds").exists()

    for argv, code, message in (
            (["upload-data", str(tmp_path / "absent"), "--bucket", "training-data"], 2,
             "absent: no such file or folder"),
            (["upload-data", str(data), "--bucket", "no-such-bucket"], 1,
             "uploading to gs://no-such-bucket: not found"),
            (["upload-data", str(data)], 2, "give exactly one of -r/--run-id and --bucket"),
            (["upload-data", str(data), "-r", "no-such-run"], 1, "no run 'no-such-run'"),
    ):
        bad = run_cli(localnet, None, *argv)
        assert bad.exit_code == code and message in bad.output, (argv, bad.output)
        assert len(bad.output.strip().splitlines()) == 1


def test_download_results_fetches_the_runs_gcs_checkpoint(localnet, gcs, tmp_path):
    from client_image.training.gcs_checkpoint import upload_checkpoint_to_gcs

    gcs.create_bucket("results")
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text('{"model_type": "llama"}')
    (checkpoint / "model.safetensors").write_bytes(b"\x00" * 4096)
    upload_checkpoint_to_gcs(checkpoint, "results", "run7", run_id="gcs-ckpt", epoch=2, step=42,
                             client=gcs)
    _run_with(localnet, tmp_path, "gcs-ckpt", checkpoint={"Gcs": {"bucket": "results",
                                                                  "prefix": "run7"}})
    out = tmp_path / "out"
    got = run_cli(localnet, None, "download-results", "-r", "gcs-ckpt", "--output-dir", str(out))
    assert got.exit_code == 0, got.output
    folder = out / "gcs-ckpt-step42"
    assert (folder / "model.safetensors").read_bytes() == b"\x00" * 4096
    assert json.loads((folder / "config.json").read_text()) == {"model_type": "llama"}
    assert json.loads((folder / "manifest.json").read_text())["metadata"]["step"] == 42

    gcs.bucket("results").blob("loose/weights.bin").upload_from_string(b"abc")
    loose = run_cli(localnet, None, "download-results", "--bucket", "results", "--prefix", "loose",
                 "--output-dir", str(out))
    assert loose.exit_code == 0 and (out / "results-latest" / "weights.bin").read_bytes() == b"abc"

    gcs.bucket("results").blob("broken/manifest.json").upload_from_string(b"{not json")
    _run_with(localnet, tmp_path, "hub-ckpt", checkpoint={"Hub": {"repo_id": "org/model"}})
    for argv, message in (
            (["download-results", "-r", "hub-ckpt"], "keeps its checkpoints as HubCheckpoint "
                                                     "(org/model on the Hugging Face Hub)"),
            (["download-results", "--bucket", "results", "--prefix", "empty"],
             "gs://results/empty: no checkpoint files there"),
            (["download-results", "--bucket", "results", "--prefix", "broken"],
             "broken/manifest.json is not a checkpoint manifest"),
            (["download-results", "--bucket", "gone-bucket"], "gs://gone-bucket: not found")):
        bad = run_cli(localnet, None, *argv, "--output-dir", str(tmp_path / "bad"))
        assert bad.exit_code == 1 and message in bad.output, (argv, bad.output)
        assert len(bad.output.strip().splitlines()) == 1
