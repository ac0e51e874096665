import os
import stat
from pathlib import Path

import iroh
import pytest
from typer.testing import CliRunner

from client_image.cli import app
from psyche_common.identity import Identity, IdentityError, sign, verify

runner = CliRunner()


def test_secret_key_file_gives_the_same_public_key_as_iroh(tmp_path: Path) -> None:
    secret = os.urandom(32)
    (tmp_path / "secret.key").write_bytes(secret)
    identity = Identity.from_file(tmp_path / "secret.key")
    assert identity.public_key == iroh.SecretKey.from_bytes(secret).public().to_bytes()


def test_signatures_verify_with_our_helper_and_with_iroh() -> None:
    identity = Identity.generate()
    signature = sign(identity, b"witness step 7")
    assert verify(identity.public_key, b"witness step 7", signature)
    assert not verify(identity.public_key, b"witness step 8", signature)
    assert not verify(Identity.generate().public_key, b"witness step 7", signature)
    assert not verify(identity.public_key[:31], b"witness step 7", signature)
    iroh.EndpointId.from_bytes(identity.public_key).verify(
        b"witness step 7", iroh.Signature.from_bytes(signature)
    )


def test_hex_env_matches_file(tmp_path: Path) -> None:
    secret = os.urandom(32)
    (tmp_path / "k").write_bytes(secret)
    from_env = Identity.load(environ={"RAW_IDENTITY_SECRET_KEY": secret.hex()})
    assert from_env.public_key == Identity.load(tmp_path / "k").public_key
    assert Identity.load(environ={}).public_key != from_env.public_key  # fresh key


@pytest.mark.parametrize(
    ("content", "message"),
    [(b"short", "exactly 32 raw bytes"), (b"x" * 33, "holds 33")],
)
def test_bad_key_files_are_named(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.key"
    path.write_bytes(content)
    with pytest.raises(IdentityError, match=message):
        Identity.from_file(path)
    with pytest.raises(IdentityError, match="cannot read"):
        Identity.from_file(tmp_path / "missing.key")


@pytest.mark.parametrize(
    ("text", "message"), [("ab", "64 hex digits"), ("zz" * 32, "not hexadecimal")]
)
def test_bad_hex_is_named(text: str, message: str) -> None:
    with pytest.raises(IdentityError, match=message):
        Identity.from_hex(text)


def test_cli_show_identity_from_file_and_env_in_psyches_format(tmp_path: Path) -> None:
    secret = os.urandom(32)
    path = tmp_path / "secret.key"
    path.write_bytes(secret)
    # Psyche's print_identity_keys (shared/client/src/cli.rs): both keys, hex.
    expected = f"Public key: {Identity(secret).node_id}\nSecret key: {secret.hex()}\n"
    result = runner.invoke(app, ["show-identity", "--identity-secret-key-path", str(path)], env={})
    assert result.exit_code == 0, result.output
    assert result.output == expected
    result = runner.invoke(app, ["show-identity"], env={"RAW_IDENTITY_SECRET_KEY": secret.hex()})
    assert result.exit_code == 0, result.output
    assert result.output == expected
    result = runner.invoke(app, ["show-identity", "--public-key-only"],
                           env={"RAW_IDENTITY_SECRET_KEY": secret.hex()})
    assert result.output == f"{Identity(secret).node_id}\n"


def test_cli_psyches_static_p2p_identity_commands(tmp_path: Path) -> None:
    path = tmp_path / "p2p.key"
    created = runner.invoke(app, ["create-static-p2p-identity", str(path)], env={})
    assert created.exit_code == 0, created.output
    secret = path.read_bytes()
    assert len(secret) == 32 and stat.S_IMODE(path.stat().st_mode) == 0o600
    keys = f"Public key: {Identity(secret).node_id}\nSecret key: {secret.hex()}\n"
    assert created.output == f"{keys}Wrote secret key to {path}\n"
    shown = runner.invoke(app, ["show-static-p2p-identity", str(path)], env={})
    assert shown.exit_code == 0 and shown.output == keys
    shown = runner.invoke(app, ["show-static-p2p-identity"], env={"RAW_IDENTITY_SECRET_KEY": secret.hex()})
    assert shown.exit_code == 0 and shown.output == keys


def test_cli_create_static_p2p_identity_never_overwrites(tmp_path: Path) -> None:
    path = tmp_path / "p2p.key"
    path.write_bytes(b"precious")
    result = runner.invoke(app, ["create-static-p2p-identity", str(path)], env={})
    assert result.exit_code == 1
    assert result.output == f"error: {path} exists; refusing to overwrite an identity\n"
    assert path.read_bytes() == b"precious"
    result = runner.invoke(app, ["create-static-p2p-identity", str(tmp_path / "no" / "dir.key")], env={})
    assert result.exit_code == 1 and result.output.startswith("error: cannot create")


def test_cli_show_identity_errors_are_clear(tmp_path: Path) -> None:
    (tmp_path / "bad").write_bytes(b"123")
    for command in (["show-identity", "--identity-secret-key-path"], ["show-static-p2p-identity"]):
        result = runner.invoke(app, [*command, str(tmp_path / "bad")], env={})
        assert result.exit_code == 2
        assert "exactly 32 raw bytes" in result.output and "Traceback" not in result.output
    result = runner.invoke(app, ["show-identity"], env={"RAW_IDENTITY_SECRET_KEY": ""})
    assert result.exit_code == 2
    assert "no identity given" in result.output
    result = runner.invoke(app, ["show-static-p2p-identity"], env={"RAW_IDENTITY_SECRET_KEY": "zz"})
    assert result.exit_code == 2
    assert result.output == "error: RAW_IDENTITY_SECRET_KEY must be 64 hex digits, got 2 characters\n"
