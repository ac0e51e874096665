"""PreprocessedDataProvider: parquet files of tokenized rows, read by row groups."""

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from client_image.data import DataProviderError, open_provider
from client_image.data.preprocessed import PreprocessedDataProvider, resolve_source, train_files
from coordinator.config import PreprocessedDataLocation

SEQ = 4


def rows(first: int, count: int) -> list[list[int]]:
    return [[first + i] * SEQ for i in range(count)]


def write(path: Path, columns: dict[str, Any], row_group_size: int = 3, **kw: Any) -> None:
    pq.write_table(pa.table(columns, **kw), path, row_group_size=row_group_size)


@pytest.fixture
def two_files(tmp_path: Path) -> Path:
    write(tmp_path / "train-00001.parquet", {"inputs": rows(100, 4)})
    write(tmp_path / "train-00000.parquet", {"inputs": rows(0, 7)})
    write(tmp_path / "validation-00000.parquet", {"inputs": rows(900, 2)})
    (tmp_path / "notes.txt").write_text("not data")
    return tmp_path


async def test_rows_of_the_train_files_in_name_order(two_files: Path) -> None:
    provider = PreprocessedDataProvider(two_files, SEQ)
    assert [f.name for f in provider.files] == ["train-00000.parquet", "train-00001.parquet"]
    assert provider.num_sequences == 11
    batch = await provider.fetch(0, 10)
    assert batch.dtype == torch.int64 and batch.shape == (11, SEQ)
    assert batch[:, 0].tolist() == [*range(7), *range(100, 104)]


async def test_a_fetch_across_row_groups_and_files(two_files: Path) -> None:
    provider = PreprocessedDataProvider(two_files, SEQ)
    assert (await provider.fetch(5, 8)).tolist() == rows(5, 2) + rows(100, 2)
    assert (await provider.fetch(10, 10)).tolist() == rows(103, 1)


async def test_the_same_index_gives_the_same_rows_in_any_order(two_files: Path) -> None:
    one, other = PreprocessedDataProvider(two_files, SEQ), PreprocessedDataProvider(two_files, SEQ)
    forwards = [await one.fetch(i, i + 1) for i in range(0, 10)]
    backwards = [await other.fetch(i, i + 1) for i in reversed(range(0, 10))][::-1]
    assert all(torch.equal(a, b) for a, b in zip(forwards, backwards, strict=True))


def test_only_the_needed_row_groups_are_read(two_files: Path, monkeypatch: Any) -> None:
    provider = PreprocessedDataProvider(two_files, SEQ)
    read: list[int] = []
    original = provider._read_row_group
    monkeypatch.setattr(provider, "_read_row_group",
                        lambda group: read.append(group.first_row) or original(group))
    provider.get_samples(4, 5)  # rows 3..5 are the second row group of the first file
    provider.get_samples(3, 3)  # the same row group again: cached
    assert read == [3]


async def test_optional_columns_are_checked_and_inputs_are_served(tmp_path: Path) -> None:
    write(tmp_path / "train.parquet", {
        "inputs": rows(0, 2), "labels": rows(1, 2), "position_ids": [[0, 1, 2, 3]] * 2,
        "sequence_lengths": [[4], [2, 2]]})
    provider = PreprocessedDataProvider(tmp_path, SEQ)
    assert (await provider.fetch(0, 1)).tolist() == rows(0, 2)


async def test_a_train_directory_takes_all_its_files(tmp_path: Path) -> None:
    split = tmp_path / "default" / "train"
    split.mkdir(parents=True)
    write(split / "0000.parquet", {"inputs": rows(0, 2)})
    write(split / "0001.parquet", {"inputs": rows(2, 2)})
    assert [f.name for f in train_files(split)] == ["0000.parquet", "0001.parquet"]
    provider = await open_provider(PreprocessedDataLocation(source=str(split)), SEQ)
    assert provider.num_sequences == 4


async def test_fixed_size_lists_and_small_integer_types(tmp_path: Path) -> None:
    inputs = pa.FixedSizeListArray.from_arrays(pa.array(range(8), pa.uint16()), SEQ)
    write(tmp_path / "train.parquet", {"inputs": inputs})
    provider = PreprocessedDataProvider(tmp_path, SEQ)
    assert (await provider.fetch(0, 1)).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]


def one_line_error(directory: Path, *fetch: int) -> str:
    with pytest.raises(DataProviderError) as info:
        provider = PreprocessedDataProvider(directory, SEQ)
        if fetch:
            provider.get_samples(*fetch)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_a_missing_inputs_column(tmp_path: Path) -> None:
    write(tmp_path / "train.parquet", {"tokens": rows(0, 2)})
    assert one_line_error(tmp_path).endswith("train.parquet: no `inputs` column")


