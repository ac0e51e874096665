"""Preprocessed data provider: Psyche's `Preprocessed` data location, parquet files of
already tokenized sequences (shared/data-provider/src/preprocessed.rs and dataset.rs).

`source` is a local directory or, when no such path exists, a Hugging Face dataset id
whose snapshot is downloaded into the HF cache (Psyche's client does the same); the
dataset's directory is then the folder of its first parquet file (sorted by path).

Which files: the `*.parquet` files directly in the directory (not in subfolders), of the
train split, as Psyche's `Dataset::load_dataset(files, Some(Split::Train), None)` picks
them: all of them when the directory's name, up to its first `-`, is `train` (any case;
the layout of the HF parquet converter, `<subset>/train/0000.parquet`), else those whose
file names start with `train` (`train-00000-of-00002.parquet`). Files are read in order
of their name without extension; their rows are the sequences, in file order, never
shuffled (Psyche's client opens this location with DontShuffle).

Columns, each a list of integers (or booleans) per row:

- `inputs` (required): the tokens, exactly max_seq_len of them;
- `labels`, `position_ids` (optional): max_seq_len values each;
- `sequence_lengths` (optional): any length.

`get_samples`/`fetch` give the inputs; `get_labelled`/`fetch_labelled` give the inputs
and the labels (None when no file of the rows has a `labels` column; a row of a file
without one is labelled by its inputs), which a Finetuning run trains on (a label of
-100 is not in the loss; labels are shifted inside the model, as inputs are). Position
ids and sequence lengths (Psyche's variable-length attention) are checked, as Psyche
checks them, and not used.

Files are opened through their parquet metadata; a fetch reads only the row groups that
hold its rows, and only the columns above (never a whole file at once); the last few row
groups read are kept. A row of the wrong length, a null, a missing `inputs` column or a
column that is not a list of integers is a one-line DataProviderError.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from psyche_common.token_files.sequences import DataProviderError, check_batch

PARQUET_EXTENSION = ".parquet"
INPUTS = "inputs"
LABELS = "labels"
# Columns of max_seq_len values per row, and columns of any length.
FIXED_LENGTH_COLUMNS = (INPUTS, LABELS, "position_ids")
FREE_LENGTH_COLUMNS = ("sequence_lengths",)
TRAIN_SPLIT = "train"
_CACHED_ROW_GROUPS = 4


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def resolve_source(source: str) -> Path:
    """The local directory `source`, or the directory of the dataset snapshot it names."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    if path.exists() or source.startswith((".", "/", "~")):
        raise DataProviderError(f"preprocessed data directory {source} does not exist")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError

    try:
        snapshot = Path(snapshot_download(repo_id=source, repo_type="dataset",
                                          allow_patterns=["*.parquet", "**/*.parquet"]))
    except HFValidationError as exc:
        raise DataProviderError(
            f"{source!r} is neither a directory nor a Hugging Face dataset id: "
            f"{_one_line(exc)}") from exc
    except Exception as exc:  # huggingface_hub raises many types for offline/missing repos
        raise DataProviderError(
            f"Hugging Face dataset {source!r} unavailable: {_one_line(exc)}") from exc
    files = sorted(snapshot.rglob(f"*{PARQUET_EXTENSION}"))
    if not files:
        raise DataProviderError(f"Hugging Face dataset {source!r} has no parquet files")
    return files[0].parent


def train_files(directory: Path) -> list[Path]:
    """The train split's parquet files of `directory`, in Psyche's order (module doc)."""
    if not directory.is_dir():
        raise DataProviderError(f"preprocessed data directory {directory} does not exist")
    parquet = [p for p in directory.iterdir()
               if p.is_file() and p.suffix.lower() == PARQUET_EXTENSION]
    if not parquet:
        raise DataProviderError(f"preprocessed data directory {directory} has no *.parquet files")
    if directory.resolve().name.split("-")[0].lower() == TRAIN_SPLIT:
        chosen = parquet
    else:
        chosen = [p for p in parquet if p.name.startswith(TRAIN_SPLIT)]
    if not chosen:
        raise DataProviderError(
            f"preprocessed data directory {directory} has no train split: name the files "
            f"train*.parquet or the directory train")
    return sorted(chosen, key=lambda p: p.stem)


def _check_column_type(file: Path, name: str, field: Any) -> None:
    kind = field.type
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)
            or pa.types.is_fixed_size_list(kind)):
        raise DataProviderError(
            f"{file}: column `{name}` has type {kind}, expected a list of integers")
    value = kind.value_type
    if not (pa.types.is_integer(value) or pa.types.is_boolean(value)):
        raise DataProviderError(
            f"{file}: column `{name}` has type {kind}, expected a list of integers")


class _RowGroup:
    __slots__ = ("file_index", "first_row", "group", "num_rows")

    def __init__(self, file_index: int, group: int, first_row: int, num_rows: int) -> None:
        self.file_index, self.group = file_index, group
        self.first_row, self.num_rows = first_row, num_rows


