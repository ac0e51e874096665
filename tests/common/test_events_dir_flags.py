"""`--events-dir` on `psyche-coordinator run` and `psyche-client train`: a path that cannot
hold event files is one line and exit 2, before anything starts; `--keep-event-files` /
KEEP_EVENT_FILES bounds a client's files (a negative count is one line and exit 2)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tcp_helpers import TESTNET

from client_image.runtime.event_recording import client_source
from local_testnet.testnet import client_key, client_secret_hex
from psyche_common.event_files import EventFileWriter, read_events

BIN = Path(sys.executable).parent


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=120, check=False)


def test_coordinator_refuses_a_file_as_events_dir(tmp_path: Path) -> None:
    a_file = tmp_path / "events"
    a_file.write_text("")
    done = run(str(BIN / "psyche-coordinator"), "run", "--state", str(TESTNET / "state.toml"),
               "--server-port", "0", "--events-dir", str(a_file))
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"error: --events-dir {a_file} is not a directory"


def test_client_refuses_a_file_as_events_dir(tmp_path: Path) -> None:
    a_file = tmp_path / "events"
    a_file.write_text("")
    done = run(str(BIN / "psyche-client"), "train", "--run-id", "r", "--server-addr",
               "127.0.0.1:1", "--device", "cpu", "--events-dir", str(a_file))
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"error: --events-dir {a_file} is not a directory"


def test_client_refuses_a_negative_keep_event_files(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(BIN / "psyche-client"), "train", "--run-id", "r", "--server-addr", "127.0.0.1:1",
         "--device", "cpu", "--events-dir", str(tmp_path)], capture_output=True, text=True,
        timeout=120, check=False, env={**os.environ, "KEEP_EVENT_FILES": "-1"})
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "'--keep-event-files'" in errors[0], done.stderr
    assert "greater than or equal to 0" in errors[0], done.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_real_client_keeps_its_newest_event_files(tmp_path: Path) -> None:
    """KEEP_EVENT_FILES=3 on a real client process whose directory holds 4 files of its
    own from earlier starts and one of another source: on start it writes its own new
    file and keeps only its 2 newest older ones."""
    events = tmp_path / "events"
    source = client_source(client_key(7).hex())
    for start in range(4):
        earlier = EventFileWriter(events, source)
        earlier.write("opened", {"start": start})
        earlier.close()
    other = EventFileWriter(events, "coordinator")
    other.write("opened", {})
    other.close()
    new_file = events / f"{source}.000005.events.jsonl"
    with (tmp_path / "client.log").open("wb") as log:
        client = subprocess.Popen(
            [str(BIN / "psyche-client"), "train", "--run-id", "r", "--server-addr",
             "127.0.0.1:1", "--device", "cpu", "--logs", "none", "--events-dir", str(events)],
            stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, "KEEP_EVENT_FILES": "3",
                 "RAW_IDENTITY_SECRET_KEY": client_secret_hex(7)})
    try:
        deadline = time.monotonic() + 50
        while not (new_file.exists() and new_file.read_bytes().endswith(b"\n")):
            assert client.poll() is None, (tmp_path / "client.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "client.log").read_text()
            time.sleep(0.2)
    finally:
        client.kill()
        client.wait(10)
    assert sorted(path.name for path in events.iterdir()) == [
        f"{source}.{n:06d}.events.jsonl" for n in (3, 4, 5)] + ["coordinator.000001.events.jsonl"]
    opened = [r.payload for r in read_events(events).records if r.kind == "opened"]
    assert [payload.get("start") for payload in opened if "start" in payload] == [2, 3]
    assert any(payload.get("program") == "psyche-client" for payload in opened)
