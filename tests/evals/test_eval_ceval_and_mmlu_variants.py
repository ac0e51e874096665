"""ceval_valid, mmlu_cf and mmlu_pro (5-shot) ask as lm-eval asks them, from their data
sets' own rows: the bundled samples, --eval-data-dir files and Hugging Face snapshots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import huggingface_hub.constants
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from client_image.evals import ceval, mmlu, mmlu_pro
from client_image.evals.catalog import BUNDLED, SAMPLES, TASKS, EvalDataError, load_task

CEVAL_ROW = {"id": 7, "question": " TCP协议位于哪一层？ ", "A": "网络层", "B": "传输层",
             "C": "会话层", "D": "物理层", "answer": "B", "explanation": ""}


def sample_rows(name: str) -> list[dict[str, Any]]:
    lines = (SAMPLES / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def pro_row(question: str, options: list[str], answer: str, category: str) -> dict[str, Any]:
    return {"question_id": 1, "question": question, "options": options, "answer": answer,
            "answer_index": "ABCDEFGHIJ".index(answer), "cot_content": "",
            "category": category, "src": "ori_mmlu-x"}


@pytest.mark.parametrize(("name", "golds"), [
    ("ceval_valid", [1, 2, 0, 3, 0]),
    ("mmlu_cf", [1, 2, 0, 1, 3]),
    ("mmlu_pro", [1, 1, 2, 1, 2]),
])
def test_each_sample_row_has_its_gold(name: str, golds: list[int]) -> None:
    spec = TASKS[name]
    assert [spec.doc(row).gold for row in sample_rows(name)] == golds
    task = load_task(name)
    assert task.source == BUNDLED and sorted(d.gold for d in task.docs) == sorted(golds)


def test_ceval_asks_with_lm_evals_prompt_and_letters() -> None:
    doc = ceval.doc({**CEVAL_ROW, "subject": "computer_network"})
    assert doc.context == ("以下是中国关于计算机网络的单项选择题，请选出其中的正确答案。\n\n"
                           "TCP协议位于哪一层？\nA. 网络层\nB. 传输层\nC. 会话层\nD. 物理层\n答案：")
    assert (doc.choices, doc.gold, doc.continuation(1)) == (("A", "B", "C", "D"), 1, " B")
    # a row read without its config cannot name its subject: no description line
    assert ceval.doc(CEVAL_ROW).context.startswith("TCP协议位于哪一层？\nA. 网络层\n")
    assert not TASKS["ceval_valid"].acc_norm  # not in Psyche's TASKS_WITH_ACC_NORM


def test_ceval_rejects_a_subject_it_does_not_know(tmp_path: Path) -> None:
    row = {**CEVAL_ROW, "subject": "astrology"}
    (tmp_path / "ceval_valid.jsonl").write_text(json.dumps(row, ensure_ascii=False) + "\n")
    with pytest.raises(EvalDataError, match=r"row 1: field 'subject' is 'astrology', not a "
                                            r"C-Eval subject$"):
        load_task("ceval_valid", data_dir=tmp_path)


def test_mmlu_cf_scores_the_answers_texts() -> None:
    doc = mmlu.cloze_doc({"question": " Which planet is closest to the Sun? ",
                          "subject": "astronomy",
                          "choices": ["Venus", "Earth", "Mars", "Mercury"], "answer": 3})
    assert doc.context == "Question: Which planet is closest to the Sun?\nAnswer:"
    assert (doc.choices, doc.gold, doc.continuation(3)) == (
        ("Venus", "Earth", "Mars", "Mercury"), 3, " Mercury")
    assert TASKS["mmlu_cf"].acc_norm  # MMLU CF is in Psyche's TASKS_WITH_ACC_NORM


def test_mmlu_pro_puts_its_categorys_first_five_validation_rows_before_it() -> None:
    docs = {doc.context.rsplit("\n\n", 1)[1]: doc for doc in load_task("mmlu_pro").docs}
    own = "Solve for x: 3x + 4 = 19.\nA. 3\nB. 4\nC. 5\nD. 6\nE. 7\nF. 8\nAnswer:"
    assert docs[own].context == (
        "What is 2 + 3?\nA. 4\nB. 5\nC. 6\nD. 7\nAnswer: B\n\n"
        "What is 10 divided by 2?\nA. 2\nB. 4\nC. 5\nD. 8\nE. 10\nAnswer: C\n\n"
        "What is the square root of 81?\nA. 7\nB. 8\nC. 9\nD. 10\nAnswer: C\n\n"
        "What is 7 minus 4?\nA. 3\nB. 4\nC. 11\nD. 2\nAnswer: A\n\n"
        "How many sides does a hexagon have?\nA. 5\nB. 6\nC. 7\nD. 8\nAnswer: B\n\n" + own)
    assert docs[own].choices == ("A", "B", "C", "D", "E", "F") and docs[own].gold == 2
    history = [doc for doc in docs.values() if "Machu Picchu" in doc.context]
    assert len(history) == 1 and history[0].context.count("\n\n") == 5
    assert history[0].context.startswith("Who was the first President of the United States?")
    assert "What is 2 + 3?" not in history[0].context


def test_mmlu_pro_refuses_a_document_whose_category_has_no_examples(tmp_path: Path) -> None:
    row = pro_row("Is law a category?", ["yes", "no"], "A", "law")
    (tmp_path / "mmlu_pro.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(EvalDataError, match=r"mmlu_pro: .*mmlu_pro.jsonl row 1: no validation "
                                            r"examples of its group 'law'$"):
        load_task("mmlu_pro", data_dir=tmp_path)  # the bundled validation rows lack law
    (tmp_path / "mmlu_pro.validation.jsonl").write_text(
        json.dumps(pro_row("Is this an example?", ["no", "yes"], "B", "law")) + "\n")
    doc = load_task("mmlu_pro", data_dir=tmp_path).docs[0]
    assert doc.context == ("Is this an example?\nA. no\nB. yes\nAnswer: B\n\n"
                           "Is law a category?\nA. yes\nB. no\nAnswer:")


def test_mmlu_pro_rejects_a_bad_example_naming_its_split(tmp_path: Path) -> None:
    (tmp_path / "mmlu_pro.validation.jsonl").write_text(
        json.dumps(pro_row("q", ["a", "b"], "C", "math")) + "\n")
    with pytest.raises(EvalDataError, match=r"\(validation\) row 1: field 'answer' is 'C', "
                                            r"not one of the labels \['A', 'B'\]$"):
        load_task("mmlu_pro", data_dir=tmp_path)


def _snapshot(cache: Path, repo: str, files: dict[str, list[dict[str, Any]]]) -> None:
    """A data set laid out in the Hugging Face cache as huggingface_hub keeps it."""
    folder = cache / ("datasets--" + repo.replace("/", "--"))
    snapshot = folder / "snapshots" / ("cd" * 20)
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text("cd" * 20)
    for relative, rows in files.items():
        (snapshot / relative).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows), snapshot / relative)


def test_snapshots_give_ceval_its_subjects_and_mmlu_pro_its_examples(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _snapshot(tmp_path, ceval.DATASET, {
        "law/val-00000-of-00001.parquet": [CEVAL_ROW],
        "logic/val-00000-of-00001.parquet": [CEVAL_ROW, CEVAL_ROW],
        "logic/dev-00000-of-00001.parquet": [CEVAL_ROW],
    })
    _snapshot(tmp_path, mmlu_pro.DATASET, {
        "data/test-00000-of-00001.parquet": [pro_row("Q?", ["x", "y"], "A", "math")],
        "data/validation-00000-of-00001.parquet": [
            pro_row(f"E{n}?", ["x", "y"], "B", "math") for n in range(7)],
    })
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    task = load_task("ceval_valid")
    assert task.source == "hub snapshot ceval/ceval-exam" and len(task.docs) == 3
    assert sorted(d.context.split("的")[0] for d in task.docs) == [
        "以下是中国关于法学", "以下是中国关于逻辑学", "以下是中国关于逻辑学"]
    (doc,) = load_task("mmlu_pro").docs
    assert doc.context.startswith("E0?\nA. x\nB. y\nAnswer: B\n\nE1?")
    assert doc.context.count("\n\n") == 5 and "E5?" not in doc.context
    assert doc.context.endswith("\n\nQ?\nA. x\nB. y\nAnswer:")
