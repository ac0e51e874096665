"""The task families read their data sets' own formats; documents come from --eval-data-dir,
a Hugging Face cache snapshot or the bundled samples, sampled with the seed."""

from __future__ import annotations

import json
from pathlib import Path

import huggingface_hub.constants
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from client_image.evals import arc, boolq, hellaswag, mmlu, openbookqa, piqa
from client_image.evals.catalog import (
    BUNDLED,
    TASK_NAMES,
    TASKS,
    EvalDataError,
    load_task,
    parse_task_names,
)

ARC_ROW = {"id": "x", "question": "Which organ pumps blood?",
           "choices": {"text": ["lungs", "heart"], "label": ["A", "B"]}, "answerKey": "B"}


@pytest.mark.parametrize("name", TASK_NAMES)
def test_every_bundled_sample_parses(name: str) -> None:
    task = load_task(name)
    assert task.source == BUNDLED and len(task.docs) >= 4
    for doc in task.docs:
        assert len(doc.choices) >= 2 and 0 <= doc.gold < len(doc.choices)
        assert doc.context and all(doc.choices)
    # Psyche reports acc_norm for these (its TASKS_WITH_ACC_NORM), acc only for the others
    assert task.spec.acc_norm == (name not in ("boolq", "ceval_valid", "mmlu", "mmlu_pro"))


def test_the_families_ask_as_lm_eval_does() -> None:
    doc = arc.doc(ARC_ROW)
    assert (doc.context, doc.choices, doc.gold) == (
        "Question: Which organ pumps blood?\nAnswer:", ("lungs", "heart"), 1)
    assert doc.continuation(1) == " heart"
    doc = hellaswag.doc({"activity_label": "Home and Garden",
                         "ctx_a": "[header] How to water a plant [title] Check the soil.",
                         "ctx_b": "feel it", "endings": ["[step] Pour  water.", "Sing."],
                         "label": "0"})
    assert doc.context == "Home and Garden: How to water a plant. Check the soil. Feel it"
    # lm-eval strips before it drops the brackets: a leading one leaves its space
    assert doc.choices == (" Pour water.", "Sing.") and doc.gold == 0
    doc = piqa.doc({"goal": "Open a jar", "sol1": "twist", "sol2": "shout", "label": 0})
    assert (doc.context, doc.choices, doc.gold) == ("Question: Open a jar\nAnswer:",
                                                    ("twist", "shout"), 0)
    doc = boolq.doc({"passage": "Sky -- it is blue.", "question": "is the sky blue",
                     "label": 1})
    assert doc.context == "Sky -- it is blue.\nQuestion: is the sky blue?\nAnswer:"
    assert (doc.choices, doc.gold) == (("no", "yes"), 1)
    assert boolq.doc({"passage": "p", "question": "q", "answer": False}).gold == 0
    doc = openbookqa.doc({"question_stem": "Ice is", "answerKey": " C",
                          "choices": {"text": ["hot", "gas", "cold", "red"],
                                      "label": ["A", "B", "C", "D"]}})
    assert (doc.context, doc.gold) == ("Ice is", 2)
    doc = mmlu.doc({"question": " What is 2+2? ", "subject": "elementary_mathematics",
                    "choices": ["3", "4", "5", "6"], "answer": 1})
    assert doc.context == ("The following are multiple choice questions (with answers) "
                           "about elementary mathematics.\n\nWhat is 2+2?\nA. 3\nB. 4\nC. 5\n"
                           "D. 6\nAnswer:")
    assert (doc.choices, doc.gold, doc.continuation(1)) == (("A", "B", "C", "D"), 1, " B")


def test_documents_are_sampled_with_the_seed_and_capped() -> None:
    everything = load_task("mmlu", seed=42).docs
    assert load_task("mmlu", seed=42).docs == everything  # the same on every client
    assert {d.context for d in load_task("mmlu", seed=7).docs} == {d.context for d in everything}
    orders = {tuple(d.context for d in load_task("mmlu", seed=s).docs) for s in range(6)}
    assert len(orders) > 1  # the seed picks the order
    assert load_task("mmlu", seed=42, max_docs=2).docs == everything[:2]


