"""Wallets: new / show / balance, against a real JSON-RPC server backed by LiteSVM."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from rpc_server import litesvm_rpc
from solders.keypair import Keypair
from solders.litesvm import LiteSVM
from typer.testing import CliRunner

from psyche_common.wallet import WalletError, create_keypair_file, get_balance, public_key
from run_manager.cli import app

runner = CliRunner()


def test_wallet_new_writes_a_solana_keygen_file_with_mode_600(tmp_path: Path) -> None:
    path = tmp_path / "id.json"
    result = runner.invoke(app, ["wallet", "new", str(path)])
    assert result.exit_code == 0, result.output
    values = json.loads(path.read_text())
    assert len(values) == 64 and all(0 <= v <= 255 for v in values)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    keypair = Keypair.from_json(path.read_text())  # what solana-keygen files load with
    assert str(keypair.pubkey()) in result.output


def test_wallet_new_refuses_to_overwrite(tmp_path: Path) -> None:
    path = tmp_path / "id.json"
    path.write_text("precious")
    result = runner.invoke(app, ["wallet", "new", str(path)])
    assert result.exit_code != 0
    assert "refusing to overwrite" in result.output
    assert path.read_text() == "precious"


def test_wallet_show_prints_the_base58_public_key(tmp_path: Path) -> None:
    keypair = Keypair()
    path = tmp_path / "k.json"
    path.write_text(keypair.to_json())
    for flag in ("--wallet", "-w", "--wallet-private-key-path"):  # as the Solana subcommands
        result = runner.invoke(app, ["wallet", "show", flag, str(path)])
        assert result.exit_code == 0, result.output
        assert result.output.strip() == str(keypair.pubkey())


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("not json", "nor a base58 keypair"),
        ("[1, 2", "is not JSON"),
        ("[1, 2, 3]", "JSON array of 64 bytes"),
        ("3yZe7d", "decodes to 4 bytes; a base58 keypair is 64"),
        (json.dumps([300] * 64), "JSON array of 64 bytes"),
        (json.dumps(list(bytes(Keypair())[:32]) + [0] * 32), "does not match"),
    ],
)
def test_bad_wallet_files_are_named_and_explained(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(WalletError, match=expected):
        public_key(path)
    result = runner.invoke(app, ["wallet", "show", "--wallet", str(path)])
    assert result.exit_code != 0 and expected in result.output


def test_wallet_balance_asks_a_real_rpc_server(tmp_path: Path) -> None:
    path = tmp_path / "id.json"
    address = create_keypair_file(path)
    svm = LiteSVM()
    from solders.pubkey import Pubkey

    svm.airdrop(Pubkey.from_string(address), 2_500_000_000)
    with litesvm_rpc(svm) as url:
        assert get_balance(url, address) == 2_500_000_000
        result = runner.invoke(app, ["wallet", "balance", "--rpc", url, "--wallet", str(path)])
        assert result.exit_code == 0, result.output
        assert "2.500000000 SOL" in result.output
        # An account the SVM never saw holds nothing.
        other = str(Keypair().pubkey())
        assert get_balance(url, other) == 0
        with pytest.raises(WalletError, match="RPC error -32602"):
            get_balance(url, "not-a-key")


def test_wallet_balance_reports_an_unreachable_rpc() -> None:
    with pytest.raises(WalletError, match="unreachable"):
        get_balance("http://127.0.0.1:9", str(Keypair().pubkey()), timeout_s=2)


def test_a_base58_keypair_is_read_as_psyches_run_manager_reads_it(tmp_path: Path) -> None:
    """Psyche's run-manager takes the wallet file's text as it takes RAW_WALLET_PRIVATE_KEY:
    a JSON array or the base58 string of the 64 bytes (tools/rust-tools/run-manager)."""
    from psyche_common.wallet import parse_keypair_text
    from psyche_solana.b58 import b58encode

    keypair = Keypair()
    path = tmp_path / "k.b58"
    path.write_text(f"{keypair}\n")
    assert public_key(path) == str(keypair.pubkey())
    assert parse_keypair_text(str(keypair), "X") == parse_keypair_text(keypair.to_json(), "X")
    mismatched = b58encode(bytes(keypair)[:32] + bytes(Keypair())[32:])
    with pytest.raises(WalletError, match="public key half does not match"):
        parse_keypair_text(mismatched, "RAW_WALLET_PRIVATE_KEY")
    with pytest.raises(WalletError, match="89 base58 digits"):
        parse_keypair_text("2" * 89, "X")
