"""Reading one data set row: the field checks every task family shares.

    BadDocument                 a row that is not in its data set's format (one line)
    text(row, key)              a string field
    text_list(row, key)         a list of strings
    choice_block(row, key)      ARC's and OpenBookQA's {"text": [...], "label": [...]}
    index_of(labels, key, ...)  the position of an answer key among the labels
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


class BadDocument(ValueError):
    """A row that is not in its data set's format."""


def text(row: Mapping[str, Any], key: str) -> str:
    value = row.get(key)
    if not isinstance(value, str):
        raise BadDocument(f"field {key!r} must be a string, got {_shown(value)}")
    return value


def text_list(row: Mapping[str, Any], key: str) -> list[str]:
    value = row.get(key)
    if not _is_list(value) or not value or not all(isinstance(v, str) for v in value):
        raise BadDocument(f"field {key!r} must be a non-empty list of strings, got "
                          f"{_shown(value)}")
    return list(value)


def choice_block(row: Mapping[str, Any], key: str) -> tuple[list[str], list[str]]:
    """(texts, labels) of {"text": [...], "label": [...]} (the same length)."""
    block = row.get(key)
    if not isinstance(block, Mapping):
        raise BadDocument(f"field {key!r} must be an object with 'text' and 'label' lists, "
                          f"got {_shown(block)}")
    texts, labels = text_list(block, "text"), text_list(block, "label")
    if len(texts) != len(labels):
        raise BadDocument(f"field {key!r} has {len(texts)} texts but {len(labels)} labels")
    return texts, labels


def index_of(labels: Sequence[str], answer: str, key: str) -> int:
    try:
        return list(labels).index(answer)
    except ValueError:
        raise BadDocument(f"field {key!r} is {answer!r}, not one of the labels "
                          f"{list(labels)}") from None


def integer(row: Mapping[str, Any], key: str, below: int) -> int:
    """An int field (or its decimal string, as HellaSwag's label) in 0..below-1."""
    value = row.get(key)
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < below:
        raise BadDocument(f"field {key!r} must be an integer in 0..{below - 1}, "
                          f"got {_shown(value)}")
    return value


def _is_list(value: object) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str | bytes)


def _shown(value: object) -> str:
    if value is None:
        return "nothing"
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."
