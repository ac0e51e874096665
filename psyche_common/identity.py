"""Node identity: one Ed25519 key names the node on iroh and signs its messages.

Sources, in Psyche's order of precedence: a file of 32 raw secret bytes
(``openssl rand 32 > secret.key``), the ``RAW_IDENTITY_SECRET_KEY`` environment
variable (64 hex digits), else a fresh random key. The secret is the standard
Ed25519 seed, so ``cryptography`` (used here to sign and verify) and iroh's
``SecretKey`` derive the same 32-byte public key, the node id.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

SECRET_KEY_BYTES = 32
PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64
RAW_SECRET_KEY_ENV = "RAW_IDENTITY_SECRET_KEY"


class IdentityError(ValueError):
    """A secret key file or value that cannot be used as a node identity."""


@dataclass(frozen=True)
class Identity:
    """An Ed25519 key pair; ``public_key`` (32 bytes) is the node id."""

    secret_key: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if len(self.secret_key) != SECRET_KEY_BYTES:
            raise IdentityError(
                f"an identity secret key is {SECRET_KEY_BYTES} bytes, got {len(self.secret_key)}"
            )

    @classmethod
    def generate(cls) -> Identity:
        return cls(os.urandom(SECRET_KEY_BYTES))

    @classmethod
    def from_hex(cls, text: str) -> Identity:
        cleaned = text.strip()
        if len(cleaned) != 2 * SECRET_KEY_BYTES:
            raise IdentityError(
                f"{RAW_SECRET_KEY_ENV} must be {2 * SECRET_KEY_BYTES} hex digits, got {len(cleaned)} characters"
            )
        try:
            return cls(bytes.fromhex(cleaned))
        except ValueError as error:
            raise IdentityError(f"{RAW_SECRET_KEY_ENV} is not hexadecimal: {error}") from None

    @classmethod
    def from_file(cls, path: Path | str) -> Identity:
        path = Path(path)
        try:
            raw = path.read_bytes()
        except OSError as error:
            raise IdentityError(f"cannot read identity secret key file {path}: {error}") from None
        if len(raw) != SECRET_KEY_BYTES:
            raise IdentityError(
                f"identity secret key file {path} must hold exactly {SECRET_KEY_BYTES} raw bytes "
                f"(e.g. `openssl rand 32 > {path.name}`), it holds {len(raw)}"
            )
        return cls(raw)

    @classmethod
    def load(
        cls, path: Path | str | None = None, environ: Mapping[str, str] | None = None
    ) -> Identity:
        """File if given, else ``RAW_IDENTITY_SECRET_KEY`` if set, else a fresh key."""
        if path is not None:
            return cls.from_file(path)
        environ = os.environ if environ is None else environ
        raw_hex = environ.get(RAW_SECRET_KEY_ENV, "")
        if raw_hex.strip():
            return cls.from_hex(raw_hex)
        return cls.generate()

    @property
    def _private(self) -> Ed25519PrivateKey:
        return Ed25519PrivateKey.from_private_bytes(self.secret_key)

    @property
    def public_key(self) -> bytes:
        return self._private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    @property
    def node_id(self) -> str:
        """The public key in hex, as iroh prints an EndpointId."""
        return self.public_key.hex()

    def sign(self, message: bytes) -> bytes:
        return self._private.sign(message)


def sign(identity: Identity, message: bytes) -> bytes:
    """64-byte Ed25519 signature of ``message``."""
    return identity.sign(message)


def verify(public_key: bytes, message: bytes, signature: bytes) -> bool:
    """True iff ``signature`` is ``public_key``'s signature of ``message``; never raises."""
    if len(public_key) != PUBLIC_KEY_BYTES or len(signature) != SIGNATURE_BYTES:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True
