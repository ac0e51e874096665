"""BoolQ (SuperGLUE's, aps/super_glue config boolq, validation split), as lm-eval asks it.

Row: {"passage", "question", "label": 0 | 1} (google/boolq's {"answer": false | true} too).
Context "{passage}\\nQuestion: {question}?\\nAnswer:", choices "no" and "yes", gold the
label (1: yes).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from client_image.evals.documents import BadDocument, integer, text
from client_image.evals.scoring import EvalDoc

DATASET = "aps/super_glue"
CONFIG = "boolq"
SPLIT = "validation"


def doc(row: Mapping[str, Any]) -> EvalDoc:
    if "label" in row:
        gold = integer(row, "label", 2)
    elif isinstance(row.get("answer"), bool):
        gold = int(row["answer"])
    else:
        raise BadDocument("a BoolQ row needs 'label' (0 or 1) or 'answer' (true or false)")
    return EvalDoc(context=f"{text(row, 'passage')}\nQuestion: {text(row, 'question')}?\n"
                           "Answer:", choices=("no", "yes"), gold=gold)
