"""The airdrop subcommands: the distributor program's Merkle airdrops with linear vesting
(psyche_solana.distributor).

    airdrop-create   --allocations FILE --collateral-mint MINT   (CSV or JSON; writes the
                     proofs file, prints the root; funds the vault unless --no-fund)
    airdrop-claim    --proofs FILE                               (redeems what has vested)
    airdrop-update   --airdrop-id N [--allocations FILE] [--freeze | --unfreeze]
                     [--metadata TEXT]                           (the authority; new
                     allocations get a new root and proofs file, the vault topped up)
    airdrop-withdraw --airdrop-id N                              (the authority claws back)
    airdrop-show     --airdrop-id N [--proofs FILE]              (JSON)

An allocations file has one recipient per row (CSV with a header) or object (JSON: a list,
or {"allocations": [...]}), with `claimer` (base-58 key), `amount` (token units, scaled by
the mint's decimals), `vesting_start` (unix seconds or ISO 8601 with a time zone),
`vesting_duration` (seconds; 0 = all at once) and an optional `nonce` (default 0).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from datetime import datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated, Any

import typer

from run_manager.commands.solana_common import (
    EXIT_BAD_ARGUMENT,
    LOCALNET_URL,
    Rpc,
    Rpc2,
    Wallet,
    fail,
    parse_amount,
    parse_pubkey,
    run_rpc,
    signing_keypair,
    with_websocket_options,
)

AIRDROP_PANEL = "Airdrops (distributor program)"
FIELDS = ("claimer", "amount", "vesting_start", "vesting_duration")
AirdropId = Annotated[int, typer.Option("--airdrop-id", min=0, max=2**64 - 1,
                                        help="The airdrop's id (airdrop-create prints it).")]
ProofsFile = Annotated[Path, typer.Option(
    "--proofs", help="The proofs file airdrop-create wrote.")]


class BadInput(ValueError):
    """A bad allocations or proofs file, named with its place in one line."""


def _integer(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise BadInput(f"{what} must be an integer, got {value!r}")
    try:
        return int(value)
    except ValueError:
        raise BadInput(f"{what} must be an integer, got {value!r}") from None


def _timestamp(value: Any, what: str) -> int:
    if isinstance(value, str) and not value.strip().lstrip("-").isdigit():
        try:
            moment = datetime.fromisoformat(value.strip())
        except ValueError:
            raise BadInput(f"{what} is neither unix seconds nor ISO 8601: {value!r}") from None
        if moment.tzinfo is None:
            raise BadInput(f"{what} needs a time zone (e.g. {value}+00:00)")
        return int(moment.timestamp())
    return _integer(value, what)


def _units(value: Any, decimals: int, what: str) -> int:
    try:
        amount = Decimal(str(value).strip())
    except InvalidOperation:
        raise BadInput(f"{what} is not a number: {value!r}") from None
    scaled = amount.scaleb(decimals) if amount.is_finite() else amount
    if not amount.is_finite() or amount < 0 or scaled != scaled.to_integral_value() \
            or scaled >= 2**64:
        raise BadInput(f"{what} must be >= 0, below 2^64 base units, with at most {decimals} "
                       f"decimals, got {value!r}")
    return int(scaled)


def read_allocations(path: Path, decimals: int) -> list[Any]:
    """The allocations of a CSV or JSON file (by its content), amounts in base units."""
    from psyche_solana.merkle import Allocation, Vesting

    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise BadInput(f"{path}: cannot read: {error}") from None
    rows: list[tuple[str, Any]]
    if text.lstrip().startswith(("[", "{")):
        try:
            loaded = json.loads(text)
        except json.JSONDecodeError as error:
            raise BadInput(f"{path}: not valid JSON: {error}") from None
        if isinstance(loaded, dict):
            loaded = loaded.get("allocations")
        if not isinstance(loaded, list):
            raise BadInput(f"{path}: JSON must be a list of allocations or "
                           '{"allocations": [...]}')
        rows = [(f"{path} item {i}", row) for i, row in enumerate(loaded)]
    else:
        reader = csv.DictReader(io.StringIO(text))
        missing = [f for f in FIELDS if f not in (reader.fieldnames or [])]
        if missing:
            raise BadInput(f"{path}: CSV header lacks {', '.join(missing)} "
                           f"(needs {','.join(FIELDS)}[,nonce])")
        rows = [(f"{path} line {reader.line_num}", row) for row in reader]
    allocations, seen = [], set()
    for where, row in rows:
        if not isinstance(row, dict) or any(row.get(f) in (None, "") for f in FIELDS):
            raise BadInput(f"{where}: needs {', '.join(FIELDS)}")
        claimer = str(row["claimer"]).strip()
        try:
            from solders.pubkey import Pubkey

            key = bytes(Pubkey.from_string(claimer))
        except ValueError:
            raise BadInput(f"{where}: claimer {claimer!r} is not a base-58 public key") from None
        nonce = _integer(row.get("nonce") or 0, f"{where}: nonce")
        try:
            allocation = Allocation(key, nonce, Vesting(
                _timestamp(row["vesting_start"], f"{where}: vesting_start"),
                _integer(row["vesting_duration"], f"{where}: vesting_duration"),
                _units(row["amount"], decimals, f"{where}: amount")))
        except BadInput:
            raise
        except ValueError as error:
            raise BadInput(f"{where}: {error}") from None
        if (key, nonce) in seen:
            raise BadInput(f"{where}: claimer {claimer} with nonce {nonce} appears twice "
                           "(give its allocations different nonces)")
        seen.add((key, nonce))
        allocations.append(allocation)
    if not allocations:
        raise BadInput(f"{path}: no allocations")
    return allocations


def proofs_json(airdrop_id: int, mint: Any, decimals: int, allocations: list[Any]) -> dict[str, Any]:
    from solders.pubkey import Pubkey

    from psyche_solana import distributor as dist
    from psyche_solana.ids import distributor_program
    from psyche_solana.merkle import MerkleTree

    tree = MerkleTree([a.leaf() for a in allocations])
    return {"program": str(distributor_program()), "airdrop_id": airdrop_id,
            "airdrop": str(dist.airdrop_address(airdrop_id)), "collateral_mint": str(mint),
            "decimals": decimals, "merkle_root": tree.root.hex(),
            "allocations": [{"claimer": str(Pubkey.from_bytes(a.claimer)), "nonce": a.nonce,
                             "vesting_start": a.vesting.start_unix_timestamp,
                             "vesting_duration": a.vesting.duration_seconds,
                             "amount": a.vesting.end_collateral_amount,
                             "proof": [node.hex() for node in tree.proof(i)]}
                            for i, a in enumerate(allocations)]}


def read_proofs(path: Path) -> tuple[int, list[Any]]:
    """(airdrop id, proven allocations) of a proofs file."""
    from solders.pubkey import Pubkey

    from psyche_solana.distributor import ProvenAllocation
    from psyche_solana.merkle import Allocation, Vesting

    try:
        loaded = json.loads(path.read_text())
        airdrop_id = _integer(loaded["airdrop_id"], "airdrop_id")
        lines = [ProvenAllocation(Allocation(
            bytes(Pubkey.from_string(e["claimer"])), _integer(e["nonce"], "nonce"),
            Vesting(_integer(e["vesting_start"], "vesting_start"),
                    _integer(e["vesting_duration"], "vesting_duration"),
                    _integer(e["amount"], "amount"))),
            [bytes.fromhex(node) for node in e["proof"]]) for e in loaded["allocations"]]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError,
            ValueError) as error:
        raise BadInput(f"{path}: not a proofs file written by airdrop-create "
                       f"({type(error).__name__}: {error})") from None
    return airdrop_id, lines


def _program_errors(work: Any) -> Any:
    """`work` with each on-chain refusal saying it came through the distributor (the
    message names the program that failed: ours, or e.g. the token program it invoked)."""
    from psyche_solana.rpc import ProgramError

    async def wrapped(client: Any) -> Any:
        try:
            return await work(client)
        except ProgramError as error:
            text = str(error)
            raise ValueError(text if text.startswith("distributor") else
                             f"distributor: {text}") from None
    return wrapped


def _bad_input(error: BadInput) -> typer.Exit:
    return fail(str(error), EXIT_BAD_ARGUMENT)


def airdrop_create(
        allocations: Annotated[Path, typer.Option(
            "--allocations", help="CSV (header claimer,amount,vesting_start,vesting_duration"
                                  "[,nonce]) or JSON list of the same keys.")],
        collateral_mint: Annotated[str, typer.Option(help="The SPL token mint airdropped.")],
        airdrop_id: Annotated[int | None, typer.Option(
            "--airdrop-id", min=0, max=2**64 - 1,
            help="Default: the first 8 bytes of the Merkle root.")] = None,
        proofs_out: Annotated[Path | None, typer.Option(
            help="Where to write the proofs (default airdrop-<id>-proofs.json).")] = None,
        fund: Annotated[bool, typer.Option(
            help="Move the allocations' total into the vault from your token account.")] = True,
        metadata: Annotated[str, typer.Option(help="Up to 300 bytes kept on chain.")] = "",
        wallet: Wallet = None, rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None) -> None:
    """Create an airdrop (you are its authority) from a file of allocations."""
    from psyche_solana import distributor as dist
    from psyche_solana.merkle import MerkleTree
    from psyche_solana.runs import mint_decimals

    authority = signing_keypair(wallet)
    mint = parse_pubkey(collateral_mint, "--collateral-mint")
    if len(metadata.encode()) > dist.METADATA_SIZE:
        raise fail(f"--metadata is {len(metadata.encode())} bytes, at most 300", EXIT_BAD_ARGUMENT)

    async def decimals_of(client: Any) -> int:
        return await mint_decimals(client, mint)

    decimals = run_rpc(rpc, rpc_2, None, decimals_of)
    try:
        lines = read_allocations(allocations, decimals)
    except BadInput as error:
        raise _bad_input(error) from None
    root = MerkleTree([a.leaf() for a in lines]).root
    chosen = dist.default_airdrop_id(root) if airdrop_id is None else airdrop_id
    total = sum(a.vesting.end_collateral_amount for a in lines)

    async def work(client: Any) -> None:
        await dist.create_and_fund(client, authority, chosen, mint, root,
                                   total if fund else 0, decimals, metadata.encode())

    run_rpc(rpc, rpc_2, None, _program_errors(work))
    out = proofs_out or Path(f"airdrop-{chosen}-proofs.json")
    out.write_text(json.dumps(proofs_json(chosen, mint, decimals, lines), indent=1) + "\n")
    typer.echo(f"merkle root {root.hex()}")
    typer.echo(f"airdrop {chosen} at {dist.airdrop_address(chosen)}: {len(lines)} allocations, "
               f"{total} base units{' funded' if fund else ' (vault not funded)'}; proofs in {out}")


def airdrop_claim(
        proofs: ProofsFile,
        nonce: Annotated[int | None, typer.Option(
            help="Which of your allocations (default: the only one).")] = None,
        amount: Annotated[str | None, typer.Option(
            help="In token units (default: all that has vested and is unclaimed).")] = None,
        wallet: Wallet = None, rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None) -> None:
    """Claim what has vested of your allocation in an airdrop."""
    from psyche_solana import distributor as dist
    from psyche_solana.runs import mint_decimals

    claimer = signing_keypair(wallet)
    try:
        airdrop_id, lines = read_proofs(proofs)
    except BadInput as error:
        raise _bad_input(error) from None
    mine = [line for line in lines if line.claimer == claimer.pubkey()
            and (nonce is None or line.allocation.nonce == nonce)]
    if len(mine) != 1:
        found = "no allocation" if not mine else "several allocations (pick one with --nonce)"
        raise fail(f"distributor: {found} for {claimer.pubkey()} in {proofs}", EXIT_BAD_ARGUMENT)

    async def work(client: Any) -> int:
        airdrop = await dist.load_airdrop(client, airdrop_id)
        base = None if amount is None else parse_amount(
            amount, await mint_decimals(client, airdrop.collateral_mint), "--amount")
        return await dist.redeem(client, claimer, airdrop_id, mine[0], base)

    sent = run_rpc(rpc, rpc_2, None, _program_errors(work))
    typer.echo(f"claimed {sent} base units from airdrop {airdrop_id}")


def airdrop_update(
        airdrop_id: AirdropId,
        allocations: Annotated[Path | None, typer.Option(
            "--allocations", help="New allocations (as airdrop-create's): a new Merkle root "
                                  "and proofs file.")] = None,
        proofs_out: Annotated[Path | None, typer.Option(
            help="Where to write the new proofs (default airdrop-<id>-proofs.json).")] = None,
        fund: Annotated[bool, typer.Option(
            help="With --allocations: top the vault up to what they still owe (their total "
                 "less what was claimed) from your token account.")] = True,
        freeze: Annotated[bool | None, typer.Option(
            "--freeze/--unfreeze", help="Stop or allow claims.")] = None,
        metadata: Annotated[str | None, typer.Option(help="Up to 300 bytes kept on chain.")] = None,
        wallet: Wallet = None, rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None) -> None:
    """Change an airdrop's allocations, claim freeze or metadata (its authority only)."""
    from psyche_solana import distributor as dist
    from psyche_solana.merkle import MerkleTree
    from psyche_solana.runs import mint_decimals

    if allocations is None and freeze is None and metadata is None:
        raise fail("airdrop-update: nothing to change (give --allocations, --freeze or "
                   "--unfreeze, or --metadata)", EXIT_BAD_ARGUMENT)
    if metadata is not None and len(metadata.encode()) > dist.METADATA_SIZE:
        raise fail(f"--metadata is {len(metadata.encode())} bytes, at most 300", EXIT_BAD_ARGUMENT)
    authority = signing_keypair(wallet)

    async def airdrop_mint(client: Any) -> tuple[Any, int]:
        airdrop = await dist.load_airdrop(client, airdrop_id)
        return airdrop.collateral_mint, await mint_decimals(client, airdrop.collateral_mint)

    mint, decimals = run_rpc(rpc, rpc_2, None, airdrop_mint)
    lines, root, total = None, None, None
    if allocations is not None:
        try:
            lines = read_allocations(allocations, decimals)
        except BadInput as error:
            raise _bad_input(error) from None
        root = MerkleTree([a.leaf() for a in lines]).root
        total = sum(a.vesting.end_collateral_amount for a in lines)

    async def work(client: Any) -> int:
        return await dist.update(client, authority, airdrop_id, freeze, root,
                                 None if metadata is None else metadata.encode(),
                                 total if fund else None, decimals)

    topped_up = run_rpc(rpc, rpc_2, None, _program_errors(work))
    changed = []
    if lines is not None and root is not None:
        out = proofs_out or Path(f"airdrop-{airdrop_id}-proofs.json")
        out.write_text(json.dumps(proofs_json(airdrop_id, mint, decimals, lines), indent=1) + "\n")
        typer.echo(f"merkle root {root.hex()}")
        changed.append(f"{len(lines)} allocations of {total} base units, proofs in {out}"
                       + (f", vault topped up by {topped_up}" if fund else ""))
    if freeze is not None:
        changed.append("claims frozen" if freeze else "claims allowed")
    if metadata is not None:
        changed.append("metadata set")
    typer.echo(f"airdrop {airdrop_id} updated: {'; '.join(changed)}")


