"""The model section of an on-chain run, for ``psyche-client predownload --rpc URL --run-id RUN``.

    run_config_from_solana(rpc_urls, run_id, timeout_s) -> LLMConfig   (async)

The run is found as the client finds it at train time (psyche_solana.runs.find_run: the
run id's claim, then its coordinator account) and the account decoded
(psyche_solana.accounts.decode_coordinator); its model section names the checkpoint the
client's warm-up loads (a Hub repo and revision, a Gcs bucket and prefix, P2P's base
repo). Reading needs JSON-RPC only: no wallet, no WebSocket, nothing sent. The coordinator
program is ours unless PSYCHE_COORDINATOR_PROGRAM_ID names another, as for the client.

Each failure is a `PredownloadError` of one line: no RPC endpoint answered, no such run,
an account that does not decode, a run whose owner has not set a model yet.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from client_image.predownload_cli import PredownloadError

if TYPE_CHECKING:
    from coordinator.config import LLMConfig


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


async def run_config_from_solana(rpc_urls: Sequence[str | None], run_id: str,
                                 timeout_s: float = 10.0) -> LLMConfig:
    """The run's model section, read from its coordinator account over JSON-RPC."""
    from psyche_solana.accounts import AccountDecodeError
    from psyche_solana.rpc import RpcError, RpcUnavailable, SolanaRpc
    from psyche_solana.runs import RunNotFound, find_run

    urls = [url for url in rpc_urls if url]
    where = ", ".join(urls)
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise PredownloadError(f"--rpc must be an http:// or https:// URL, got {url!r}")
    try:
        # Two tries per endpoint: an operator waiting on a wrong URL learns it in seconds.
        async with SolanaRpc(urls, timeout_s=timeout_s, retries=2) as rpc:
            run = await find_run(rpc, run_id)
    except RunNotFound as exc:
        raise PredownloadError(f"{exc} (asked {where})") from None
    except RpcUnavailable as exc:
        cause = _first_line(exc).rpartition("): ")[2] or _first_line(exc)
        raise PredownloadError(f"cannot reach the Solana RPC at {where}: {cause}") from None
    except RpcError as exc:
        raise PredownloadError(f"the Solana RPC at {where}: {_first_line(exc)}") from None
    except AccountDecodeError as exc:
        raise PredownloadError(f"run {run_id!r}: its coordinator account does not decode: "
                               f"{_first_line(exc)}") from None
    state = run.account.state
    if state is None:
        raise PredownloadError(f"run {run_id!r} has no model yet: its owner has not set its "
                               "config and model (run-manager update-config --config-path)")
    return state.model


__all__ = ["run_config_from_solana"]
