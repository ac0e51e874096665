"""MMLU (cais/mmlu, config all, test split), zero-shot, in two forms.

    doc(row)         mmlu: lm-eval's prompt, the letters as choices
    cloze_doc(row)   mmlu_cf: the answers' own texts as choices

Row: {"question", "subject", "choices": [4 strings], "answer": 0..3}. mmlu's context:

    The following are multiple choice questions (with answers) about {subject}.

    {question}
    A. {choice 0}
    ...
    D. {choice 3}
    Answer:

choices the letters "A".."D" (scored as " A"), gold the answer.

mmlu_cf (cloze form, as Psyche's MMLU CF and lm-eval's cloze MMLU variants ask it): context
"Question: {question}\nAnswer:", choices the four answers' texts (scored as " {text}"),
gold the answer. Psyche reports its acc_norm (MMLU CF is in its TASKS_WITH_ACC_NORM):
texts of different lengths make the per-byte score the fair one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from client_image.evals.documents import BadDocument, integer, text, text_list
from client_image.evals.scoring import EvalDoc

DATASET = "cais/mmlu"
CONFIG = "all"
SPLIT = "test"
LETTERS = ("A", "B", "C", "D")


def doc(row: Mapping[str, Any]) -> EvalDoc:
    subject = text(row, "subject").replace("_", " ")
    choices = _four_choices(row)
    lines = [f"The following are multiple choice questions (with answers) about {subject}.",
             "", text(row, "question").strip()]
    lines += [f"{letter}. {choice}" for letter, choice in zip(LETTERS, choices, strict=True)]
    lines.append("Answer:")
    return EvalDoc(context="\n".join(lines), choices=LETTERS,
                   gold=integer(row, "answer", len(LETTERS)))


def cloze_doc(row: Mapping[str, Any]) -> EvalDoc:
    return EvalDoc(context=f"Question: {text(row, 'question').strip()}\nAnswer:",
                   choices=tuple(_four_choices(row)), gold=integer(row, "answer", len(LETTERS)))


def _four_choices(row: Mapping[str, Any]) -> list[str]:
    choices = text_list(row, "choices")
    if len(choices) != len(LETTERS):
        raise BadDocument(f"field 'choices' must hold 4 answers, got {len(choices)}")
    return choices
