"""Event files: every event a process emits, appended to files in one directory, for replay.

Psyche's processes write their events to disk (`--events-dir`) so that a run can be looked
at again after the fact (event sourcing: the files are the run's history, the screens are
built from them). Here one format serves the coordinator and the clients
(docs/events.md):

    <dir>/<source>.<n:06d>.events.jsonl      e.g. coordinator.000001.events.jsonl
                                                  client-3f2a…e1.000002.events.jsonl

one JSON object per line, each record written with ONE `write` of the whole line and its
newline on an O_APPEND descriptor:

    {"v": 1, "time": 1764300000.123, "source": "coordinator", "seq": 17,
     "kind": "state", "payload": {...}}

`v` is the format version (a reader skips, and reports, records of a version it does not
know), `time` unix seconds, `seq` the record's number in this process's files. Each
process start opens a new file (the next `n` of its source), and a file past `max_bytes`
is closed and the next one opened: a file is never appended to by two processes, and a
killed writer leaves at most one torn line, the last of its file. Readers report that
line (`BadLine`, torn=True) instead of failing on it. With `keep_files=N` (Psyche's
`--keep-event-files`) a writer keeps its source's newest N files, removing the oldest
whenever it opens one; 0 keeps them all.

    writer = EventFileWriter(Path("events"), "coordinator")
    writer.write("joined", {"identity": "ab12…"})
    result = read_events(Path("events"))      # every record, by time; result.bad
    follower = EventFollower(Path("events"))  # records as the files grow
    new, bad = follower.poll()
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMAT_VERSION = 1
SUFFIX = ".events.jsonl"
DEFAULT_MAX_BYTES = 16 * 1024 * 1024  # a file's size before the next one is opened
KEEP_ALL_FILES = 0  # keep_files: no retention
_NAME = re.compile(r"^(?P<source>[A-Za-z0-9_-]+)\.(?P<n>\d{6,})" + re.escape(SUFFIX) + "$")


@dataclass(frozen=True)
class EventRecord:
    time: float
    source: str
    kind: str
    payload: dict[str, Any]
    seq: int = 0
    version: int = FORMAT_VERSION

    def line(self) -> bytes:
        """The record as written: one JSON object and a newline."""
        data = {"v": self.version, "time": round(self.time, 6), "source": self.source,
                "seq": self.seq, "kind": self.kind, "payload": self.payload}
        return (json.dumps(data, default=str, separators=(",", ":")) + "\n").encode()


@dataclass(frozen=True)
class BadLine:
    """A line that is not a record: the torn last line of a killed writer, or damage."""

    path: Path
    line: int  # 1-based
    torn: bool
    reason: str

    def describe(self) -> str:
        what = "torn last line" if self.torn else "bad line"
        return f"{self.path.name} line {self.line}: {what} ({self.reason})"


@dataclass
class ReadResult:
    records: list[EventRecord] = field(default_factory=list)
    bad: list[BadLine] = field(default_factory=list)


def events_dir_problem(directory: Path) -> str | None:
    """Why `directory` cannot take event files (None: it can; it is created if missing)."""
    if directory.exists() and not directory.is_dir():
        return f"{directory} is not a directory"
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"{directory} cannot be created ({exc.strerror or exc})"
    if not os.access(directory, os.W_OK | os.X_OK):
        return f"{directory} is not writable"
    return None


def source_name(text: str) -> str:
    """`text` as a file-name-safe source (letters, digits, - and _)."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", text) or "unnamed"


def parse_file_name(path: Path) -> tuple[str, int] | None:
    """(source, n) of an event file's name; None for any other file."""
    match = _NAME.match(path.name)
    return None if match is None else (match["source"], int(match["n"]))


def event_files(directory: Path) -> list[Path]:
    """The directory's event files, by source then number."""
    named = [(parsed, path) for path in directory.iterdir()
             if path.is_file() and (parsed := parse_file_name(path)) is not None]
    return [path for _, path in sorted(named)]


def parse_record(text: str) -> EventRecord:
    """The record a line holds; ValueError saying what is wrong with it."""
    try:
        data = json.loads(text)
    except ValueError:
        raise ValueError("not JSON") from None
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    version = data.get("v")
    if version != FORMAT_VERSION:
        raise ValueError(f"format version {version!r}, this reader knows {FORMAT_VERSION}")
    time_, source, kind, payload = (data.get(k) for k in ("time", "source", "kind", "payload"))
    if (not isinstance(time_, int | float) or not isinstance(source, str)
            or not isinstance(kind, str) or not isinstance(payload, dict)):
        raise ValueError("a record needs time, source, kind and payload")
    seq = data.get("seq", 0)
    return EventRecord(float(time_), source, kind, payload, seq if isinstance(seq, int) else 0)


