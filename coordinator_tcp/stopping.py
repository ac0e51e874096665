"""Stopping cleanly on SIGINT, SIGTERM and SIGHUP: moved to the shared layer
(`psyche_common.stopping`, which the client and the run-manager use too); these names stay
importable from here."""

from __future__ import annotations

from psyche_common.stopping import (
    APP_EXIT_TIMEOUT_S,
    STOP_SIGNALS,
    StopSignals,
    exit_after,
    exit_now,
    exit_on_signals,
    hangup_safe_driver,
    run_app_until_stopped,
    say,
    silence_hung_up_terminal,
)

__all__ = ["APP_EXIT_TIMEOUT_S", "STOP_SIGNALS", "StopSignals", "exit_after", "exit_now",
           "exit_on_signals", "hangup_safe_driver", "run_app_until_stopped", "say",
           "silence_hung_up_terminal"]