def test_a_local_directory_comes_first(tmp_path: Path) -> None:
    (tmp_path / "arc_easy.jsonl").write_text(json.dumps(ARC_ROW) + "\n\n")
    pq.write_table(pa.Table.from_pylist([ARC_ROW, ARC_ROW]), tmp_path / "piqa.parquet")
    task = load_task("arc_easy", data_dir=tmp_path)
    assert task.source == str(tmp_path / "arc_easy.jsonl") and len(task.docs) == 1
    assert load_task("boolq", data_dir=tmp_path).source == BUNDLED  # no file of its own
    with pytest.raises(EvalDataError, match=r"piqa: .*piqa.parquet row \d: field 'goal' must "
                                            r"be a string, got nothing$"):
        load_task("piqa", data_dir=tmp_path)  # ARC rows are not PIQA's format


def test_a_cached_hub_snapshot_is_read_offline(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The data set's snapshot in the Hugging Face cache, laid out as huggingface_hub
    keeps it; only the task's configuration and split are read."""
    repo = tmp_path / "datasets--allenai--ai2_arc"
    snapshot = repo / "snapshots" / ("ab" * 20)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("ab" * 20)
    for config, split, rows in (("ARC-Easy", "test", 3), ("ARC-Easy", "train", 5),
                                ("ARC-Challenge", "test", 7)):
        (snapshot / config).mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist([ARC_ROW] * rows),
                       snapshot / config / f"{split}-00000-of-00001.parquet")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    task = load_task("arc_easy")
    assert task.source == "hub snapshot allenai/ai2_arc" and len(task.docs) == 3
    assert len(load_task("arc_challenge").docs) == 7
    assert load_task("piqa").source == BUNDLED  # not in this cache


@pytest.mark.parametrize(("text", "message"), [
    (json.dumps({**ARC_ROW, "answerKey": None}),
     "row 1: field 'answerKey' must be a string, got nothing"),
    (json.dumps({**ARC_ROW, "answerKey": "E"}),
     "row 1: field 'answerKey' is 'E', not one of the labels ['A', 'B']"),
    (json.dumps({**ARC_ROW, "choices": {"text": ["a"], "label": ["A", "B"]}}),
     "row 1: field 'choices' has 1 texts but 2 labels"),
    ("[1, 2]", "row 1: a row must be a JSON object, got list"),
    (json.dumps(ARC_ROW) + "\n{not json", "line 2: not JSON"),
])
def test_a_bad_row_is_one_line_naming_the_file_and_row(tmp_path: Path, text: str,
                                                        message: str) -> None:
    (tmp_path / "arc_easy.jsonl").write_text(text)
    with pytest.raises(EvalDataError) as error:
        load_task("arc_easy", data_dir=tmp_path)
    assert message in str(error.value) and "\n" not in str(error.value)
    assert str(tmp_path / "arc_easy.jsonl") in str(error.value)


def test_task_names_are_psyches() -> None:
    assert TASK_NAMES == ("arc_challenge", "arc_easy", "boolq", "ceval_valid", "hellaswag",
                          "mmlu", "mmlu_cf", "mmlu_pro", "openbookqa", "piqa")
    assert set(TASKS) == set(TASK_NAMES)
    assert parse_task_names(" arc_easy,piqa,,arc_easy ") == ("arc_easy", "piqa")
    assert parse_task_names("") == ()
    with pytest.raises(ValueError, match=r"unknown eval task 'squad': use arc_challenge, "
                                         r"arc_easy, boolq, ceval_valid, hellaswag, mmlu, "
                                         r"mmlu_cf, mmlu_pro, openbookqa, piqa$"):
        parse_task_names("arc_easy,squad")
