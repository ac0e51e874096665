"""The event-file format (psyche_common/event_files.py): written by real writers on disk,
read back whole, followed as files grow, rotated by size; a torn last line (a writer
killed mid-record) and damaged lines are reported, never raised."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from psyche_common.event_files import (
    FORMAT_VERSION,
    EventFileWriter,
    EventFollower,
    event_files,
    events_dir_problem,
    parse_file_name,
    read_events,
)


def test_records_round_trip_in_time_order_across_sources(tmp_path: Path) -> None:
    times = iter([10.0, 12.0, 11.0])
    coordinator = EventFileWriter(tmp_path, "coordinator", clock=lambda: next(times))
    client = EventFileWriter(tmp_path, "client-ab12", clock=lambda: next(times))
    coordinator.write("state", {"step": 1})
    coordinator.write("state", {"step": 2})
    client.write("trained", {"step": 1, "loss": 3.5, "batch": (0, 4)})
    coordinator.close()
    client.close()
    result = read_events(tmp_path)
    assert result.bad == []
    assert [(r.time, r.source, r.kind) for r in result.records] == [
        (10.0, "coordinator", "state"), (11.0, "client-ab12", "trained"),
        (12.0, "coordinator", "state")]
    assert result.records[1].payload == {"step": 1, "loss": 3.5, "batch": [0, 4]}
    assert [r.seq for r in result.records if r.source == "coordinator"] == [0, 1]
    line = json.loads((tmp_path / "coordinator.000001.events.jsonl").read_text().splitlines()[0])
    assert line["v"] == FORMAT_VERSION and set(line) == {"v", "time", "source", "seq", "kind",
                                                         "payload"}


def test_rotation_by_size_and_a_new_file_per_start(tmp_path: Path) -> None:
    writer = EventFileWriter(tmp_path, "coordinator", max_bytes=300)
    for step in range(10):
        writer.write("state", {"step": step, "pad": "x" * 60})
    writer.close()
    assert len(writer.files) > 2
    assert all(path.stat().st_size <= 300 for path in writer.files)
    again = EventFileWriter(tmp_path, "coordinator")  # a restarted process: its own file
    again.write("state", {"step": 10})
    again.close()
    assert parse_file_name(again.path) == ("coordinator", len(writer.files) + 1)
    steps = [r.payload["step"] for r in read_events(tmp_path).records]
    assert steps == list(range(11))
    assert event_files(tmp_path)[-1] == again.path


def test_keep_files_removes_the_oldest_of_its_own_source_only(tmp_path: Path) -> None:
    """Psyche's --keep-event-files: at each start and each rotation a writer keeps its
    source's newest N files; other sources' files and any other file stay."""
    other = EventFileWriter(tmp_path, "coordinator")
    other.write("state", {"step": 0})
    other.close()
    (tmp_path / "notes.txt").write_text("not an event file")
    for start in range(3):  # three starts of one client, nothing removed (keep all)
        first = EventFileWriter(tmp_path, "client-aa")
        first.write("opened", {"start": start})
        first.close()
    writer = EventFileWriter(tmp_path, "client-aa", max_bytes=200, keep_files=2)
    assert [p.name for p in writer.removed] == ["client-aa.000001.events.jsonl",
                                                "client-aa.000002.events.jsonl"]
    for step in range(6):  # about 100 bytes each: rotations remove as they open
        writer.write("trained", {"step": step, "pad": "x" * 40})
    writer.close()
    kept = [p for p in event_files(tmp_path) if p.name.startswith("client-aa.")]
    assert kept == writer.files[-2:]
    assert len(writer.removed) == len(writer.files) + 1  # every older file, no more
    assert (tmp_path / "coordinator.000001.events.jsonl").exists()
    assert (tmp_path / "notes.txt").exists()
    steps = [r.payload["step"] for r in read_events(tmp_path).records if r.kind == "trained"]
    assert steps == sorted(steps) and steps[-1] == 5 and 0 not in steps  # the newest kept
    with pytest.raises(ValueError, match="keep_files -1 is below 0"):
        EventFileWriter(tmp_path, "client-aa", keep_files=-1)


def test_torn_last_line_of_a_killed_writer_is_reported_not_raised(tmp_path: Path) -> None:
    # A real writer process killed (SIGKILL) right after a record and half of another.
    script = (
        "import os, sys, signal\n"
        "from pathlib import Path\n"
        "from psyche_common.event_files import EventFileWriter\n"
        "w = EventFileWriter(Path(sys.argv[1]), 'client-1')\n"
        "w.write('trained', {'step': 1, 'loss': 2.0})\n"
        "line = w.write('trained', {'step': 2, 'loss': 1.5}).line()\n"
        "os.write(os.open(w.path, os.O_WRONLY | os.O_APPEND), line[:len(line) // 2])\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n")
    # The second record is written whole, then half of it again: the torn tail.
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=False)
    assert done.returncode == -9
    result = read_events(tmp_path)
    assert [r.payload["step"] for r in result.records] == [1, 2]
    [torn] = result.bad
    assert torn.torn and torn.line == 3
    assert "torn last line" in torn.describe() and "client-1.000001" in torn.describe()


def test_damaged_and_foreign_version_lines_are_reported(tmp_path: Path) -> None:
    path = tmp_path / "coordinator.000001.events.jsonl"
    good = {"v": 1, "time": 1.0, "source": "coordinator", "seq": 0, "kind": "state",
            "payload": {}}
    path.write_text(json.dumps(good) + "\n" + "garbage\n"
                    + json.dumps(good | {"v": 99}) + "\n" + json.dumps(good) + "\n")
    result = read_events(tmp_path)
    assert len(result.records) == 2
    assert [(b.line, b.torn) for b in result.bad] == [(2, False), (3, False)]
    assert "format version 99" in result.bad[1].reason


def test_follower_returns_appended_records_and_holds_a_partial_line(tmp_path: Path) -> None:
    writer = EventFileWriter(tmp_path, "coordinator")
    follower = EventFollower(tmp_path)
    writer.write("state", {"step": 1})
    records, bad = follower.poll()
    assert [r.payload["step"] for r in records] == [1] and bad == []
    assert follower.poll() == ([], [])
    line = writer.write("state", {"step": 2}).line()
    with writer.path.open("ab") as handle:  # a record being written: half of it so far
        handle.write(line[:10])
    records, bad = follower.poll()
    assert [r.payload["step"] for r in records] == [2] and bad == []  # the half is held
    with writer.path.open("ab") as handle:
        handle.write(line[10:])
    records, bad = follower.poll()
    assert [r.payload["step"] for r in records] == [2] and bad == []  # now whole
    writer.close()


def test_events_dir_problems(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("")
    assert events_dir_problem(a_file) == f"{a_file} is not a directory"
    assert events_dir_problem(tmp_path / "new" / "dir") is None
    assert (tmp_path / "new" / "dir").is_dir()
    if os.geteuid() == 0:
        pytest.skip("root writes anywhere")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    assert events_dir_problem(locked) == f"{locked} is not writable"


def test_follower_reports_a_torn_line_once_its_writer_restarted(tmp_path: Path) -> None:
    first = EventFileWriter(tmp_path, "client-1")
    line = first.write("trained", {"step": 1}).line()
    with first.path.open("ab") as handle:  # killed while writing its second record
        handle.write(line[:7])
    first.close()
    follower = EventFollower(tmp_path)
    records, bad = follower.poll()
    assert len(records) == 1 and bad == []  # it may yet finish the line
    restarted = EventFileWriter(tmp_path, "client-1")  # the process came back: a new file
    restarted.write("trained", {"step": 2})
    records, bad = follower.poll()
    assert [r.payload["step"] for r in records] == [2]
    assert [(b.path, b.line, b.torn) for b in bad] == [(first.path, 2, True)]
    assert follower.poll() == ([], [])  # said once
    restarted.close()