@pytest.mark.parametrize(("column", "values"), [
    ("inputs", [[0.5] * SEQ, [1.5] * SEQ]),
    ("inputs", [1, 2]),
    ("inputs", [["a"] * SEQ, ["b"] * SEQ]),
    ("labels", [[0.5] * SEQ, [1.5] * SEQ]),
])
def test_a_column_of_the_wrong_type(tmp_path: Path, column: str, values: list[Any]) -> None:
    columns = {"inputs": rows(0, 2), column: values}
    write(tmp_path / "train.parquet", columns)
    assert f"column `{column}` has type" in one_line_error(tmp_path)
    assert "expected a list of integers" in one_line_error(tmp_path)


@pytest.mark.parametrize(("column", "values", "message"), [
    ("inputs", [[1] * SEQ, [1] * (SEQ + 1)], "`inputs` has length 5 instead of 4 (row 1"),
    ("labels", [[1] * 3, [1] * SEQ], "`labels` has length 3 instead of 4 (row 0"),
    ("inputs", [[1] * SEQ, None], "column `inputs` has a null row"),
    ("inputs", [[1] * SEQ, [1, None, 1, 1]], "column `inputs` has a null value"),
])
def test_bad_rows_fail_their_fetch(tmp_path: Path, column: str, values: list[Any],
                                   message: str) -> None:
    columns = {"inputs": rows(0, 2), column: values}
    write(tmp_path / "train.parquet", columns)
    assert message in one_line_error(tmp_path, 0, 1)


@pytest.mark.parametrize(("start", "end", "message"), [
    (0, 7, r"batch id [0, 7] out of range: the data set has 7 sequences"),
    (3, 1, "bad batch id [3, 1]"),
])
def test_bad_batch_ids(tmp_path: Path, start: int, end: int, message: str) -> None:
    write(tmp_path / "train.parquet", {"inputs": rows(0, 7)})
    assert message in one_line_error(tmp_path, start, end)


def test_directories_without_train_data(tmp_path: Path) -> None:
    assert "does not exist" in one_line_error(tmp_path / "missing")
    assert "has no *.parquet files" in one_line_error(tmp_path)
    write(tmp_path / "data.parquet", {"inputs": rows(0, 1)})
    assert "has no train split" in one_line_error(tmp_path)
    (tmp_path / "train.parquet").write_bytes(b"not parquet at all")
    assert "not a readable parquet file" in one_line_error(tmp_path)


def test_empty_files(tmp_path: Path) -> None:
    write(tmp_path / "train.parquet", {"inputs": pa.array([], pa.list_(pa.int32()))})
    assert "has no rows" in one_line_error(tmp_path)


def test_a_source_that_is_no_directory_is_a_hub_dataset(tmp_path: Path, monkeypatch: Any) -> None:
    snapshot = tmp_path / "snapshot"
    (snapshot / "data").mkdir(parents=True)
    write(snapshot / "data" / "train-00000-of-00001.parquet", {"inputs": rows(0, 2)})
    asked: list[dict[str, Any]] = []

    def fake_download(**kw: Any) -> str:
        asked.append(kw)
        return str(snapshot)

    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    assert resolve_source("org/dataset") == snapshot / "data"
    assert asked[0]["repo_id"] == "org/dataset" and asked[0]["repo_type"] == "dataset"
    assert PreprocessedDataProvider(resolve_source("org/dataset"), SEQ).num_sequences == 2


def test_bad_sources(tmp_path: Path) -> None:
    with pytest.raises(DataProviderError, match="does not exist"):
        resolve_source(str(tmp_path / "missing"))
    file = tmp_path / "a.parquet"
    file.write_bytes(b"")
    with pytest.raises(DataProviderError, match="does not exist"):
        resolve_source(str(file))
    with pytest.raises(DataProviderError, match="neither a directory nor a Hugging Face"):
        resolve_source("not a repo id!!")


def test_an_unavailable_hub_dataset_is_a_one_line_error(monkeypatch: Any) -> None:
    import huggingface_hub

    def offline(**kw: Any) -> str:
        raise OSError("cannot reach the hub\nand the cache has no snapshot")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(DataProviderError) as info:
        resolve_source("org/dataset")
    assert str(info.value) == ("Hugging Face dataset 'org/dataset' unavailable: cannot reach "
                               "the hub and the cache has no snapshot")
