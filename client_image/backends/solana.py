"""The client's Solana backend: the same interface as `TcpBackend`, over our programs.

    backend = SolanaBackend(SolanaBackendOptions(rpc=[RPC, RPC_2], ws_rpc=[WS_RPC, WS_RPC_2],
                            wallet=keypair, run_id=..., p2p_address=node.address.to_string()))
    await backend.run(on_state, on_error, stop)   # delivers ServerState(state, p2p, time)
    await backend.send_witness(RoundWitness(...)) # -> a witness transaction

What it does:
- follows the coordinator account over Solana's PubSub WebSocket (`accountSubscribe`,
  psyche_solana.subscription: WS_RPC, then WS_RPC_2; slow JSON-RPC polling while none
  answers) and delivers each new `CoordinatorState` with the P2P addresses of the run's
  clients (read from the coordinator's p2p-address directory);
- joins: when this key's registry entry is not pending for the next epoch, it sends
  join_run (with the first valid authorization: AUTHORIZER's, its own, or the
  permissionless one, and the client's `replay_class`, which the follow plan groups
  followers by); no valid authorization is fatal (`BackendRejected`);
- ticks: every `check_interval_s` (and at each state change) it runs the coordinator's
  `tick` locally on a copy of the state, without any RPC call. When that would change the
  phase or step, the tick is due, and who sends it is a pure function of the state
  (`tick_order`): the run's keys ordered by SHA-256(phase, key), where the phase is
  (run state, step, epoch, the phase's start time); the first sends at once, the r-th only
  after r * `tick_grace_s` and only if the phase has not moved meanwhile (an earlier one's
  tick landed), at most one per `min_tick_interval_s`. Within one phase a key's moment is
  never brought forward: a join or a witness changes the account but not the phase, and
  when the order was drawn per account change, a join landing while the first one's tick
  was in flight put another key first, which sent at once (8 ticks for 7 moves under
  load). Each duplicate costs its sender a fee, and a random backoff let several send on
  a loaded machine; with the order, a second tick needs the first in line to be gone or
  slower than the grace.
The typed port (`base.py`) maps each domain message of `coordinator.messages` to its
instruction: a warm-up witness, a round witness, a health check (one transaction per
trainer), a checkpoint report, a verification report (signed by this key, the reporter);
a withdrawal has no on-chain form (a leaving client is dropped by the health checks). An
on-chain refusal is reported to `on_error` as a `Refusal` carrying the program error's
name.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import hashlib
import logging
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass

from solders.instruction import Instruction
from solders.keypair import Keypair
from solders.pubkey import Pubkey

from client_image.backends.base import (
    BackendRejected,
    ErrorCallback,
    ServerState,
    StateCallback,
)
from coordinator import Coordinator, NodeIdentity
from coordinator.messages import (
    CheckpointReport,
    HealthCheck,
    Refusal,
    RoundWitness,
    WarmupWitness,
)
from coordinator.state import VerificationReport
from psyche_solana import instructions as ix
from psyche_solana.accounts import AccountDecodeError, CoordinatorAccount, decode_coordinator
from psyche_solana.rpc import (
    NONCE_SLICE,
    ProgramError,
    RpcError,
    SolanaRpc,
    multiple_account_data,
)
from psyche_solana.runs import RunNotFound, find_run, read_authorization
from psyche_solana.subscription import AccountSubscription, ws_urls_for

log = logging.getLogger(__name__)


@dataclass
class SolanaBackendOptions:
    rpc: Sequence[str | None]          # RPC, then the fallbacks RPC_2 and RPC_3
    wallet: Keypair                    # signs; its public key is the client's identity
    run_id: str
    p2p_address: str
    client_version: str = ""
    authorizer: Pubkey | None = None   # AUTHORIZER: join as a delegate of this grantee
    # WS_RPC, WS_RPC_2: PubSub endpoints beside rpc; a missing one is derived from its RPC
    ws_rpc: Sequence[str | None] = ()
    check_interval_s: float = 0.25     # local join / tick checks (no RPC call)
    fallback_poll_s: float = 1.0       # JSON-RPC polling while no WebSocket answers
    # a due tick waits this long for each key ahead of ours in `tick_order` (its landing,
    # seen over the WebSocket, takes well under this on a loaded localnet)
    tick_grace_s: float = 2.0
    min_tick_interval_s: float = 0.5
    find_run_timeout_s: float = 120.0
    # the client's replay class (client_image/formats/replay_settings.py replay_class_of),
    # sent with join_run: the follow plan groups followers by it; 0 = none
    replay_class: int = 0


def tick_phase(account: CoordinatorAccount) -> bytes:
    """What a due tick moves on from: (run state u8, step u32, epoch u16, the phase's start
    u64), little-endian; before the run has a state, the account's nonce (u64)."""
    state = account.state
    if state is None:
        return account.nonce.to_bytes(8, "little")
    return struct.pack("<BIHQ", int(state.run_state), state.progress.step,
                       state.progress.epoch, state.run_state_start_unix_timestamp or 0)


