"""Where a run's training data comes from: the `data_location` variants
(docs/run-config.md, "The [model.LLM] table").

Externally tagged like the other run-config enums (see `config_variants`): `{ Server =
"host:port" }`, `{ Local = "dir" }`, `{ Http = { location = { SingleUrl = ... }, ... } }`.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Annotated, Any, ClassVar

from pydantic import Field, Strict, field_serializer, field_validator

from coordinator.config_variants import (
    U8,
    U32,
    ExternallyTagged,
    StrictStr,
    Variant,
    max_bytes,
)
from coordinator.limits import URL_MAX_BYTES


class TokenSize(Enum):
    """Width of one token in the raw data files (little-endian)."""

    TwoBytes = 2
    FourBytes = 4

    @property
    def nbytes(self) -> int:
        return self.value


def _token_size(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return TokenSize[value]
        except KeyError:
            raise ValueError(f"expected TwoBytes or FourBytes, got {value!r}") from None
    if isinstance(value, TokenSize):
        return value
    raise ValueError(f"expected TwoBytes or FourBytes, got {value!r}")


class _Url(Variant):
    @staticmethod
    def check_url(value: str) -> str:
        max_bytes(URL_MAX_BYTES)(value)
        if not re.match(r"^[a-z][a-z0-9+.-]*://\S+$", value):
            raise ValueError(f"must be an absolute URL (scheme://...), got {value!r}")
        return value


class SingleUrl(_Url):
    TAG: ClassVar[str] = "SingleUrl"
    NEWTYPE: ClassVar[str | None] = "url"
    url: StrictStr

    _url = field_validator("url")(_Url.check_url)


class UrlList(_Url):
    """Our extension: several files by explicit URL, in order."""

    TAG: ClassVar[str] = "UrlList"
    NEWTYPE: ClassVar[str | None] = "urls"
    urls: Annotated[list[StrictStr], Field(min_length=1)]

    _urls = field_validator("urls")(lambda urls: [_Url.check_url(url) for url in urls])


class NumberedFiles(_Url):
    """Files url_template.format(zero_padded(start_index + i)) for i < num_files."""

    TAG: ClassVar[str] = "NumberedFiles"
    url_template: StrictStr
    start_index: U32
    n_left_pad_zeros: U8
    num_files: Annotated[int, Strict(), Field(gt=0, le=2**32 - 1)]

    @field_validator("url_template")
    @classmethod
    def _one_placeholder(cls, value: str) -> str:
        if value.count("{}") != 1:
            raise ValueError(f'must contain exactly one "{{}}", got {value!r}')
        return _Url.check_url(value)


class GcpBucket(Variant):
    TAG: ClassVar[str] = "Gcp"
    bucket_name: Annotated[StrictStr, Field(min_length=1)]
    filter_directory: StrictStr = ""


HttpLocation = SingleUrl | UrlList | NumberedFiles | GcpBucket
HTTP_LOCATION = ExternallyTagged(SingleUrl, UrlList, NumberedFiles, GcpBucket)


class DontShuffle(Variant):
    TAG: ClassVar[str] = "DontShuffle"
    UNIT: ClassVar[bool] = True


class SeededShuffle(Variant):
    """Shuffle the sequences with ChaCha8 seeded by these 32 bytes."""

    TAG: ClassVar[str] = "Seeded"
    NEWTYPE: ClassVar[str | None] = "seed"
    seed: bytes

    @field_validator("seed", mode="before")
    @classmethod
    def _seed_bytes(cls, value: Any) -> bytes:
        return seed_bytes(value)

    @field_serializer("seed")
    def _seed_list(self, seed: bytes) -> list[int]:
        return list(seed)


def seed_bytes(value: Any) -> bytes:
    """A 32-byte seed from TOML's list of 32 integers 0..255 (or bytes)."""
    if isinstance(value, bytes | bytearray) or (
        isinstance(value, list)
        and all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= 255 for x in value)
    ):
        raw = bytes(value)
    else:
        raise ValueError("must be a list of 32 integers in 0..255")
    if len(raw) != 32:
        raise ValueError(f"must have exactly 32 bytes, got {len(raw)}")
    return raw


Shuffle = DontShuffle | SeededShuffle
SHUFFLE = ExternallyTagged(DontShuffle, SeededShuffle)


class DummyDataLocation(Variant):
    TAG: ClassVar[str] = "Dummy"
    UNIT: ClassVar[bool] = True


class ServerDataLocation(Variant):
    """The coordinator's TCP data server, "host:port"."""

    TAG: ClassVar[str] = "Server"
    NEWTYPE: ClassVar[str | None] = "address"
    address: StrictStr

    @field_validator("address")
    @classmethod
    def _host_port(cls, value: str) -> str:
        max_bytes(URL_MAX_BYTES)(value)
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f'must be "host:port" with a port in 1..65535, got {value!r}')
        return value


class LocalDataLocation(Variant):
    TAG: ClassVar[str] = "Local"
    NEWTYPE: ClassVar[str | None] = "path"
    path: Annotated[StrictStr, Field(min_length=1)]


class HttpDataLocation(Variant):
    TAG: ClassVar[str] = "Http"
    location: Annotated[HttpLocation, HTTP_LOCATION]
    token_size_in_bytes: TokenSize
    shuffle: Annotated[Shuffle, SHUFFLE]

    _token = field_validator("token_size_in_bytes", mode="before")(_token_size)

    @field_serializer("token_size_in_bytes")
    def _token_name(self, value: TokenSize) -> str:
        return value.name


class WeightedHttpDataLocation(Variant):
    """URL of a JSON file {shuffle, providers: [[location, weight], ...]}."""

    TAG: ClassVar[str] = "WeightedHttp"
    NEWTYPE: ClassVar[str | None] = "url"
    url: Annotated[StrictStr, Field(min_length=1)]


class PreprocessedDataLocation(Variant):
    """A directory or HF dataset of parquet files with an `inputs` column."""

    TAG: ClassVar[str] = "Preprocessed"
    NEWTYPE: ClassVar[str | None] = "source"
    source: Annotated[StrictStr, Field(min_length=1)]


DataLocation = (
    DummyDataLocation
    | ServerDataLocation
    | LocalDataLocation
    | HttpDataLocation
    | WeightedHttpDataLocation
    | PreprocessedDataLocation
)
DATA_LOCATION = ExternallyTagged(
    DummyDataLocation, ServerDataLocation, LocalDataLocation, HttpDataLocation,
    WeightedHttpDataLocation, PreprocessedDataLocation,
)
