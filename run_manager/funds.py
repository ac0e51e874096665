"""This wallet's mining pools and airdrops, for the TUI's "Pools & airdrops" panel and its
claim action (psyche_solana.mining_pool, psyche_solana.distributor).

    funds = WalletFunds([RPC, RPC_2], keypair, proofs="airdrop-5-proofs.json,drops/")
    status = await funds.status()               # FundsStatus: pools, airdrops, notes
    sent = await funds.claim(stake, amount)     # exactly `amount` base units; the balance after
    await funds.close()

Pools: a Lender account holds no user or pool field (Psyche's layout: bump, deposited,
claimed), so no memcmp filter finds a wallet's lenders. Instead every Pool account of the
mining pool program is listed (getProgramAccounts, filtered by size and discriminator),
and this wallet's Lender PDA of each (["Lender", pool, user]) is read in one
getMultipleAccounts: the pools listed are those where it exists.

Airdrops: an allocation is known only from the proofs file `airdrop-create` (or
`airdrop-update`) wrote (the chain keeps the Merkle root alone); the setting AIRDROP_PROOFS
names them: one file, several separated by commas, or directories (their *.json files
that are proofs files). Each allocation of this wallet is listed once, by (airdrop,
nonce): a stale proofs file of an updated airdrop gives way to the one matching its
root. Without any the panel says so. Every figure is read afresh at each call, in base units of the mint.
Every failure is `FundsUnavailable`, one line naming the program and what went wrong.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from solders.keypair import Keypair
from solders.pubkey import Pubkey

from psyche_solana import distributor as dist
from psyche_solana import mining_pool as mp
from psyche_solana.distributor import ProvenAllocation
from psyche_solana.ids import mining_pool_program
from psyche_solana.instructions import (
    associated_token_address,
    create_associated_token_account,
    token_amount,
)
from psyche_solana.merkle import verify
from psyche_solana.rpc import ProgramError, RpcError, SolanaRpc, multiple_account_data

PROOFS_SETTING = "AIRDROP_PROOFS"


class FundsUnavailable(Exception):
    """The pools or airdrops could not be read or claimed; the message is one line."""


@dataclass(frozen=True)
class PoolStake:
    """This wallet as a lender of mining pool `index` (amounts in base units)."""
    index: int
    collateral_mint: Pubkey
    collateral_decimals: int
    deposited: int
    pool_deposited: int  # all lenders' deposits
    share: int  # what this lender may claim in all, claimed included (its share of the rewards)
    claimed: int
    claimable: int
    claiming_enabled: bool
    frozen: bool
    redeemable_mint: Pubkey | None  # the reward mint, once claims are enabled
    redeemable_decimals: int

    @property
    def key(self) -> str:
        return f"pool:{self.index}"

    @property
    def why_nothing(self) -> str:
        """Why nothing is claimable (when nothing is)."""
        if self.frozen:
            return "pool frozen"
        if not self.claiming_enabled:
            return "claims not enabled"
        return "share all claimed"


@dataclass(frozen=True)
class AirdropStake:
    """One allocation of this wallet in airdrop `airdrop_id` (amounts in base units)."""
    airdrop_id: int
    line: ProvenAllocation
    mint: Pubkey
    decimals: int
    vested: int
    claimed: int
    frozen: bool

    @property
    def key(self) -> str:
        return f"airdrop:{self.airdrop_id}:{self.nonce}"

    @property
    def nonce(self) -> int:
        return self.line.allocation.nonce

    @property
    def allocated(self) -> int:
        return self.line.allocation.vesting.end_collateral_amount

    @property
    def claimable(self) -> int:
        return 0 if self.frozen else max(0, self.vested - self.claimed)

    @property
    def why_nothing(self) -> str:
        if self.frozen:
            return "claims frozen"
        if self.vested == 0:
            return "nothing vested yet"
        return "all vested is claimed"


Stake = PoolStake | AirdropStake


@dataclass
class FundsStatus:
    pools: list[PoolStake] = field(default_factory=list)
    airdrops: list[AirdropStake] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # e.g. no proofs file set

    def stakes(self) -> list[Stake]:
        """The pools, then the airdrop's allocations: the panel's rows."""
        pools: list[Stake] = [*self.pools]
        return [*pools, *self.airdrops]


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _refusal(error: ProgramError) -> str:
    """One line naming the program that refused (the innermost one that failed logs
    first: ours, or the token program it invoked) and what to do."""
    failed = next((line.split()[1] for line in error.logs
                   if line.startswith("Program ") and " failed: " in line), None)
    if error.code is not None and failed == str(mining_pool_program()):
        return f"mining pool program error {error.code}: {mp.describe(error.code)}"
    return _first_line(error)


def proofs_paths(setting: str | Path | None) -> list[Path]:
    """The paths AIRDROP_PROOFS names, in its order: one, or several separated by commas
    (blank entries ignored)."""
    if setting is None:
        return []
    return [Path(part.strip()) for part in str(setting).split(",") if part.strip()]


def read_proofs_files(setting: str | Path | None
                      ) -> tuple[list[tuple[Path, int, list[ProvenAllocation]]], list[str]]:
    """([(file, airdrop id, its proven allocations)], one-line notes) of the files and
    directories AIRDROP_PROOFS names. A named file that is missing or not a proofs file is
    a note; in a directory, the *.json files that are not proofs files (allocation files,
    say) are passed over in one note."""
    found: list[tuple[Path, int, list[ProvenAllocation]]] = []
    notes: list[str] = []
    for path in proofs_paths(setting):
        if not path.is_dir():
            try:
                found.append((path, *read_proofs_file(path)))
            except ValueError as error:
                notes.append(str(error))
            continue
        passed_over, before = [], len(found)
        for candidate in sorted(path.glob("*.json")):
            try:
                found.append((candidate, *read_proofs_file(candidate)))
            except ValueError:
                passed_over.append(candidate.name)
        if len(found) == before and not passed_over:
            notes.append(f"{PROOFS_SETTING}: {path} holds no *.json proofs file")
        elif passed_over:
            notes.append(f"{PROOFS_SETTING}: {path}: not proofs files, passed over: "
                         f"{', '.join(passed_over)}")
    return found, notes


def read_proofs_file(path: Path) -> tuple[int, list[ProvenAllocation]]:
    """(airdrop id, its proven allocations) of a proofs file; ValueError in one line."""
    from run_manager.commands.airdrop import BadInput, read_proofs

    if not path.is_file():
        raise ValueError(f"{PROOFS_SETTING}={path}: no such file")
    try:
        return read_proofs(path)
    except BadInput as error:
        raise ValueError(f"{PROOFS_SETTING}={error}") from None


class WalletFunds:
    def __init__(self, rpc_urls: Sequence[str | None], wallet: Keypair,
                 proofs: str | Path | None = None) -> None:
        """`proofs`: AIRDROP_PROOFS (a file, several separated by commas, directories)."""
        self.wallet = wallet
        self.proofs = proofs
        self._rpc_urls = list(rpc_urls)
        self._rpc: SolanaRpc | None = None
        self._decimals: dict[Pubkey, int] = {}

    def _client(self) -> SolanaRpc:
        # One client for the app's lifetime, made on first use: on the TUI's event loop.
        if self._rpc is None:
            self._rpc = SolanaRpc(self._rpc_urls, retries=1)
        return self._rpc

    async def close(self) -> None:
        if self._rpc is not None:
            await self._rpc.close()
            self._rpc = None

    async def _mint_decimals(self, rpc: SolanaRpc, mint: Pubkey) -> int:
        if mint not in self._decimals:  # a mint's decimals never change
            data = await rpc.account_data(mint)
            if data is None or len(data) < 45:
                raise ValueError(f"{mint} is not an SPL token mint")
            self._decimals[mint] = data[44]
        return self._decimals[mint]

    async def _token_amount(self, rpc: SolanaRpc, address: Pubkey) -> int:
        data = await rpc.account_data(address)
        return 0 if data is None else token_amount(data)

    # ------------------------------------------------------------------ reading
    async def status(self) -> FundsStatus:
        rpc = self._client()
        try:
            status = FundsStatus(pools=await self._pools(rpc))
            await self._airdrops(rpc, status)
        except (RpcError, ValueError) as error:
            raise FundsUnavailable(f"pools and airdrops: {_first_line(error)}") from None
        return status

    async def _pools(self, rpc: SolanaRpc) -> list[PoolStake]:
        found = await rpc.program_accounts(mining_pool_program(), mp.POOL_SPACE,
                                           [(0, mp.POOL_DISCRIMINATOR)])
        pools = sorted((mp.decode_pool(data) for _, data in found), key=lambda p: p.index)
        me = self.wallet.pubkey()
        lenders = await multiple_account_data(
            rpc, [mp.lender_address(mp.pool_address(p.index), me) for p in pools])
        stakes = []
        for pool, data in zip(pools, lenders, strict=True):
            if data is None:
                continue  # this wallet never deposited here
            lender = mp.decode_lender(data)
            redeemable = pool.redeemable_mint if pool.claiming_enabled else None
            vault = 0 if redeemable is None else await self._token_amount(
                rpc, associated_token_address(mp.pool_address(pool.index), redeemable))
            stakes.append(PoolStake(
                pool.index, pool.collateral_mint,
                await self._mint_decimals(rpc, pool.collateral_mint),
                lender.deposited_collateral_amount, pool.total_deposited_collateral_amount,
                mp.lender_share(pool, lender, vault), lender.claimed_redeemable_amount,
                mp.claimable_now(pool, lender, vault), pool.claiming_enabled, pool.freeze,
                redeemable,
                0 if redeemable is None else await self._mint_decimals(rpc, redeemable)))
        return stakes

    async def _airdrops(self, rpc: SolanaRpc, status: FundsStatus) -> None:
        if not proofs_paths(self.proofs):
            status.notes.append(f"airdrops: no proofs file set ({PROOFS_SETTING}=the file "
                                "airdrop-create wrote)")
            return
        files, notes = read_proofs_files(self.proofs)
        status.notes.extend(f"airdrops: {note}" for note in notes)
        me = self.wallet.pubkey()
        mine = [(path, airdrop_id, line) for path, airdrop_id, lines in files
                for line in lines if line.claimer == me]
        if files and not mine:
            status.notes.append("airdrops: this wallet has no allocation in "
                                f"{', '.join(path.name for path, _, _ in files)}")
            return
        airdrops: dict[int, dist.Airdrop | None] = {}
        listed: set[tuple[int, int]] = set()
        mismatched: dict[tuple[int, int], str] = {}
        now = await dist.cluster_time(rpc) if mine else 0
        for path, airdrop_id, line in mine:
            if airdrop_id not in airdrops:
                data = await rpc.account_data(dist.airdrop_address(airdrop_id))
                airdrops[airdrop_id] = None if data is None else dist.decode_airdrop(data)
                if data is None:
                    status.notes.append(f"airdrops: airdrop {airdrop_id} of {path.name} is not "
                                        "on this cluster")
            airdrop, nonce = airdrops[airdrop_id], line.allocation.nonce
            if airdrop is None or (airdrop_id, nonce) in listed:
                continue  # an older or a copied proofs file of the same allocation
            if not verify(airdrop.merkle_root, line.allocation.leaf(), line.proof):
                mismatched.setdefault((airdrop_id, nonce), path.name)
                continue
            listed.add((airdrop_id, nonce))
            claimed = await dist.claimed_amount(rpc, airdrop_id, me, nonce)
            status.airdrops.append(AirdropStake(
                airdrop_id, line, airdrop.collateral_mint,
                await self._mint_decimals(rpc, airdrop.collateral_mint),
                line.allocation.vesting.vested(now), claimed or 0, airdrop.claim_freeze))
        for (airdrop_id, nonce), name in mismatched.items():
            if (airdrop_id, nonce) not in listed:  # no other file had its current proof
                status.notes.append(f"airdrops: the proof of nonce {nonce} in {name} does not "
                                    f"match airdrop {airdrop_id}'s Merkle root")

    # ------------------------------------------------------------------ claiming
    async def claim(self, stake: Stake, amount: int) -> int:
        """Claims exactly `amount` base units of `stake` (what the confirmation showed:
        more may be claimable by now, and stays so); the wallet's token balance after."""
        what = (f"mining pool {stake.index}" if isinstance(stake, PoolStake)
                else f"airdrop {stake.airdrop_id}")
        if amount <= 0:
            raise FundsUnavailable(f"claim from {what}: {amount} base units: nothing to claim")
        rpc, me = self._client(), self.wallet.pubkey()
        try:
            if isinstance(stake, PoolStake):
                if stake.redeemable_mint is None:
                    raise ValueError("the pool's authority has not enabled claims yet")
                mint = stake.redeemable_mint
                await rpc.send_instructions([
                    create_associated_token_account(me, me, mint),
                    mp.lender_claim(me, stake.index, mint, amount)], self.wallet)
            else:
                mint = stake.mint
                await dist.redeem(rpc, self.wallet, stake.airdrop_id, stake.line, amount)
            return await self._token_amount(rpc, associated_token_address(me, mint))
        except ProgramError as error:
            raise FundsUnavailable(f"claim from {what}: {_refusal(error)}") from None
        except (RpcError, ValueError) as error:
            raise FundsUnavailable(f"claim from {what}: {_first_line(error)}") from None