def tick_order(account: CoordinatorAccount) -> list[bytes]:
    """Who sends a due tick first, second, ...: the keys of the epoch's clients and of the
    pending joiners, ordered by SHA-256(tick_phase, key). A pure function of the account,
    so every client computes the same order, and a new one at every phase."""
    keys = {bytes(key) for key in account.pending}
    if account.state is not None:
        keys.update(client.id.key for client in account.state.epoch_state.clients)
    phase = tick_phase(account)
    return sorted(keys, key=lambda key: hashlib.sha256(phase + key).digest())


def tick_place(account: CoordinatorAccount, key: bytes) -> int:
    """`key`'s place in `tick_order`; a key outside it (an observer) comes after all."""
    order = tick_order(account)
    return order.index(key) if key in order else len(order)


@dataclasses.dataclass
class DueTick:
    """A tick due in `phase` (tick_phase): first seen due at `seen`, ours to send at
    `moment` (monotonic seconds)."""

    phase: bytes
    seen: float
    moment: float


class SolanaBackend:
    def __init__(self, options: SolanaBackendOptions):
        self.options = options
        self.me = NodeIdentity(bytes(options.wallet.pubkey()))
        self.rpc = SolanaRpc(options.rpc)
        self.address: Pubkey | None = None
        self.account: CoordinatorAccount | None = None
        self.authorization: Pubkey | None = None
        self.connected = asyncio.Event()
        self.peers: dict[str, str] = {}
        self._on_error: ErrorCallback | None = None
        self._joined_for: int | None = None
        self._last_tick = 0.0
        self.subscription: AccountSubscription | None = None
        self._state_changed = asyncio.Event()
        self._tick_due: DueTick | None = None
        self.ticks_sent = 0

    # ---------------------------------------------------------------- setup
    async def _find(self, stop: asyncio.Event) -> Pubkey:
        deadline = time.monotonic() + self.options.find_run_timeout_s
        while not stop.is_set():
            try:
                run = await find_run(self.rpc, self.options.run_id)
                return run.address
            except (RunNotFound, AccountDecodeError, RpcError) as exc:
                if time.monotonic() > deadline:
                    raise BackendRejected(f"run {self.options.run_id!r}: {exc}") from None
                log.warning("waiting for run %r: %s", self.options.run_id, exc)
                await asyncio.sleep(1.0)
        raise asyncio.CancelledError

    async def _authorization(self, account: CoordinatorAccount) -> Pubkey:
        user = self.options.wallet.pubkey()
        grantees = [g for g in (self.options.authorizer, user, Pubkey.default()) if g is not None]
        for grantee in grantees:
            found = await read_authorization(self.rpc, account.join_authority, grantee)
            if found is not None and found.is_valid_for(user):
                return ix.authorization_address(account.join_authority, grantee)
        raise BackendRejected(
            f"NotAuthorized: no active join authorization from {account.join_authority} covers "
            f"{user} (ask the run's join authority, or set AUTHORIZER to your grantee)")

    async def _transact(self, instructions: list[Instruction]) -> bool:
        try:
            await self.rpc.send_instructions(instructions, self.options.wallet)
            return True
        except ProgramError as exc:
            log.info("transaction refused: %s", exc)
            if self._on_error is not None:
                self._on_error(Refusal(error=exc.name, detail=str(exc)))
            return False
        except RpcError as exc:
            log.warning("transaction not sent: %s", exc)
            return False

    # ---------------------------------------------------------------- loop
    async def run(self, on_state: StateCallback, on_error: ErrorCallback,
                  stop: asyncio.Event) -> None:
        self._on_error = on_error
        try:
            self.address = await self._find(stop)
            data = await self.rpc.account_data(self.address)
            assert data is not None
            self.authorization = await self._authorization(decode_coordinator(data))
            await self._transact([ix.set_p2p_address(self.address, self.options.wallet.pubkey(),
                                                     self.options.p2p_address)])
            self.connected.set()
            self.subscription = AccountSubscription(
                self.rpc, ws_urls_for(self.options.rpc, self.options.ws_rpc), self.address,
                fallback_poll_s=self.options.fallback_poll_s, poll_slice=NONCE_SLICE)
            follower = asyncio.create_task(self._follow(self.subscription, on_state))
            try:
                while not stop.is_set() and not follower.done():
                    try:
                        await self._maybe_join()
                        await self._maybe_tick()
                    except (RpcError, AccountDecodeError) as exc:
                        log.warning("solana backend: %s", exc)
                    await self._wait(stop)
                if follower.done():
                    follower.result()  # its failure is this backend's
            finally:
                follower.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await follower
        finally:
            self.connected.clear()
            await self.rpc.close()

    async def _follow(self, subscription: AccountSubscription, on_state: StateCallback) -> None:
        async for data in subscription.changes():
            try:
                await self._deliver(data, on_state)
            except (RpcError, AccountDecodeError) as exc:
                log.warning("solana backend: %s", exc)
            self._state_changed.set()

    async def _wait(self, stop: asyncio.Event) -> None:
        """Until the next check: a state change, the due tick's moment, or check_interval_s."""
        timeout = self.options.check_interval_s
        if self._tick_due is not None:
            timeout = max(0.0, min(timeout, self._tick_due.moment - time.monotonic()))
        waits = [asyncio.ensure_future(stop.wait()),
                 asyncio.ensure_future(self._state_changed.wait())]
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waits:
                waiter.cancel()
        self._state_changed.clear()

    async def _deliver(self, data: bytes, on_state: StateCallback) -> None:
        account = decode_coordinator(data)
        self.account = account
        if account.state is None:
            return  # not configured yet
        await self._learn_addresses(account)
        await on_state(ServerState(account.state, dict(self.peers), int(time.time())))

    async def _learn_addresses(self, account: CoordinatorAccount) -> None:
        assert self.address is not None and account.state is not None
        keys = {c.id.key for c in account.state.epoch_state.clients}
        keys |= {bytes(k) for k, _ in account.registry}
        missing = [k for k in keys if k.hex() not in self.peers and k != self.me.key]
        if not missing:
            return
        found = await multiple_account_data(
            self.rpc, [ix.p2p_address_account(self.address, Pubkey(k)) for k in missing])
        for key, entry in zip(missing, found, strict=True):
            address = ix.decode_p2p_address(entry) if entry else None
            if address:
                self.peers[key.hex()] = address

    async def _maybe_join(self) -> None:
        account = self.account
        if account is None or account.state is None or self.address is None:
            return
        mine = dict(account.registry).get(self.options.wallet.pubkey())
        if account.next_active in (mine, self._joined_for):
            return
        if account.run_state.name == "Finished":
            return
        self._joined_for = account.next_active
        assert self.authorization is not None
        if not await self._transact([ix.join_run(self.address, self.options.wallet.pubkey(),
                                                 self.authorization, self.options.replay_class)]):
            self._joined_for = None

    def tick_would_change(self, account: CoordinatorAccount, now: int) -> bool:
        """Run the coordinator's tick on a copy: would it move the phase or the step?"""
        state = account.state
        if state is None or state.run_state.halted:
            return False
        simulated = Coordinator(copy.deepcopy(state))
        pending = [NodeIdentity(bytes(k)) for k in account.pending]
        # with the joiners' classes: a warm-up lists (and counts) only the eligible ones
        simulated.tick(pending, now, 0, account.pending_replay_classes())
        after = simulated.state
        return (after.run_state != state.run_state or after.progress.step != state.progress.step
                or after.progress.epoch != state.progress.epoch)

    async def _maybe_tick(self) -> None:
        """Send the due tick after our place in `tick_order` times the grace, unless the
        phase moved meanwhile: then an earlier key's tick landed, and the new phase is
        judged afresh."""
        account = self.account
        if account is None or self.address is None:
            return
        if not self.tick_would_change(account, int(time.time())):
            self._tick_due = None
            return
        now = time.monotonic()
        phase = tick_phase(account)
        place = tick_place(account, bytes(self.options.wallet.pubkey()))
        if self._tick_due is None or self._tick_due.phase != phase:
            self._tick_due = DueTick(phase, now, now + place * self.options.tick_grace_s)
            return
        # A key that joined ahead of ours in this phase's order makes our moment later;
        # nothing makes it earlier, as the key first before may have its tick in flight.
        due = self._tick_due
        due.moment = max(due.moment, due.seen + place * self.options.tick_grace_s)
        if now < due.moment or now - self._last_tick < self.options.min_tick_interval_s:
            return
        self._last_tick = now
        # Not again in this phase before a grace: the tick's landing can take longer than
        # min_tick_interval_s to be seen (a loaded machine), and a resend is a duplicate.
        due.moment = now + self.options.tick_grace_s
        self.ticks_sent += 1
        await self._transact(ix.tick_with_budget(self.address))

    # ---------------------------------------------------------------- the typed port
    async def send_witness(self, witness: RoundWitness) -> bool:
        if self.address is None:
            return False
        me = self.options.wallet.pubkey()
        return await self._transact([ix.witness(self.address, me, witness.witness)])

    async def send_warmup_witness(self, witness: WarmupWitness) -> bool:
        if self.address is None:
            return False
        me = self.options.wallet.pubkey()
        return await self._transact([ix.warmup_witness(self.address, me, witness.witness)])

    async def send_health_check(self, check: HealthCheck) -> bool:
        if self.address is None:
            return False
        me, run = self.options.wallet.pubkey(), self.address
        results = [await self._transact([ix.health_check(run, me, node, proof)])
                   for node, proof in check.checks]
        return all(results)

    async def report_checkpoint(self, report: CheckpointReport) -> bool:
        if self.address is None:
            return False
        me = self.options.wallet.pubkey()
        return await self._transact([ix.checkpoint(self.address, me, report.index,
                                                   report.repo)])

    async def report_verification(self, report: VerificationReport) -> bool:
        if self.address is None:
            return False
        # The program takes the signer as the reporter (as the TCP server takes the
        # connection's key): this key's, whatever the report says.
        signed = dataclasses.replace(report, reporter=self.me)
        me = self.options.wallet.pubkey()
        return await self._transact([ix.verification_report(self.address, me, signed)])

    async def withdraw(self) -> bool:
        return False  # no on-chain form: a leaving client is dropped by the health checks
