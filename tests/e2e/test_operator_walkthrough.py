"""The operator's guide's walkthrough (docs/operators.md), run as written: its bash blocks,
in order, in one real bash (real coordinator, client, localnet and run-manager processes on
loopback), with only the ports changed. Each command's "# →" lines must appear in that
command's own output, the claimed reward must show in the trainer's balance, and the
walkthrough's own `kill`s must leave no process behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from loopback import free_port

from psyche_common.local_ports import port_is_free

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
GUIDE = REPO_ROOT / "docs" / "operators.md"
SECTION = "## Operator walkthrough"
EXPECT = "# → "
STEP_MARK = "@@walkthrough-step "
# The guide's ports, replaced by free ones: a second run on this host must not collide.
TCP_PORT, RPC_PORT = "20000", "8899"  # the localnet's WebSocket is RPC_PORT + 1


@dataclass
class Step:
    command: str
    expected: list[str] = field(default_factory=list)


def walkthrough_steps(guide: str) -> list[Step]:
    """The commands of the section's bash blocks (backslash continuations joined), each
    with the "# →" lines that follow it."""
    start = guide.index(SECTION)
    end = guide.find("\n## ", start + len(SECTION))
    section = guide[start:end if end != -1 else None]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    steps: list[Step] = []
    for block in blocks:
        lines = iter(block.splitlines())
        for line in lines:
            if line.startswith(EXPECT):
                assert steps, f"an expectation before any command: {line!r}"
                steps[-1].expected.append(line.removeprefix(EXPECT).strip())
                continue
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            command = line
            while command.endswith("\\"):
                command = command[:-1] + next(lines).strip()
            steps.append(Step(command))
    return steps


def two_free_ports() -> int:
    """A port p with p + 1 free too (the localnet's default WebSocket port), or fail."""
    for _ in range(50):
        port = free_port()
        if port < 65535 and port_is_free(port + 1):
            return port
    pytest.fail("no two consecutive free ports on loopback")


def script_of(steps: list[Step], tcp_port: int, rpc_port: int) -> str:
    lines = ["set -euo pipefail"]
    for number, step in enumerate(steps):
        command = step.command.replace(TCP_PORT, str(tcp_port)).replace(RPC_PORT, str(rpc_port))
        lines += [f"echo '{STEP_MARK}{number}'", command]
    return "\n".join(lines) + "\n"


def outputs_by_step(output: str) -> dict[int, str]:
    parts = re.split(rf"^{STEP_MARK}(\d+)$", output, flags=re.M)
    return {int(parts[i]): parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def group_gone(pgid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def test_the_walkthrough_has_every_step_the_issue_asks_for() -> None:
    commands = " ".join(s.command for s in walkthrough_steps(GUIDE.read_text()))
    for needed in ("psyche-coordinator run", "psyche-client train --run-id", "psyche-localnet",
                   "wallet new", "wallet airdrop", "token create-mint", "create-run",
                   "--treasurer-collateral-mint", "update-config", "set-paused", "--resume",
                   "join-authorization-create", "psyche-client train --rpc",
                   "treasurer-top-up-rewards", "treasurer-claim-rewards", "wallet balance"):
        assert needed in commands, needed


@pytest.mark.timeout(240)
def test_the_operator_walkthrough_runs_as_written(tmp_path: Path) -> None:
    steps = walkthrough_steps(GUIDE.read_text())
    tcp_port, rpc_port = free_port(), two_free_ports()
    script = script_of(steps, tcp_port, rpc_port)
    env = {**os.environ, "TMPDIR": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    env.pop("RPC", None)
    process = subprocess.Popen(["bash", "-c", script], cwd=REPO_ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    try:
        output, _ = process.communicate(timeout=200)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"the walkthrough did not end within 200 s:\n{output[-4000:]}")
    finally:
        left_behind = not group_gone(process.pid, 15)
        if left_behind:
            os.killpg(process.pid, signal.SIGKILL)

    by_step = outputs_by_step(output)
    last = max(by_step, default=-1)
    assert process.returncode == 0, (
        f"step {last} failed (exit {process.returncode}): {steps[last].command}\n"
        f"{by_step.get(last, output)[-3000:]}")
    assert last == len(steps) - 1
    for number, step in enumerate(steps):
        for expected in step.expected:
            assert expected in by_step[number], (
                f"step {number} ({step.command}) did not print {expected!r}:\n"
                f"{by_step[number][-2000:]}")
    shown = by_step[max(n for n, s in enumerate(steps) if "wallet balance" in s.command)]
    balance = re.search(r"reward token \S+: \S+ \((\d+) base units\)", shown)
    assert balance is not None and int(balance.group(1)) > 0, shown
    assert not left_behind, "the walkthrough's kills left a process running"
