"""``psyche-client sidecar``: more ranks of one client, on another host.

A client with D x T ranks may spread them over hosts, as Psyche's sidecar mode does: the
main host runs `psyche-client train --data-parallelism D --tensor-parallelism T
--local-ranks n --main-port P` (ranks 0..n-1, rank 0 talks to the run) and each other
host runs `psyche-client sidecar` for its ranks, joining the main host's rendezvous
(torch.distributed's TCP store). The sidecar holds no run state: it runs whatever model
calls the main host broadcasts (training/rank_group.py).
"""

from __future__ import annotations

from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    app.command("sidecar")(sidecar)


def sidecar(
    main_host: Annotated[str, typer.Option("--main-host", envvar="PSYCHE_MAIN_HOST",
                                           help="the host running `psyche-client train`")],
    world_size: Annotated[int, typer.Option("--world-size", envvar="PSYCHE_WORLD_SIZE", min=2,
                                            help="D x T of the client")],
    start_rank: Annotated[int, typer.Option("--start-rank", envvar="PSYCHE_START_RANK", min=1,
                                            help="the first rank this host runs")],
    local_ranks: Annotated[int, typer.Option("--local-ranks", envvar="LOCAL_RANKS", min=1,
                                             help="how many ranks this host runs")] = 1,
    main_port: Annotated[int, typer.Option("--main-port", envvar="PSYCHE_MAIN_PORT", min=1,
                                           max=65535)] = 29500,
    device: Annotated[str, typer.Option("--device", envvar="DEVICE",
                                        help="cpu or cuda (rank i uses cuda:i-start)")] = "cpu",
) -> None:
    """Run ranks start..start+n-1 of a client whose rank 0 is at --main-host."""
    import signal
    import subprocess
    import sys

    if start_rank + local_ranks > world_size:
        typer.echo(f"error: ranks {start_rank}..{start_rank + local_ranks - 1} do not fit a "
                   f"world of {world_size}", err=True)
        raise typer.Exit(code=2)
    if device not in ("cpu", "cuda"):
        raise typer.BadParameter("use cpu or cuda", param_hint="--device")
    if device == "cuda":
        import torch

        if local_ranks > torch.cuda.device_count():
            typer.echo(f"error: {local_ranks} ranks, but this host has "
                       f"{torch.cuda.device_count()} CUDA device(s)", err=True)
            raise typer.Exit(code=2)
    ranks = [subprocess.Popen(
        [sys.executable, "-m", "client_image.training.rank_group", "--rank", str(rank),
         "--world-size", str(world_size), "--main-host", main_host, "--main-port",
         str(main_port), "--local-rank", str(rank - start_rank), "--device", device])
        for rank in range(start_rank, start_rank + local_ranks)]

    def stop(_signum: int, _frame: object) -> None:
        # SIGTERM whatever came: a rank ignores SIGINT and SIGHUP, which reach the whole
        # process group and are its starter's to handle (training/rank_group.py).
        for process in ranks:
            process.send_signal(signal.SIGTERM)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)
    codes = [process.wait() for process in ranks]
    raise typer.Exit(code=max(codes) if all(c >= 0 for c in codes) else 1)
