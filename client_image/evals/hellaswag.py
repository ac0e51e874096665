"""HellaSwag (Rowan/hellaswag, validation split) with lm-eval's preprocessing.

Row: {"activity_label", "ctx_a", "ctx_b", "ctx", "endings": [4 strings], "label": "0".."3"}.
Context preprocess("{activity_label}: {ctx_a} {ctx_b capitalized}") (just `ctx` when the
row has no ctx_a), choices the preprocessed endings, gold the label.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from client_image.evals.documents import integer, text, text_list
from client_image.evals.scoring import EvalDoc

DATASET = "Rowan/hellaswag"
SPLIT = "validation"


def preprocess(value: str) -> str:
    """lm-eval's: the brackets are artifacts of the WikiHow part of HellaSwag."""
    value = value.strip().replace(" [title]", ". ")
    value = re.sub(r"\[.*?\]", "", value)
    return value.replace("  ", " ")


def doc(row: Mapping[str, Any]) -> EvalDoc:
    if "ctx_a" in row:
        context = text(row, "ctx_a") + " " + text(row, "ctx_b").capitalize()
    else:
        context = text(row, "ctx")
    endings = text_list(row, "endings")
    return EvalDoc(context=preprocess(text(row, "activity_label") + ": " + context),
                   choices=tuple(preprocess(e) for e in endings),
                   gold=integer(row, "label", len(endings)))