def airdrop_withdraw(
        airdrop_id: AirdropId,
        amount: Annotated[str | None, typer.Option(
            help="In token units (default: all the vault holds).")] = None,
        wallet: Wallet = None, rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None) -> None:
    """Claw back unclaimed tokens from an airdrop's vault (its authority only)."""
    from psyche_solana import distributor as dist
    from psyche_solana.runs import mint_decimals

    authority = signing_keypair(wallet)

    async def work(client: Any) -> int:
        airdrop = await dist.load_airdrop(client, airdrop_id)
        base = None if amount is None else parse_amount(
            amount, await mint_decimals(client, airdrop.collateral_mint), "--amount")
        return await dist.withdraw(client, authority, airdrop_id, base)

    sent = run_rpc(rpc, rpc_2, None, _program_errors(work))
    typer.echo(f"withdrew {sent} base units from airdrop {airdrop_id} to {authority.pubkey()}")


def airdrop_show(airdrop_id: AirdropId,
                 proofs: Annotated[Path | None, typer.Option(
                     "--proofs", help="Add each allocation's vested and claimed amounts.")] = None,
                 rpc: Rpc = LOCALNET_URL, rpc_2: Rpc2 = None) -> None:
    """Print an airdrop's on-chain state as JSON."""
    from psyche_solana import distributor as dist

    lines: list[Any] = []
    if proofs is not None:
        try:
            proofs_id, lines = read_proofs(proofs)
        except BadInput as error:
            raise _bad_input(error) from None
        if proofs_id != airdrop_id:
            raise fail(f"{proofs} is for airdrop {proofs_id}, not {airdrop_id}", EXIT_BAD_ARGUMENT)

    async def work(client: Any) -> dict[str, Any]:
        airdrop = await dist.load_airdrop(client, airdrop_id)
        now = await dist.cluster_time(client)
        shown: dict[str, Any] = {
            "address": str(dist.airdrop_address(airdrop_id)), "id": airdrop.id,
            "authority": str(airdrop.authority), "collateral_mint": str(airdrop.collateral_mint),
            "merkle_root": airdrop.merkle_root.hex(), "claim_freeze": airdrop.claim_freeze,
            "metadata": airdrop.metadata.decode(errors="replace"),
            "total_claimed_collateral_amount": airdrop.total_claimed_collateral_amount,
            "vault": {"address": str(dist.vault_address(airdrop_id, airdrop.collateral_mint)),
                      "amount": await dist.vault_balance(client, airdrop)},
            "unix_timestamp": now}
        if proofs is not None:
            entries = []
            for line in lines:
                claimed = await dist.claimed_amount(client, airdrop_id, line.claimer,
                                                    line.allocation.nonce)
                vested = line.allocation.vesting.vested(now)
                entries.append({"claimer": str(line.claimer), "nonce": line.allocation.nonce,
                                "amount": line.allocation.vesting.end_collateral_amount,
                                "vested": vested, "claimed": claimed or 0,
                                "claimable": max(0, vested - (claimed or 0))})
            shown["allocations"] = entries
        return shown

    typer.echo(json.dumps(run_rpc(rpc, rpc_2, None, work), indent=2))


COMMANDS: dict[str, Callable[..., None]] = {
    "airdrop-create": airdrop_create, "airdrop-claim": airdrop_claim,
    "airdrop-update": airdrop_update, "airdrop-withdraw": airdrop_withdraw,
    "airdrop-show": airdrop_show}


def register(app: typer.Typer) -> None:
    for name, function in COMMANDS.items():
        app.command(name, rich_help_panel=AIRDROP_PANEL)(with_websocket_options(function))
