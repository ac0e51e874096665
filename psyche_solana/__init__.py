"""The decentralized backend: our Solana programs (C, linked by us), a local validator,
instruction builders, account decoders and an RPC client.

    python -m psyche_solana.build            # clang + our linker -> build/programs/*.so
    psyche-localnet                          # LiteSVM: JSON-RPC on :8899, PubSub WebSocket on :8900

Modules (the public surface):
    instructions  builders for the coordinator, authorizer and treasurer programs
    accounts      decoders: decode_coordinator(data).state is a coordinator.CoordinatorState
    rpc           SolanaRpc (httpx, fallback endpoint, retries), ProgramError
    subscription  AccountSubscription: accountSubscribe over WS_RPC / WS_RPC_2, polling fallback
    runs          run administration over RPC (what run-manager's subcommands do)
    localnet      Localnet / LocalValidator / main (psyche-localnet); validator: its JSON-RPC
                  methods; pubsub: its WebSocket (accountSubscribe / accountNotification)
    svm, scenario our programs in an in-process LiteSVM (tests, benchmarks)
    linker, build, deploy   the toolchain: .o -> SBPFv0 .so, build, upgradeable-loader deploy
    errors        custom error codes as words
"""

from psyche_solana.accounts import AccountDecodeError, CoordinatorAccount, decode_coordinator
from psyche_solana.errors import describe, error_name
from psyche_solana.ids import authorizer_program, coordinator_program, treasurer_program

__all__ = [
    "AccountDecodeError", "CoordinatorAccount", "authorizer_program", "coordinator_program",
    "decode_coordinator", "describe", "error_name", "treasurer_program",
]
