"""`psyche-testnet`: a whole local run on this machine (see `local_testnet.testnet`).

    psyche-testnet --num-clients 3 --config-path config/local-testnet --headless
    psyche-testnet replay --events-dir DIR [--speed 4] [--follow]   (local_testnet/replay_cli.py)

`--no-tui` (the default; `--headless` is its older name) waits for Finished (or `--timeout`)
and prints ONE JSON line; `--tui` shows the server, each client's metrics and witness
state, the loss and the logs instead, and on exit prints that result in words.

SIGINT (ctrl+c), SIGTERM and SIGHUP (the terminal closed) stop it: "stopping…" on stderr,
every process it started stopped (whole process groups: SIGTERM, SIGKILL after 10 s, at
once on a second signal), the JSON line (headless, its error "stopped by SIGTERM"), exit
128 + the signal (130, 143, 129) as a shell reports an interrupted job; `q` in the TUI
exits 0. Exit 0: the run finished (headless) or q; 1: a timeout, the coordinator exited,
or a config error.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from pathlib import Path
from typing import Annotated

import typer

from coordinator.config import ConfigError, ServerDataLocation
from local_testnet.ports import METRICS_BASE_PORT, pick_server_port, taken_run_ports
from local_testnet.testnet import Testnet, TestnetOptions, run_headless
from psyche_common.cli_conventions import PROGRAM_SETTINGS, version_option
from psyche_common.stopping import say

app = typer.Typer(**PROGRAM_SETTINGS, add_completion=False)


def _int_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise typer.BadParameter(f"expected client numbers like 1,2 got {text!r}") from None


@app.command()
def testnet(
    num_clients: Annotated[int, typer.Option("--num-clients", min=1, max=64)],
    config_path: Annotated[Path, typer.Option("--config-path", help="dir with state.toml "
                                              "[+ data.toml]")],
    server_port: Annotated[int | None, typer.Option(
        "--server-port", min=1, max=65535,
        help="the coordinator's port [default: 20000, or a free one when it is taken]")] = None,
    random_kill_num: Annotated[int, typer.Option("--random-kill-num", min=0)] = 0,
    random_kill_interval: Annotated[float, typer.Option("--random-kill-interval",
                                                        min=1.0)] = 120.0,
    allowed_to_kill: Annotated[str, typer.Option("--allowed-to-kill",
                                                 help="client numbers, e.g. 1,2")] = "",
    late_join_client_delay: Annotated[float, typer.Option(
        "--late-join-client-delay", min=0.0, help="start the last client this late")] = 0.0,
    tui: Annotated[bool, typer.Option("--tui/--no-tui",
                                      help="TUI, or one JSON line at the end")] = False,
    headless: Annotated[bool, typer.Option("--headless", hidden=True,
                                           help="--no-tui's older name")] = False,
    work_dir: Annotated[Path | None, typer.Option("--work-dir")] = None,
    timeout: Annotated[float, typer.Option("--timeout", min=1.0)] = 1800.0,
    data_port: Annotated[int | None, typer.Option(
        "--data-port", min=1, max=65535, help="serve the data on this port instead of the "
        "one in the config's Server data location")] = None,
    metrics_base_port: Annotated[int | None, typer.Option(
        "--metrics-base-port", min=1, max=65535 - 64,
        help=f"client i serves its metrics on this port + i [default: {METRICS_BASE_PORT}; "
        "when one of those ports is taken, free ones, and it says which]")] = None,
    version: Annotated[bool, version_option("psyche-testnet")] = False,
) -> None:
    """Start a coordinator and N clients on this machine and follow the run.

    `psyche-testnet replay --events-dir DIR` shows a run again from the event
    files of its processes' --events-dir (docs/events.md).

    SIGINT (ctrl+c), SIGTERM, SIGHUP: stop every process it started, exit
    128 + the signal (130, 143, 129); q in the TUI: exit 0. Headless: exit 0
    once the run finished, 1 on a timeout or error.
    """
    import tempfile

    server_port, server_port_note = pick_server_port(server_port)
    options = TestnetOptions(
        num_clients=num_clients, config_path=config_path.resolve(), server_port=server_port,
        work_dir=(work_dir or Path(tempfile.mkdtemp(prefix="psyche-testnet-"))).resolve(),
        random_kill_num=random_kill_num, random_kill_interval_s=random_kill_interval,
        allowed_to_kill=_int_list(allowed_to_kill),
        late_join_client_delay_s=late_join_client_delay, timeout_s=timeout, data_port=data_port,
        metrics_base_port=metrics_base_port)
    try:
        net = Testnet(options)
    except ConfigError as exc:
        for line in exc.errors:
            typer.echo(line, err=True)
        raise typer.Exit(code=1) from None
    location = net.state_file.model.data_location
    taken = taken_run_ports(options.server_port, location.address
                            if isinstance(location, ServerDataLocation) else None)
    for line in taken:
        typer.echo(line, err=True)
    if taken:
        raise typer.Exit(code=1)
    if server_port_note is not None:
        typer.echo(server_port_note, err=True)
    typer.echo(f"testnet work dir: {options.work_dir}", err=True)
    if net.fitted:
        changes = ", ".join(f"{name} {was} -> {now}" for name, was, now in net.fitted)
        typer.echo(f"config fitted to --num-clients {options.num_clients}: {changes}", err=True)
    if net.metrics_ports.note is not None:
        typer.echo(net.metrics_ports.note, err=True)
    if tui and not headless:
        from local_testnet.tui import run_testnet_tui

        asyncio.run(run_testnet_tui(net))
        say("stopped: nothing left running")
        if net.stop_signal is not signal.SIGHUP:  # a closed terminal has no one to read it
            from local_testnet.summary_words import describe_summary

            for line in describe_summary(net.summary()):
                say(line)
        _exit_after_signal(net)
        return
    result = asyncio.run(run_headless(net))
    with contextlib.suppress(OSError, ValueError):  # stdout may be a terminal that hung up
        print(json.dumps(result), flush=True)
    if net.stop_signal is not None:
        say("stopped: nothing left running")
    _exit_after_signal(net)
    if result["error"] is not None:
        raise typer.Exit(code=1)


def _exit_after_signal(net: Testnet) -> None:
    """Exit 128 + the signal that stopped the testnet (130, 143, 129), if one did."""
    if net.stop_signal is not None:
        raise typer.Exit(code=128 + int(net.stop_signal))


def main() -> None:
    import sys

    if sys.argv[1:2] == ["replay"]:  # a run shown again from its event files
        from local_testnet import replay_cli

        replay_cli.main(sys.argv[2:])
        return
    app()


if __name__ == "__main__":
    main()
