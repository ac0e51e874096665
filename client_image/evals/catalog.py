"""The eval tasks by Psyche's names, and where each one's documents come from.

    TASKS / TASK_NAMES         arc_challenge, arc_easy, boolq, hellaswag, mmlu, openbookqa, piqa
    parse_task_names(value)    "arc_easy,piqa" -> ("arc_easy", "piqa"); ValueError naming the
                               unknown one and listing the known ones
    load_task(name, ...)       a LoadedTask: the documents sampled with `seed` (shuffled, then
                               the first `max_docs`), and which source they came from

A task's documents come from the first of these that has them:
  1. `data_dir/<task>.jsonl` or `data_dir/<task>.parquet` (`--eval-data-dir`): rows in the
     data set's own Hugging Face format;
  2. the data set's snapshot in the Hugging Face cache (read offline: never downloaded here;
     `huggingface-cli download --repo-type dataset <repo>` puts it there), its split's
     parquet or JSON-lines files;
  3. the small sample bundled with the client (client_image/evals/samples/<task>.jsonl: a
     handful of documents written in the real format, so that the machinery runs anywhere;
     their scores say little about a model).
The source is named in each result event.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from client_image.evals import arc, boolq, hellaswag, mmlu, openbookqa, piqa
from client_image.evals.documents import BadDocument
from client_image.evals.scoring import EvalDoc

SAMPLES = Path(__file__).resolve().parent / "samples"
BUNDLED = "bundled sample"


@dataclass(frozen=True)
class TaskSpec:
    name: str
    doc: Callable[[Mapping[str, Any]], EvalDoc]
    dataset: str  # the Hugging Face data set
    config: str | None  # its configuration: the snapshot's subdirectory
    split: str
    acc_norm: bool  # Psyche reports acc_norm for this task (its TASKS_WITH_ACC_NORM)


TASKS: dict[str, TaskSpec] = {spec.name: spec for spec in (
    TaskSpec("arc_challenge", arc.doc, arc.DATASET, "ARC-Challenge", arc.SPLIT, True),
    TaskSpec("arc_easy", arc.doc, arc.DATASET, "ARC-Easy", arc.SPLIT, True),
    TaskSpec("boolq", boolq.doc, boolq.DATASET, boolq.CONFIG, boolq.SPLIT, False),
    TaskSpec("hellaswag", hellaswag.doc, hellaswag.DATASET, None, hellaswag.SPLIT, True),
    TaskSpec("mmlu", mmlu.doc, mmlu.DATASET, mmlu.CONFIG, mmlu.SPLIT, False),
    TaskSpec("openbookqa", openbookqa.doc, openbookqa.DATASET, openbookqa.CONFIG,
             openbookqa.SPLIT, True),
    TaskSpec("piqa", piqa.doc, piqa.DATASET, None, piqa.SPLIT, True),
)}
TASK_NAMES = tuple(TASKS)


class EvalDataError(ValueError):
    """A task's documents cannot be read (one line, naming the file and the row)."""


def parse_task_names(value: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(n.strip() for n in value.split(",") if n.strip()))
    for name in names:
        if name not in TASKS:
            raise ValueError(f"unknown eval task {name!r}: use {', '.join(TASK_NAMES)}")
    return names


@dataclass(frozen=True)
class LoadedTask:
    spec: TaskSpec
    docs: tuple[EvalDoc, ...]
    source: str  # a file, "hub snapshot <repo>" or BUNDLED


def load_task(name: str, *, data_dir: Path | None = None, seed: int = 42,
              max_docs: int | None = None) -> LoadedTask:
    spec = TASKS[name]
    rows, source = _rows(spec, data_dir)
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)  # the same documents on every client of one seed
    if max_docs is not None:
        order = order[:max_docs]
    docs = []
    for index in order:
        row = rows[index]
        try:
            if not isinstance(row, Mapping):
                raise BadDocument(f"a row must be a JSON object, got {type(row).__name__}")
            docs.append(spec.doc(row))
        except BadDocument as exc:
            raise EvalDataError(f"{name}: {source} row {index + 1}: {exc}") from None
    return LoadedTask(spec, tuple(docs), source)


def _rows(spec: TaskSpec, data_dir: Path | None) -> tuple[list[Any], str]:
    if data_dir is not None:
        for suffix in (".jsonl", ".parquet"):
            path = data_dir / f"{spec.name}{suffix}"
            if path.is_file():
                return _read(path), str(path)
    files = _snapshot_files(spec)
    if files:
        return [row for path in files for row in _read(path)], f"hub snapshot {spec.dataset}"
    return _read(SAMPLES / f"{spec.name}.jsonl"), BUNDLED


def _snapshot_files(spec: TaskSpec) -> list[Path]:
    """The split's files in the data set's cached snapshot; none when it is not cached."""
    from huggingface_hub import snapshot_download

    try:
        root = Path(snapshot_download(spec.dataset, repo_type="dataset", local_files_only=True))
    except Exception:  # not in the cache (huggingface_hub raises several kinds): no snapshot
        return []
    found = []
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if (path.suffix in (".parquet", ".jsonl") and path.name.startswith(spec.split)
                and (spec.config is None or spec.config in relative.parts[:-1])):
            found.append(path)
    return found


def _read(path: Path) -> list[Any]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return list(pq.read_table(path).to_pylist())
        except Exception as exc:  # pyarrow's errors for a file that is not parquet
            raise EvalDataError(f"{path}: not a readable parquet file: {exc}") from None
    rows = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise EvalDataError(f"{path}: cannot be read: {exc}") from None
    for number, line in enumerate(lines, 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise EvalDataError(f"{path} line {number}: not JSON: {exc.msg}") from None
    return rows
