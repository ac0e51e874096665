"""The testnet's result (the headless JSON line, `Testnet.summary`) in words, printed when
the TUI exits: what an operator would otherwise read out of the JSON."""

from __future__ import annotations

from typing import Any

from psyche_common.ui.view import MODEL_LOST


def describe_summary(summary: dict[str, Any]) -> list[str]:
    """A few lines: how the run ended, its loss, the clients' agreement, kills and rejoins."""
    state = summary.get("run_state") or "never seen"
    ended = ("finished" if summary.get("finished")
             else f"stopped before the end (phase {state})")
    lines = [f"run {ended} at step {summary.get('final_step', 0)}, epoch "
             f"{summary.get('epochs', 0)}, after {_duration(summary.get('wall_s', 0.0))}"]
    first, last, steps = summary.get("first_loss"), summary.get("last_loss"), summary.get("steps", 0)
    if first is None or last is None:
        lines.append("loss: no step was trained")
    else:
        lines.append(f"loss {first:.3f} -> {last:.3f} over {steps} trained "
                     f"step{'' if steps == 1 else 's'} (mean of the clients)")
    compared = summary.get("checkpoints_compared", 0)
    if compared:
        agree = "identical" if summary.get("clients_identical") else "DIFFERENT"
        lines.append(f"checkpoints of {compared} clients compared: {agree}")
    else:
        lines.append("checkpoints: none to compare yet")
    lines.append(f"clients killed {summary.get('killed', 0)}, rejoined "
                 f"{summary.get('rejoined', 0)}")
    resets, with_holder = summary.get("models_reset", 0), summary.get("models_reset_with_holder", 0)
    if resets:
        lines.append(f"MODEL RESET {resets} time{'' if resets == 1 else 's'}: an epoch went back "
                     f"to the stored checkpoint, its training since lost"
                     + (f" ({with_holder} while a client holding the model was alive)"
                        if with_holder else " (no client holding the model was left)"))
    if summary.get("coordinator_model_lost"):
        lines.append(MODEL_LOST)
    if summary.get("error"):
        lines.append(f"error: {summary['error']}")
    return lines


def _duration(seconds: float) -> str:
    whole = int(seconds)
    minutes, secs = divmod(whole, 60)
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"
