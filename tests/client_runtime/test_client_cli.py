"""`psyche-client train` refuses what this host cannot do before it joins anything."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from client_image.cli import app

runner = CliRunner()
BASE = ["train", "--run-id", "r", "--server-addr", "127.0.0.1:9", "--logs", "none"]


@pytest.mark.parametrize(("args", "message"), [
    (["--data-parallelism", "2", "--local-ranks", "3"], "3 local ranks for a world of 2"),
    (["--data-parallelism", "2", "--tensor-parallelism", "2", "--local-ranks", "5"],
     "5 local ranks for a world of 4"),
])
def test_an_impossible_rank_layout_is_a_usage_error(args: list[str], message: str) -> None:
    result = runner.invoke(app, [*BASE, "--device", "cpu", *args], env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert "Traceback" not in result.output


def test_ranks_meet_on_a_free_port_unless_sidecars_need_a_known_one() -> None:
    from client_image.train_support import rank_setup as _rank_setup

    assert _rank_setup(1, 1, None, 0, "cpu") is None  # one device: no ranks at all
    alone = _rank_setup(2, 1, None, 0, "cpu")
    assert alone is not None and alone.main_port == 0 and alone.here == 2
    spread = _rank_setup(2, 2, 2, 0, "cpu")
    assert spread is not None and spread.main_port == 29500 and spread.here == 2
    chosen = _rank_setup(2, 2, 1, 31000, "cpu")
    assert chosen is not None and chosen.main_port == 31000


@pytest.mark.parametrize(("args", "message"), [
    (["--world-size", "2", "--start-rank", "2"], "ranks 2..2 do not fit a world of 2"),
    (["--world-size", "4", "--start-rank", "1", "--local-ranks", "4"],
     "ranks 1..4 do not fit a world of 4"),
    (["--world-size", "2", "--start-rank", "1", "--device", "tpu"], "use cpu or cuda"),
])
def test_a_sidecar_that_cannot_fit_the_world_is_refused(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["sidecar", "--main-host", "127.0.0.1", *args],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert "Traceback" not in result.output


@pytest.mark.parametrize(("args", "message"), [
    (["--device", "bogus"], "'bogus' is not a torch device"),
    pytest.param(["--device", "cuda:0"], "cuda:0: this host has no CUDA device",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA host")),
    pytest.param(["--device", "cuda"], "cuda: this host has no CUDA device",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA host")),
    (["--device", "meta"], "meta: this client trains on cpu or cuda devices"),
    (["--dtype", "fp8"], "unknown dtype 'fp8'; use auto, bf16 or fp32"),
    (["--bind-p2p-interface", "nosuchif*"],
     "no network interface matching 'nosuchif*' has an IPv4 address"),
])
def test_an_impossible_device_or_interface_is_a_usage_error(args: list[str],
                                                            message: str) -> None:
    result = runner.invoke(app, [*BASE, *args], env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert "Traceback" not in result.output


def test_a_loopback_interface_pattern_and_an_ip_are_accepted() -> None:
    from client_image.host import bind_address

    assert bind_address("lo*") == ("0.0.0.0", "lo*")
    assert bind_address("127.0.0.1") == ("127.0.0.1", None)
    assert bind_address(None) == ("0.0.0.0", None)


def test_the_run_managers_list_of_client_variables_is_the_clients() -> None:
    """The run-manager warns about env-file keys the client does not read: its list
    (psyche_common.client_env) must be exactly the client CLI's environment names."""
    import typer.main

    from psyche_common.client_env import CLIENT_OPTION_VARIABLES

    names: set[str] = set()
    for command in typer.main.get_group(app).commands.values():
        for param in command.params:
            envvar = getattr(param, "envvar", None)
            names.update([envvar] if isinstance(envvar, str) else envvar or [])
    assert names == CLIENT_OPTION_VARIABLES


def test_psyches_relay_names_are_accepted() -> None:
    from client_image.train_support import PSYCHE_RELAYS
    from client_image.train_support import relay_choice as _relay

    assert _relay("psyche") == ("custom", PSYCHE_RELAYS)
    assert _relay("n0") == _relay("default") == ("default", ())
    assert _relay("disabled") == ("disabled", ())
    assert _relay("https://a.example,https://b.example") == (
        "custom", ("https://a.example", "https://b.example"))


def test_an_unknown_relay_is_a_usage_error() -> None:
    result = runner.invoke(app, [*BASE, "--iroh-relay", "nearest"], env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert "use psyche, n0 (or default), disabled" in " ".join(result.output.split())


def test_a_checkpoint_dir_that_cannot_take_checkpoints_is_a_usage_error(tmp_path: Path) -> None:
    """Checked at start: found only at the first cooldown, every save would fail an epoch
    later."""
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    for directory, message in ((a_file, f"--checkpoint-dir {a_file} is a file, not a directory"),
                               (Path("/proc"), "--checkpoint-dir /proc: cannot write there (")):
        result = runner.invoke(app, [*BASE, "--device", "cpu", "--checkpoint-dir",
                                     str(directory)], env={"COLUMNS": "200"})
        assert result.exit_code == 2, result.output
        assert message in result.output and "Traceback" not in result.output
        assert len(result.output.strip().splitlines()) == 1, result.output
