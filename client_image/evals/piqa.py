"""PIQA (ybisk/piqa, validation split), as lm-eval asks it.

Row: {"goal", "sol1", "sol2", "label": 0 | 1}. Context "Question: {goal}\\nAnswer:",
choices sol1 and sol2, gold the label.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from client_image.evals.documents import integer, text
from client_image.evals.scoring import EvalDoc

DATASET = "ybisk/piqa"
SPLIT = "validation"


def doc(row: Mapping[str, Any]) -> EvalDoc:
    return EvalDoc(context=f"Question: {text(row, 'goal')}\nAnswer:",
                   choices=(text(row, "sol1"), text(row, "sol2")),
                   gold=integer(row, "label", 2))