class EventFileWriter:
    """Appends one process's records under `directory`, a new file per start and per
    `max_bytes`. Each record is one write of a whole line: a kill tears at most the last.
    `keep_files` > 0 bounds the source's files on disk: the oldest go first."""

    def __init__(self, directory: Path, source: str, *, max_bytes: int = DEFAULT_MAX_BYTES,
                 keep_files: int = KEEP_ALL_FILES,
                 clock: Callable[[], float] = time.time) -> None:
        if keep_files < 0:
            raise ValueError(f"keep_files {keep_files} is below 0 (0 keeps every file)")
        self.directory = directory
        self.source = source_name(source)
        self.max_bytes = max_bytes
        self.keep_files = keep_files
        self.removed: list[Path] = []
        self.clock = clock
        self.seq = 0
        self.files: list[Path] = []
        self._fd: int | None = None
        self._size = 0
        directory.mkdir(parents=True, exist_ok=True)
        self._open_next()

    @property
    def path(self) -> Path:
        return self.files[-1]

    def _numbered_files(self) -> list[tuple[int, Path]]:
        """This source's files in the directory, by number."""
        return sorted((parsed[1], path) for path in self.directory.iterdir()
                      if (parsed := parse_file_name(path)) is not None
                      and parsed[0] == self.source)

    def _open_next(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        n = max((number for number, _ in self._numbered_files()), default=0) + 1
        while True:  # O_EXCL: two processes of one source never share a file
            path = self.directory / f"{self.source}.{n:06d}{SUFFIX}"
            try:
                self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND,
                                   0o644)
                break
            except FileExistsError:
                n += 1
        self.files.append(path)
        self._size = 0
        if self.keep_files:
            self._remove_oldest()

    def _remove_oldest(self) -> None:
        """Down to `keep_files` files of this source, the one just opened among them."""
        numbered = self._numbered_files()
        for _, old in numbered[:max(0, len(numbered) - self.keep_files)]:
            try:
                old.unlink()
            except FileNotFoundError:  # another process of this source removed it first
                continue
            self.removed.append(old)

    def write(self, kind: str, payload: dict[str, Any]) -> EventRecord:
        record = EventRecord(self.clock(), self.source, kind, payload, self.seq)
        data = record.line()
        if self._fd is None:
            raise ValueError("event file writer is closed")
        if self._size and self._size + len(data) > self.max_bytes:
            self._open_next()
        assert self._fd is not None
        os.write(self._fd, data)
        self._size += len(data)
        self.seq += 1
        return record

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@dataclass
class _Tail:
    offset: int = 0
    lines: int = 0
    partial: bytes = b""
    torn_reported: bool = False


class EventFollower:
    """The records of a directory's event files as they grow: each `poll` returns what was
    appended since the last one (complete lines only), by time."""

    def __init__(self, directory: Path, *, read_bytes: int = 4 * 1024 * 1024) -> None:
        self.directory = directory
        self.read_bytes = read_bytes
        self._tails: dict[Path, _Tail] = {}

    def poll(self, *, final: bool = False) -> tuple[list[EventRecord], list[BadLine]]:
        """New records and bad lines. A last line without its newline is held back while
        its writer may still finish it; it is reported torn once a later file of its
        source exists (the writer moved on), or with `final` (the run is over)."""
        records: list[EventRecord] = []
        bad: list[BadLine] = []
        try:
            files = event_files(self.directory)
        except OSError:
            return records, bad
        newest: dict[str, int] = {}
        for path in files:
            source, n = parse_file_name(path) or ("", 0)
            newest[source] = max(newest.get(source, 0), n)
        for path in files:
            source, n = parse_file_name(path) or ("", 0)
            tail = self._tails.setdefault(path, _Tail())
            self._read(path, tail, records, bad)
            if tail.partial and not tail.torn_reported and (final or n < newest[source]):
                self._end_partial(path, tail, records, bad)
        records.sort(key=lambda r: r.time)
        return records, bad

    def _read(self, path: Path, tail: _Tail, records: list[EventRecord],
              bad: list[BadLine]) -> None:
        while True:
            try:
                with path.open("rb") as handle:
                    handle.seek(tail.offset)
                    data = handle.read(self.read_bytes)
            except OSError:
                return
            if not data:
                return
            tail.offset += len(data)
            if tail.torn_reported:  # the writer came back after all: a new line begins
                tail.partial, tail.torn_reported = b"", False
            *lines, tail.partial = (tail.partial + data).split(b"\n")
            for raw in lines:
                tail.lines += 1
                if not raw.strip():
                    continue
                try:
                    records.append(parse_record(raw.decode(errors="replace")))
                except ValueError as exc:
                    bad.append(BadLine(path, tail.lines, False, str(exc)))

    def _end_partial(self, path: Path, tail: _Tail, records: list[EventRecord],
                     bad: list[BadLine]) -> None:
        """A last line with no newline: a whole record (cut just before it) is kept;
        anything else is the torn line of a killed writer."""
        tail.torn_reported = True
        try:
            records.append(parse_record(tail.partial.decode(errors="replace")))
        except ValueError:
            bad.append(BadLine(path, tail.lines + 1, True,
                               f"{len(tail.partial)} bytes without a newline: the writer "
                               "stopped mid-record"))


def read_events(directory: Path) -> ReadResult:
    """Every record of the directory's event files, by time, and the lines that are not."""
    records, bad = EventFollower(directory).poll(final=True)
    return ReadResult(records, bad)