class PreprocessedDataProvider:
    """The rows of a directory's train-split parquet files (see the module docstring)."""

    def __init__(self, directory: str | Path, max_seq_len: int) -> None:
        if max_seq_len < 1:
            raise DataProviderError(f"max_seq_len must be >= 1, got {max_seq_len}")
        self.max_seq_len = max_seq_len
        self.files = train_files(Path(directory))
        self._readers: list[Any] = []
        self._columns: list[list[str]] = []
        self._groups: list[_RowGroup] = []
        row = 0
        for file_index, file in enumerate(self.files):
            try:
                reader = pq.ParquetFile(file)
            except (OSError, pa.ArrowException) as exc:
                raise DataProviderError(
                    f"{file}: not a readable parquet file: {_one_line(exc)}") from exc
            schema = reader.schema_arrow
            if schema.get_field_index(INPUTS) < 0:
                raise DataProviderError(f"{file}: no `{INPUTS}` column")
            columns = [name for name in FIXED_LENGTH_COLUMNS + FREE_LENGTH_COLUMNS
                       if schema.get_field_index(name) >= 0]
            for name in columns:
                _check_column_type(file, name, schema.field(name))
            self._readers.append(reader)
            self._columns.append(columns)
            metadata = reader.metadata
            for group in range(metadata.num_row_groups):
                count = metadata.row_group(group).num_rows
                if count:
                    self._groups.append(_RowGroup(file_index, group, row, count))
                    row += count
        if row == 0:
            raise DataProviderError(f"preprocessed data in {directory} has no rows")
        self._num_sequences = row
        self._starts = np.array([g.first_row for g in self._groups], dtype=np.int64)
        self._cache: OrderedDict[int, tuple[np.ndarray, np.ndarray | None]] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def num_sequences(self) -> int:
        return self._num_sequences

    def get_samples(self, start: int, end: int) -> torch.Tensor:
        """Rows start..end (inclusive): `inputs` as an int64 tensor [n, max_seq_len]."""
        return self.get_labelled(start, end)[0]

    def get_labelled(self, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Rows start..end (inclusive): (`inputs`, `labels`), int64 [n, max_seq_len] each;
        labels None when none of these rows' files has a `labels` column."""
        check_batch(start, end, self._num_sequences)
        inputs: list[np.ndarray] = []
        labels: list[np.ndarray | None] = []
        first = int(np.searchsorted(self._starts, start, side="right")) - 1
        for index in range(first, len(self._groups)):
            group = self._groups[index]
            if group.first_row > end:
                break
            group_inputs, group_labels = self._row_group_columns(index)
            lo = max(start, group.first_row) - group.first_row
            hi = min(end, group.first_row + group.num_rows - 1) - group.first_row
            inputs.append(group_inputs[lo : hi + 1])
            labels.append(None if group_labels is None else group_labels[lo : hi + 1])
        all_inputs = torch.from_numpy(np.concatenate(inputs))
        if all(part is None for part in labels):
            return all_inputs, None
        filled = [own if own is not None else rows for own, rows in zip(labels, inputs, strict=True)]
        return all_inputs, torch.from_numpy(np.concatenate(filled))

    async def fetch(self, start: int, end: int) -> torch.Tensor:
        """get_samples off the event loop."""
        return await asyncio.to_thread(self.get_samples, start, end)

    async def fetch_labelled(self, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """get_labelled off the event loop."""
        return await asyncio.to_thread(self.get_labelled, start, end)

    def _row_group_columns(self, index: int) -> tuple[np.ndarray, np.ndarray | None]:
        with self._lock:
            cached = self._cache.get(index)
            if cached is not None:
                self._cache.move_to_end(index)
                return cached
            columns = self._read_row_group(self._groups[index])
            self._cache[index] = columns
            while len(self._cache) > _CACHED_ROW_GROUPS:
                self._cache.popitem(last=False)
            return columns

    def _read_row_group(self, group: _RowGroup) -> tuple[np.ndarray, np.ndarray | None]:
        file = self.files[group.file_index]
        columns = self._columns[group.file_index]
        try:
            table = self._readers[group.file_index].read_row_group(group.group, columns=columns)
        except (OSError, pa.ArrowException) as exc:
            raise DataProviderError(
                f"{file}: row group {group.group} unreadable: {_one_line(exc)}") from exc
        where = f"{file} (rows {group.first_row}..{group.first_row + group.num_rows - 1})"
        read: dict[str, np.ndarray] = {}
        for name in columns:
            read[name] = _list_values(
                table.column(name), where, name,
                self.max_seq_len if name in FIXED_LENGTH_COLUMNS else None)
        labels = read.get(LABELS)
        return (read[INPUTS].reshape(-1, self.max_seq_len),
                None if labels is None else labels.reshape(-1, self.max_seq_len))


def _list_values(column: Any, where: str, name: str, length: int | None) -> np.ndarray:
    """The flattened int64 values of a list column, each row checked to hold `length`."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if array.null_count:
        raise DataProviderError(f"{where}: column `{name}` has a null row")
    if length is not None:
        lengths = pc.list_value_length(array).to_numpy(zero_copy_only=False)
        bad = np.flatnonzero(lengths != length)
        if bad.size:
            raise DataProviderError(
                f"{where}: `{name}` has length {int(lengths[bad[0]])} instead of {length} "
                f"(row {int(bad[0])} of its row group)")
    values = array.flatten()
    if values.null_count:
        raise DataProviderError(f"{where}: column `{name}` has a null value")
    return np.asarray(values.to_numpy(zero_copy_only=False)).astype(np.int64)


def open_preprocessed(source: str, max_seq_len: int) -> PreprocessedDataProvider:
    """A provider for a `Preprocessed = source` data location (may download; blocking)."""
    return PreprocessedDataProvider(resolve_source(source), max_seq_len)


__all__ = [
    "PreprocessedDataProvider", "open_preprocessed", "resolve_source", "train_files",
]
