"""Psyche's env-file keys that psyche-py does not use, or refuses, with the reason.

Psyche's run-manager hands its whole env file to the client container
(`docker run --env-file`), so the keys an operator may bring from Psyche are those of
its run-manager (tools/rust-tools/run-manager/src/{lib.rs,docker/manager.rs}), of the
container's entry point (docker/train_entrypoint.sh), of the client's options that read
an env var (shared/client/src/cli.rs, architectures/decentralized/solana-client/src/
main.rs), the client's direct `std::env::var` reads (shared/), and the keys of its
example env files (config/client/.env.*). Source: PsycheFoundation/psyche @0bdb13d.

The keys psyche-py uses are RunManagerSettings' fields and the client's
(psyche_common.client_env); the README's env table lists all three groups.
"""

from __future__ import annotations

_EVENTS = "the client's event files"

# Accepted and not used: the run-manager names each in a warning.
IGNORED: dict[str, str] = {
    "HUB_MAX_CONCURRENT_DOWNLOADS": "parallel Hub downloads",
    "WRITE_LOG": "a log file", "WRITE_RUST_LOG": "a log file",
    "OPTIM_STATS_STEPS": "optimizer statistics",
    "GRAD_ACCUM_IN_FP32": "fp32 gradient accumulation",
    "MAX_CONCURRENT_DOWNLOADS": "a download limit (unused by Psyche too)",
    "SIDECAR_PORT": "multi-node Python sidecars",
    "CONFIG_HASH": _EVENTS,
    "BLOBS_GC_INTERVAL_MILLIS": "the blob store's GC period",
    "ALLOW_FAIL_MMAP": "a local-data mmap fallback",
    "WALLET_FILE": "a wallet path for Psyche's docker scripts (set WALLET_PRIVATE_KEY_PATH)",
    "CONFIG_PATH": "a run config for Psyche's docker scripts (use update-config --config-path)",
}  # fmt: skip

# Refused: the run cannot go as Psyche's would with them set.
REFUSED: dict[str, str] = {
    "PSYCHE_MAIN_HOST": "Psyche's container then runs as a multi-node sidecar; the "
                        "run-manager runs main clients only: on a sidecar host run "
                        "`psyche-client sidecar` (docs/parallelism.md)",
}


def ignored_warning(name: str) -> str:
    return f"{name} is read by Psyche ({IGNORED[name]}), not by psyche-py: ignored"
