"""psyche-train end to end on the bundled assets."""

import json

from training_assets import TINY_MODEL, TRAIN_DATA
from typer.testing import CliRunner

from client_image.training.cli import app


def test_psyche_train_prints_loss_and_bytes_and_checkpoints(tmp_path):
    result = CliRunner().invoke(app, [
        "--model", str(TINY_MODEL), "--data", str(TRAIN_DATA), "--steps", "3", "--total-batch", "4",
        "--micro-batch", "2", "--peers", "2", "--optimizer", "distro", "--seq-len", "32",
        "--checkpoint-dir", str(tmp_path), "--run-id", "cli",
    ])
    assert result.exit_code == 0, result.output
    step_lines = [line for line in result.output.splitlines() if line.startswith("step")]
    assert len(step_lines) == 3
    assert "bytes/peer" in step_lines[0] and "loss" in step_lines[0]
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["val_loss"] > 0
    assert (tmp_path / "cli-step2" / "model.safetensors").is_file()


def test_psyche_train_rejects_a_bad_optimizer_and_missing_data(tmp_path):
    runner = CliRunner()
    bad = runner.invoke(app, ["--model", str(TINY_MODEL), "--data", str(TRAIN_DATA), "--optimizer", "sgd"])
    assert bad.exit_code != 0 and "distro, adamw or sparseloco" in bad.output
    uneven = runner.invoke(app, ["--model", str(TINY_MODEL), "--data", str(TRAIN_DATA),
                                 "--optimizer", "sparseloco", "--steps", "5", "--inner-steps", "2"])
    assert uneven.exit_code != 0 and "multiple of --inner-steps 2" in uneven.output
    missing = runner.invoke(app, ["--model", str(TINY_MODEL), "--data", str(tmp_path / "nope"), "--steps", "1"])
    assert missing.exit_code == 2 and "does not exist" in missing.output


def test_psyche_train_runs_sparseloco_rounds():
    result = CliRunner().invoke(app, [
        "--model", str(TINY_MODEL), "--data", str(TRAIN_DATA), "--steps", "4", "--total-batch",
        "4", "--micro-batch", "1", "--peers", "2", "--optimizer", "sparseloco", "--seq-len", "32",
        "--inner-steps", "2", "--topk-density", "0.05",
    ])
    assert result.exit_code == 0, result.output
    rounds = [line for line in result.output.splitlines() if line.startswith("round")]
    assert len(rounds) == 2 and "bytes/peer" in rounds[0]
