"""The settings a trainer declares in its result's header so that its followers can replay
it in them (docs/verification.md, "Declared replay settings").

An honest replay on another machine is not exact: another micro-batch split, thread count,
attention kernel or matmul library rounds bf16 gradients differently, and the momentum
keeps the difference (bench/verification_noise.py measures each source). These are the
settings a follower can match; a replay in all of them is judged with the tight limits of
verification/followers.py, any other with the loose ones.

    compute        "fp32" | "bf16": the forward/backward dtype
    device         "cpu" | "cuda"
    attention      "auto" (torch's own choice on the device) | "math" | "flash" |
                   "efficient" | "cudnn": the SDPA kernel the trainer pinned
    onednn         oneDNN (mkldnn) kernels on: CPUs with bf16 support take bf16 matmuls
                   there, others (and mkldnn off) take ATen's own
    micro_batch    sequences per forward/backward (>= 1)
    threads        torch intra-op threads (0 on a GPU, where they change nothing)
    torch_version  the torch build (a follower cannot switch it, only notice it differs)
    hardware       what picks the kernels' code paths: on a CPU ATen's vector width and
                   whether oneDNN has bf16 kernels there ("AVX512 onednn-bf16"), on a GPU
                   its name (a follower cannot switch it either)

Wire (the section after distro_wire's fixed header when its flag bit 2 is set):

    length varint (of the rest) | compute u8 | device u8 | attention u8 | onednn u8
    | micro_batch varint | threads varint | torch_version | hardware
      (each text: length u8, printable ASCII)

Replay class (`replay_class_of`, issue 36): the u16 a client joins the run with, a hash of
every field above, so that the coordinator elects a trainer's followers among clients that
train in its very settings (coordinator/verification.py): same class means same settings,
and a follower of a trainer's own class replays it in its own settings with the tight limits
from the trainer's first epoch, before any result of it declared anything
(verification/followers.py). Every field changes a replay's numbers (bench/
verification_noise.py): threads only on a CPU (a GPU's kernels do not depend on the host's
thread count, so the class writes 0 there). 0 means none; a 16-bit hash collides (1 in
65,536 per pair of distinct settings), and followers fail a trainer of their class whose
declaration is not theirs.

Decoding accepts only what `encode_settings` writes: known codes, onednn 0 or 1,
micro_batch >= 1, printable texts of 1 to 64 characters, and exactly `length` bytes.
Anything else is a ValueError naming the problem (distro_wire turns it into its
ResultDecodeError): a malformed section is refused, never half-read.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

COMPUTES = ("fp32", "bf16")
DEVICES = ("cpu", "cuda")
ATTENTIONS = ("auto", "math", "flash", "efficient", "cudnn")
MAX_VERSION_CHARS = 64
MAX_SECTION_BYTES = 4 + 2 * 10 + 2 * (1 + MAX_VERSION_CHARS)


@dataclass(frozen=True)
class ReplaySettings:
    compute: str
    device: str
    attention: str
    onednn: bool
    micro_batch: int
    threads: int
    torch_version: str
    hardware: str

    def __post_init__(self) -> None:
        for name, allowed in (("compute", COMPUTES), ("device", DEVICES),
                              ("attention", ATTENTIONS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"replay settings: {name} {getattr(self, name)!r} is not one "
                                 f"of {', '.join(allowed)}")
        if self.micro_batch < 1:
            raise ValueError(f"replay settings: micro_batch {self.micro_batch} < 1")
        if self.threads < 0:
            raise ValueError(f"replay settings: threads {self.threads} < 0")
        for name in ("torch_version", "hardware"):
            text = getattr(self, name)
            if not (0 < len(text) <= MAX_VERSION_CHARS and text.isascii()
                    and text.isprintable()):
                raise ValueError(f"replay settings: {name} {text!r} is not 1 to "
                                 f"{MAX_VERSION_CHARS} printable ASCII characters")

    def describe(self) -> str:
        """One line, for events and reports."""
        threads = f" {self.threads} threads" if self.device == "cpu" else ""
        return (f"{self.compute} {self.device}{threads} micro-batch {self.micro_batch} "
                f"attention {self.attention} onednn {'on' if self.onednn else 'off'} "
                f"torch {self.torch_version} on {self.hardware}")

    def differences(self, other: ReplaySettings) -> list[str]:
        """The fields where `other` differs, as `name self -> other`."""
        return [f"{name} {getattr(self, name)} -> {getattr(other, name)}"
                for name in self.__dataclass_fields__
                if getattr(self, name) != getattr(other, name)]


def replay_class_text(settings: ReplaySettings) -> str:
    """What the replay class hashes: every field that changes a replay's numbers,
    device|torch_version|hardware|compute|attention|onednn (1 or 0)|micro_batch|threads,
    threads 0 unless the device is a CPU (a GPU's numbers do not depend on them)."""
    threads = settings.threads if settings.device == "cpu" else 0
    return (f"{settings.device}|{settings.torch_version}|{settings.hardware}|{settings.compute}"
            f"|{settings.attention}|{int(settings.onednn)}|{settings.micro_batch}|{threads}")


def replay_class_of_text(text: str) -> int:
    """The first 2 bytes (u16, little-endian) of SHA-256(text), 1 where that is 0 (0 is
    "no class")."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:2], "little") or 1


def replay_class_of(settings: ReplaySettings) -> int:
    """The class of the clients that train in exactly `settings` (the module docstring):
    the hash of `replay_class_text`."""
    return replay_class_of_text(replay_class_text(settings))


def encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def encode_settings(settings: ReplaySettings) -> bytes:
    """The section, with its length prefix."""
    texts = b"".join(bytes([len(text)]) + text.encode("ascii")
                     for text in (settings.torch_version, settings.hardware))
    body = (bytes([COMPUTES.index(settings.compute), DEVICES.index(settings.device),
                   ATTENTIONS.index(settings.attention), int(settings.onednn)])
            + encode_varint(settings.micro_batch) + encode_varint(settings.threads) + texts)
    return encode_varint(len(body)) + body


def decode_settings_body(body: bytes) -> ReplaySettings:
    """The section's bytes after its length prefix; ValueError for anything
    encode_settings does not write."""
    if len(body) < 8:
        raise ValueError(f"replay settings: {len(body)} bytes, at least 8 expected")
    codes = body[:4]
    fields = []
    for (name, allowed), code in zip((("compute", COMPUTES), ("device", DEVICES),
                                      ("attention", ATTENTIONS)), codes, strict=False):
        if code >= len(allowed):
            raise ValueError(f"replay settings: unknown {name} code {code}")
        fields.append(allowed[code])
    if codes[3] > 1:
        raise ValueError(f"replay settings: onednn byte {codes[3]}, expected 0 or 1")
    position = 4
    numbers = []
    for name in ("micro_batch", "threads"):
        value, position = read_varint(body, position, name)
        numbers.append(value)
    version, position = read_text(body, position, "torch version")
    hardware, position = read_text(body, position, "hardware")
    if position != len(body):
        raise ValueError(f"replay settings: {len(body) - position} bytes after the hardware")
    return ReplaySettings(compute=fields[0], device=fields[1], attention=fields[2],
                          onednn=bool(codes[3]), micro_batch=numbers[0], threads=numbers[1],
                          torch_version=version, hardware=hardware)


def read_text(data: bytes, position: int, what: str) -> tuple[str, int]:
    """(an ASCII text of length u8 + bytes, position after it)."""
    if position >= len(data):
        raise ValueError(f"replay settings: truncated before the {what}")
    length = data[position]
    raw = data[position + 1:position + 1 + length]
    if len(raw) != length:
        raise ValueError(f"replay settings: {what} of {length} bytes, {len(raw)} left")
    try:
        return raw.decode("ascii"), position + 1 + length
    except UnicodeDecodeError:
        raise ValueError(f"replay settings: the {what} is not ASCII") from None


def read_varint(data: bytes, position: int, what: str) -> tuple[int, int]:
    """(value, position after it); canonical encodings of at most 10 bytes only."""
    value = 0
    for shift in range(0, 70, 7):
        if position >= len(data):
            raise ValueError(f"replay settings: truncated {what}")
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if byte == 0 and shift:
                raise ValueError(f"replay settings: over-long varint for {what}")
            return value, position
    raise ValueError(f"replay settings: {what} varint longer than 10 bytes")
