"""ARC (allenai/ai2_arc, ARC-Challenge and ARC-Easy, test split), as lm-eval asks it.

Row: {"id", "question", "choices": {"text": [...], "label": ["A", "B", ...]}, "answerKey"}.
Context "Question: {question}\\nAnswer:", choices the texts, gold the answer key's label.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from client_image.evals.documents import choice_block, index_of, text
from client_image.evals.scoring import EvalDoc

DATASET = "allenai/ai2_arc"
SPLIT = "test"


def doc(row: Mapping[str, Any]) -> EvalDoc:
    texts, labels = choice_block(row, "choices")
    return EvalDoc(context=f"Question: {text(row, 'question')}\nAnswer:", choices=tuple(texts),
                   gold=index_of(labels, text(row, "answerKey"), "answerKey"))
