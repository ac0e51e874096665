"""OpenBookQA (allenai/openbookqa, config main, test split), as lm-eval asks it.

Row: {"id", "question_stem", "choices": {"text": [4], "label": ["A".."D"]}, "answerKey"}.
Context the question stem, choices the texts, gold the answer key's label.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from client_image.evals.documents import choice_block, index_of, text
from client_image.evals.scoring import EvalDoc

DATASET = "allenai/openbookqa"
CONFIG = "main"
SPLIT = "test"


def doc(row: Mapping[str, Any]) -> EvalDoc:
    texts, labels = choice_block(row, "choices")
    return EvalDoc(context=text(row, "question_stem"), choices=tuple(texts),
                   gold=index_of(labels, text(row, "answerKey").strip(), "answerKey"))
