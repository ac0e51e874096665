"""The run-manager's Solana subcommands (Psyche's names; docs/solana.md,
"Run-manager subcommands"), over JSON-RPC
to any cluster running our programs — by default the embedded `psyche-localnet`.

Common options: `--rpc` (env RPC; default the local validator, `psyche-localnet`, on
127.0.0.1:8899), `--rpc-2` (env RPC_2, the fallback endpoint), Psyche's `--ws-rpc` (env
WS_RPC) and `--ws-rpc-2` (env WS_RPC_2), checked to be ws:// or wss:// URLs and otherwise
unused (these commands work over --rpc), and for
signing commands `-w/--wallet-private-key-path` (env WALLET_PRIVATE_KEY_PATH) or
RAW_WALLET_PRIVATE_KEY (a JSON array of 64 bytes or their base58 string; it wins over the
file, as in Psyche). Every on-chain failure is printed as
its error's name and meaning (e.g. `NotAuthorized: no active join authorization ...`)
and the command exits 1; bad arguments exit 2.
"""

from __future__ import annotations

from collections.abc import Callable

import typer

from run_manager.commands import storage, wallet_solana
from run_manager.commands.solana_authorizations import (
    can_join,
    join_authorization_create,
    join_authorization_delegate,
    join_authorization_delete,
    join_authorization_read,
)
from run_manager.commands.solana_common import SOLANA_PANEL, with_websocket_options
from run_manager.commands.solana_lifecycle import accept_model_loss, checkpoint, close_run
from run_manager.commands.solana_list_runs import list_runs
from run_manager.commands.solana_rewards import treasurer_claim_rewards, treasurer_top_up_rewards
from run_manager.commands.solana_runs import (
    create_run,
    json_dump_run,
    json_dump_user,
    set_future_epoch_rates,
    set_paused,
    tick,
    update_config,
)

COMMANDS: dict[str, Callable[..., None]] = {
    "create-run": create_run, "close-run": close_run, "update-config": update_config,
    "set-paused": set_paused, "checkpoint": checkpoint,
    "accept-model-loss": accept_model_loss,
    "set-future-epoch-rates": set_future_epoch_rates,
    "join-authorization-create": join_authorization_create,
    "join-authorization-delegate": join_authorization_delegate,
    "join-authorization-delete": join_authorization_delete,
    "join-authorization-read": join_authorization_read, "can-join": can_join,
    "treasurer-top-up-rewards": treasurer_top_up_rewards,
    "treasurer-claim-rewards": treasurer_claim_rewards, "json-dump-run": json_dump_run,
    "json-dump-user": json_dump_user, "list-runs": list_runs, "tick": tick,
}
SOLANA_COMMANDS = {name: (fn.__doc__ or "").strip().splitlines()[0] for name, fn in COMMANDS.items()}


def register(app: typer.Typer) -> None:
    for name, function in COMMANDS.items():
        app.command(name, rich_help_panel=SOLANA_PANEL)(with_websocket_options(function))
    storage.register(app)
    wallet_solana.register(app)
