"""The eval tasks by Psyche's names, and where each one's documents come from.

    TASKS / TASK_NAMES         arc_challenge, arc_easy, boolq, ceval_valid, hellaswag, mmlu,
                               mmlu_cf, mmlu_pro, openbookqa, piqa
    TaskSpec, FewShot          what a task is: its family's row reader, data set, config,
                               split, metric, and for a few-shot task where its examples
                               come from
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
The source is named in each result event. A few-shot task (mmlu_pro) reads its examples'
split the same way (`data_dir/<task>.<split>.jsonl|.parquet`, the snapshot's split files,
samples/<task>.<split>.jsonl); each document gets the first examples of its own group, in
lm-eval's form: "{example context} {right choice}" each, then the document's context, all
joined by blank lines.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from client_image.evals import arc, boolq, ceval, hellaswag, mmlu, mmlu_pro, openbookqa, piqa
from client_image.evals.documents import BadDocument
from client_image.evals.scoring import EvalDoc

SAMPLES = Path(__file__).resolve().parent / "samples"
BUNDLED = "bundled sample"


@dataclass(frozen=True)
class FewShot:
    """Examples before each document: the first `count` rows of `split` in its group."""
    split: str
    count: int
    group: Callable[[Mapping[str, Any]], str]  # MMLU-Pro's category


@dataclass(frozen=True)
class TaskSpec:
    name: str
    doc: Callable[[Mapping[str, Any]], EvalDoc]
    dataset: str  # the Hugging Face data set
    config: str | None  # its configuration: the snapshot's subdirectory (None: all of them)
    split: str
    acc_norm: bool  # Psyche reports acc_norm for this task (its TASKS_WITH_ACC_NORM)
    fewshot: FewShot | None = None
    # C-Eval's rows do not name their subject: a snapshot row gets its config's name here
    config_field: str | None = None


TASKS: dict[str, TaskSpec] = {spec.name: spec for spec in (
    TaskSpec("arc_challenge", arc.doc, arc.DATASET, "ARC-Challenge", arc.SPLIT, True),
    TaskSpec("arc_easy", arc.doc, arc.DATASET, "ARC-Easy", arc.SPLIT, True),
    TaskSpec("boolq", boolq.doc, boolq.DATASET, boolq.CONFIG, boolq.SPLIT, False),
    TaskSpec("ceval_valid", ceval.doc, ceval.DATASET, None, ceval.SPLIT, False,
             config_field=ceval.SUBJECT_FIELD),
    TaskSpec("hellaswag", hellaswag.doc, hellaswag.DATASET, None, hellaswag.SPLIT, True),
    TaskSpec("mmlu", mmlu.doc, mmlu.DATASET, mmlu.CONFIG, mmlu.SPLIT, False),
    TaskSpec("mmlu_cf", mmlu.cloze_doc, mmlu.DATASET, mmlu.CONFIG, mmlu.SPLIT, True),
    TaskSpec("mmlu_pro", mmlu_pro.doc, mmlu_pro.DATASET, None, mmlu_pro.SPLIT, False,
             fewshot=FewShot(mmlu_pro.FEWSHOT_SPLIT, mmlu_pro.SHOTS, mmlu_pro.category)),
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
    rows, source = _rows(spec, spec.split, data_dir)
    examples = _examples(spec, spec.fewshot, data_dir) if spec.fewshot else {}
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
            doc = spec.doc(row)
            if spec.fewshot:
                doc = _with_examples(doc, _group_examples(examples, spec.fewshot, row))
            docs.append(doc)
        except BadDocument as exc:
            raise EvalDataError(f"{name}: {source} row {index + 1}: {exc}") from None
    return LoadedTask(spec, tuple(docs), source)


def _examples(spec: TaskSpec, fewshot: FewShot, data_dir: Path | None
              ) -> dict[str, list[EvalDoc]]:
    """Each group's first `fewshot.count` examples, in the split's order (lm-eval's first_n)."""
    rows, source = _rows(spec, fewshot.split, data_dir)
    groups: dict[str, list[EvalDoc]] = {}
    for index, row in enumerate(rows):
        try:
            if not isinstance(row, Mapping):
                raise BadDocument(f"a row must be a JSON object, got {type(row).__name__}")
            group = groups.setdefault(fewshot.group(row), [])
            if len(group) < fewshot.count:
                group.append(spec.doc(row))
        except BadDocument as exc:
            raise EvalDataError(f"{spec.name}: {source} ({fewshot.split}) row {index + 1}: "
                                f"{exc}") from None
    return groups


def _group_examples(examples: Mapping[str, list[EvalDoc]], fewshot: FewShot,
                    row: Mapping[str, Any]) -> list[EvalDoc]:
    group = fewshot.group(row)
    if group not in examples:
        # Fewer shots than the task's would score a different task: refuse the row.
        raise BadDocument(f"no {fewshot.split} examples of its group {group!r}")
    return examples[group]


def _with_examples(doc: EvalDoc, examples: Sequence[EvalDoc]) -> EvalDoc:
    shots = [e.context + e.continuation(e.gold) for e in examples]
    return dataclasses.replace(doc, context="\n\n".join([*shots, doc.context]))


def _rows(spec: TaskSpec, split: str, data_dir: Path | None) -> tuple[list[Any], str]:
    # The task's own split is <task>.jsonl; another (few-shot examples) <task>.<split>.jsonl.
    stem = spec.name if split == spec.split else f"{spec.name}.{split}"
    if data_dir is not None:
        for suffix in (".jsonl", ".parquet"):
            path = data_dir / f"{stem}{suffix}"
            if path.is_file():
                return _read(path), str(path)
    files = _snapshot_files(spec, split)
    if files:
        rows = []
        for path in files:
            for row in _read(path):
                if spec.config_field and isinstance(row, dict):
                    row.setdefault(spec.config_field, path.parent.name)
                rows.append(row)
        return rows, f"hub snapshot {spec.dataset}"
    return _read(SAMPLES / f"{stem}.jsonl"), BUNDLED


def _snapshot_files(spec: TaskSpec, split: str) -> list[Path]:
    """The split's files in the data set's cached snapshot; none when it is not cached."""
    from huggingface_hub import snapshot_download

    try:
        root = Path(snapshot_download(spec.dataset, repo_type="dataset", local_files_only=True))
    except Exception:  # not in the cache (huggingface_hub raises several kinds): no snapshot
        return []
    found = []
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if (path.suffix in (".parquet", ".jsonl") and path.name.startswith(split)
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
