"""Whether the coordinator still runs the run, as lines for the top of the Run panel: a
coordinator that died or hangs used to be invisible there (the panel kept its last state,
`RoundTrain 01:00 / 00:10 · clients 1/1 healthy`, the phase timer running on past its
limit). No Textual here, as in run_manager.view.

    describe_coordinator_health(run, heard, error, now=time.monotonic())
    -> ["COORDINATOR SILENT 45 s: connection lost (...); the run below is its last state",
        "PHASE OVERDUE: RoundTrain 01:00 of 00:10; the coordinator has not moved the run on"]
"""

from __future__ import annotations

import re

from psyche_common.run_view import RunSnapshot
from psyche_common.ui.view import format_duration
from run_manager.sources.coordinator import Heard

# A TCP coordinator sends a heartbeat every 5 s: two missed is silence, said within 10 s
# with the monitor's 1 s polls.
SILENT_AFTER_S = 8.0
# A lost connection is said sooner, past a reconnect's usual blip (0.25 s backoff).
SILENT_DISCONNECTED_AFTER_S = 2.0
# Past a phase's limit the coordinator moves the run on at its next tick (TCP: every
# second; Solana: the first client's tick transaction).
OVERDUE_SLACK_S = 5.0
# The phases that always end by their limit; WaitingForMembers waits for clients as long
# as it takes, Paused and Finished have none.
TIMED_PHASES = ("Warmup", "RoundTrain", "RoundWitness", "Cooldown")


def silent_for(heard: Heard | None, now: float) -> float | None:
    """Seconds the coordinator has been silent, when that is silence (None otherwise)."""
    if heard is None:
        return None
    quiet = max(0.0, now - heard.at_monotonic)
    threshold = SILENT_AFTER_S if heard.connected else SILENT_DISCONNECTED_AFTER_S
    return quiet if quiet >= threshold else None


def describe_coordinator_health(run: RunSnapshot | None, heard: Heard | None,
                                error: str, now: float) -> list[str]:
    """The alarms, none when the coordinator is heard from and keeps to its phases."""
    lines = []
    if error:
        lines.append(f"COORDINATOR UNREACHABLE: {error}")
    quiet = silent_for(heard, now)
    if quiet is not None and heard is not None:
        why = (f"connection lost ({heard.problem})" if not heard.connected and heard.problem
               else "connection lost" if not heard.connected else "no state or heartbeat")
        lines.append(f"COORDINATOR SILENT {quiet:.0f} s: {why}; the run below is its last state")
    if (run is not None and run.phase in TIMED_PHASES and run.phase_timeout_s is not None
            and run.phase_elapsed_s > run.phase_timeout_s + OVERDUE_SLACK_S):
        lines.append(f"PHASE OVERDUE: {run.phase} {format_duration(run.phase_elapsed_s)} of "
                     f"{format_duration(run.phase_timeout_s)}; the coordinator has not moved "
                     "the run on")
    return lines


def alarm_key(lines: list[str]) -> list[str]:
    """The alarms without their running counts (seconds silent, the phase's timer), so
    that `--no-tui` prints an alarm once when it starts or its reason changes, not on
    every poll as its seconds go up."""
    return [re.sub(r"\d", "", line) for line in lines]
