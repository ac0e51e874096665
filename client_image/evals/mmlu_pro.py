"""MMLU-Pro (TIGER-Lab/MMLU-Pro, test split), 5-shot from its validation split: mmlu_pro.

    doc(row)        a row -> EvalDoc (its own question, without the examples)
    category(row)   the row's category: its examples are the validation rows of the same one
    SHOTS, FEWSHOT_SPLIT

Followed: lm-eval's leaderboard_mmlu_pro (multiple choice, acc, 5 shots, first_n sampler
over the validation split), with the examples drawn from the document's own category as
Psyche draws them (the validation split holds 5 rows per category, so the shots are
exactly those). Row: {"question_id", "question", "options": [up to 10 strings],
"answer": "A".."J", "answer_index", "cot_content", "category", "src"}. Context:

    {question}
    A. {option 0}
    ...
    Answer:

choices the letters of the options ("A".., scored as " A"), gold the answer's letter. The
catalog puts each example's context and right letter before it (lm-eval's few-shot form;
Psyche's own text ends in "Answer: " and so scores "Answer:  A", with two spaces: not
followed). Psyche shuffles the category's examples before taking 5; as all 5 are taken,
only their order differs from this.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from client_image.evals.documents import BadDocument, index_of, text, text_list
from client_image.evals.scoring import EvalDoc

DATASET = "TIGER-Lab/MMLU-Pro"
SPLIT = "test"
FEWSHOT_SPLIT = "validation"
SHOTS = 5
LETTERS = tuple("ABCDEFGHIJ")


def doc(row: Mapping[str, Any]) -> EvalDoc:
    options = text_list(row, "options")
    if len(options) > len(LETTERS):
        raise BadDocument(f"field 'options' must hold at most 10 answers, got {len(options)}")
    letters = LETTERS[:len(options)]
    lines = [text(row, "question")]
    lines += [f"{letter}. {option}" for letter, option in zip(letters, options, strict=True)]
    lines.append("Answer:")
    return EvalDoc(context="\n".join(lines), choices=letters,
                   gold=index_of(letters, text(row, "answer"), "answer"))


def category(row: Mapping[str, Any]) -> str:
    return text(row, "category")
