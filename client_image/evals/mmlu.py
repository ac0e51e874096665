"""MMLU (cais/mmlu, config all, test split), zero-shot with lm-eval's prompt.

Row: {"question", "subject", "choices": [4 strings], "answer": 0..3}. Context:

    The following are multiple choice questions (with answers) about {subject}.

    {question}
    A. {choice 0}
    ...
    D. {choice 3}
    Answer:

choices the letters "A".."D" (scored as " A"), gold the answer.
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
    choices = text_list(row, "choices")
    if len(choices) != len(LETTERS):
        raise BadDocument(f"field 'choices' must hold 4 answers, got {len(choices)}")
    subject = text(row, "subject").replace("_", " ")
    lines = [f"The following are multiple choice questions (with answers) about {subject}.",
             "", text(row, "question").strip()]
    lines += [f"{letter}. {choice}" for letter, choice in zip(LETTERS, choices, strict=True)]
    lines.append("Answer:")
    return EvalDoc(context="\n".join(lines), choices=LETTERS,
                   gold=integer(row, "answer", len(LETTERS)))
