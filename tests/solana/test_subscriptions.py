"""Solana PubSub on psyche-localnet (accountSubscribe over WebSocket) and its users: the
notification carries the account's new bytes, malformed messages get JSON-RPC errors,
the subscription client falls back (WS_RPC_2, polling), and the client backend and the
run-manager's source follow the run without polling getAccountInfo."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest
from processes import stop_process
from solders.keypair import Keypair
from solders.pubkey import Pubkey
from websockets.sync.client import connect

from client_image.backends.solana import SolanaBackend, SolanaBackendOptions
from psyche_solana import instructions as ix
from psyche_solana.accounts import decode_coordinator
from psyche_solana.localnet import CannotListen, Localnet, LocalValidator
from psyche_solana.rpc import SolanaRpc
from psyche_solana.runs import admin, authorize, create_run, find_run, update_instructions
from psyche_solana.subscription import AccountSubscription, default_ws_url, ws_urls_for
from tests.solana.test_backend import STATE


class CountingValidator(LocalValidator):
    """The real validator, counting the JSON-RPC methods it serves."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()

    def handle(self, method: str, params: list[Any]) -> Any:
        self.calls[method] += 1
        return super().handle(method, params)


@pytest.fixture(scope="module")
def net():
    with Localnet(validator=CountingValidator()) as localnet:
        yield localnet


def _ask(ws, request_id: Any, method: str, params: Any) -> dict[str, Any]:
    ws.send(json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}))
    return json.loads(ws.recv(timeout=5))


async def _open_run(net, run_id: str, state=STATE) -> Pubkey:
    """A permissionless run, resumed: it waits for members."""
    async with SolanaRpc([net.url]) as rpc:
        owner = Keypair()
        await rpc.airdrop(owner.pubkey(), 20 * 10**9)
        await create_run(rpc, owner, run_id, "v1")
        run = await find_run(rpc, run_id)
        await admin(rpc, run, owner, [*update_instructions(run, owner.pubkey(), state, None),
                                      ix.set_paused(run.address, owner.pubkey(), False)])
        await authorize(rpc, owner, Pubkey.default())
        return run.address


async def _funded(net, count: int) -> list[Keypair]:
    wallets = [Keypair() for _ in range(count)]
    async with SolanaRpc([net.url]) as rpc:
        for wallet in wallets:
            await rpc.airdrop(wallet.pubkey(), 5 * 10**9)
    return wallets


def test_a_transaction_that_changes_an_account_is_notified_with_its_new_bytes(net):
    address = Keypair().pubkey()
    with connect(net.ws_url) as ws:
        answer = _ask(ws, 1, "accountSubscribe",
                      [str(address), {"encoding": "base64", "commitment": "confirmed"}])
        subscription = answer["result"]
        assert isinstance(subscription, int) and answer["id"] == 1
        rpc = SolanaRpc([net.url])
        asyncio.run(_airdrop_and_close(rpc, address, 3 * 10**9))
        note = json.loads(ws.recv(timeout=5))
        assert note["method"] == "accountNotification"
        assert note["params"]["subscription"] == subscription
        value = note["params"]["result"]["value"]
        assert value["lamports"] == 3 * 10**9 and value["data"] == ["", "base64"]
        assert value["owner"] == "11111111111111111111111111111111" and value["space"] == 0
        assert note["params"]["result"]["context"]["slot"] >= 0
        assert _ask(ws, 2, "accountUnsubscribe", [subscription]) == \
            {"jsonrpc": "2.0", "result": True, "id": 2}
        asyncio.run(_airdrop_and_close(SolanaRpc([net.url]), address, 10**9))
        with pytest.raises(TimeoutError):  # unsubscribed: nothing more comes
            ws.recv(timeout=0.5)


async def _airdrop_and_close(rpc: SolanaRpc, address: Pubkey, lamports: int) -> None:
    async with rpc:
        await rpc.airdrop(address, lamports)


def test_malformed_pubsub_messages_get_json_rpc_errors_and_the_socket_stays(net):
    with connect(net.ws_url) as ws:
        ws.send("{nope")
        assert json.loads(ws.recv(timeout=5))["error"]["code"] == -32700
        ws.send(b"\xff\xfe")
        assert json.loads(ws.recv(timeout=5))["error"]["code"] == -32700
        ws.send("[1, 2]")
        assert json.loads(ws.recv(timeout=5))["error"]["code"] == -32600
        assert _ask(ws, 3, "slotSubscribe", [])["error"]["code"] == -32601
        bad_key = _ask(ws, 4, "accountSubscribe", ["not-a-key"])["error"]
        assert bad_key["code"] == -32602 and "public key" in bad_key["message"]
        encoding = _ask(ws, 5, "accountSubscribe", [str(Pubkey.default()), {"encoding": "jsonParsed"}])
        assert "unsupported encoding" in encoding["error"]["message"]
        assert _ask(ws, 6, "accountSubscribe", {"pubkey": 1})["error"]["code"] == -32602
        assert _ask(ws, 7, "accountUnsubscribe", [12345])["error"]["message"] == \
            "Invalid subscription id."
        assert _ask(ws, 8, "accountUnsubscribe", ["x"])["error"]["code"] == -32602
        assert isinstance(_ask(ws, 9, "accountSubscribe", [str(Pubkey.default())])["result"], int)
    with connect(net.ws_url) as big, pytest.raises(Exception, match="1009"):
        big.send("x" * 100_000)  # over the 64 KiB request limit: closed, 1009
        big.recv(timeout=5)
    with connect(net.ws_url) as again:  # the server still serves
        assert _ask(again, 1, "accountUnsubscribe", [0])["error"]["code"] == -32602


def test_the_ws_url_is_derived_from_the_rpc_url_as_solana_does():
    assert default_ws_url("http://127.0.0.1:8899") == "ws://127.0.0.1:8900"
    assert default_ws_url("https://api.devnet.solana.com") == "wss://api.devnet.solana.com"
    assert default_ws_url("https://rpc.example/abc?k=1") == "wss://rpc.example/abc?k=1"
    assert ws_urls_for(["http://a:1", "http://b:5"], ["ws://given:9"]) == \
        ["ws://given:9", "ws://b:6"]


def test_localnet_prints_the_websocket_url_and_a_busy_port_is_one_line(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        refused = subprocess.run([sys.executable, "-m", "psyche_solana.localnet", "--port", "0",
                                  "--ws-port", str(taken)], check=False, capture_output=True,
                                 text=True, timeout=60)
        assert refused.returncode == 1 and "Traceback" not in refused.stderr
        assert refused.stderr.strip() == (f"psyche-localnet: cannot listen for WebSocket (PubSub) "
                                          f"on 127.0.0.1:{taken}: Address already in use")
        with pytest.raises(CannotListen, match=r"JSON-RPC on 127\.0\.0\.1"):
            Localnet(port=taken)
    process = subprocess.Popen([sys.executable, "-m", "psyche_solana.localnet", "--port", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert process.stdout is not None
        rpc_line, ws_line = process.stdout.readline(), process.stdout.readline()
        assert rpc_line.startswith("psyche-localnet: JSON-RPC on http://127.0.0.1:")
        assert ws_line.startswith("psyche-localnet: WebSocket on ws://127.0.0.1:")
        with connect(ws_line.split(" on ")[1].strip()) as ws:
            assert isinstance(_ask(ws, 1, "accountSubscribe", [str(Pubkey.default())])["result"], int)
    finally:
        stop_process(process)


async def _wait_for(condition, timeout_s: float = 10.0) -> None:
    for _ in range(int(timeout_s / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached in time")


async def test_the_subscription_falls_back_to_ws_rpc_2_then_to_polling(net):
    run = await _open_run(net, "fallback-run")
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        dead = f"ws://127.0.0.1:{closed.getsockname()[1]}"  # bound, not listening: refused
        async with SolanaRpc([net.url]) as rpc:
            payer = Keypair()
            await rpc.airdrop(payer.pubkey(), 10**9)
            second = AccountSubscription(rpc, [dead, net.ws_url], run)
            polled = AccountSubscription(rpc, [dead], run, fallback_poll_s=0.1, backoff_s=30)
            seen: dict[str, list[bytes]] = {"second": [], "polled": []}

            async def follow(name: str, subscription: AccountSubscription) -> None:
                async for data in subscription.changes():
                    seen[name].append(data)

            tasks = [asyncio.create_task(follow("second", second)),
                     asyncio.create_task(follow("polled", polled))]
            try:
                await asyncio.wait_for(second.connected.wait(), 10)
                await _wait_for(lambda: seen["second"] and seen["polled"])
                before = await rpc.account_data(run)
                assert seen["second"][-1] == before == seen["polled"][-1]
                await rpc.send_instructions([ix.tick(run)], payer)  # anyone may tick: nonce + 1
                after = await rpc.account_data(run)
                assert after != before
                await _wait_for(lambda: seen["second"][-1] == after == seen["polled"][-1])
                assert second.notifications >= 1  # pushed over the second endpoint
                assert polled.notifications == 0 and not polled.connected.is_set()
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)


async def _ignore(state) -> None:
    return None


async def test_the_backend_sees_state_changes_without_polling_get_account_info(net):
    run = await _open_run(net, "quiet-run")
    (wallet, other) = await _funded(net, 2)
    stop = asyncio.Event()
    backend = SolanaBackend(SolanaBackendOptions(
        rpc=[net.url], ws_rpc=[net.ws_url], wallet=wallet, run_id="quiet-run", p2p_address="x",
        check_interval_s=0.05))
    task = asyncio.create_task(backend.run(_ignore, lambda e: None, stop))
    try:
        await _wait_for(lambda: backend.account is not None
                        and backend.account.pending == [wallet.pubkey()])
        assert backend.subscription is not None and backend.subscription.connected.is_set()
        reads = net.validator.calls["getAccountInfo"]
        await asyncio.sleep(2.0)  # 40 local checks; the old 4 Hz polling read twice each
        assert net.validator.calls["getAccountInfo"] - reads == 0
        async with SolanaRpc([net.url]) as rpc:  # another client joins: pushed, not fetched
            account = decode_coordinator(await rpc.account_data(run))
            authorization = ix.authorization_address(account.join_authority, Pubkey.default())
            await rpc.send_instructions([ix.join_run(run, other.pubkey(), authorization)], other)
        reads = net.validator.calls["getAccountInfo"]
        await _wait_for(lambda: len(backend.account.pending) == 2)
        assert net.validator.calls["getAccountInfo"] - reads <= 1
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def test_the_run_managers_source_answers_from_the_subscription(net):
    from run_manager.sources import SolanaCoordinatorSource

    run = await _open_run(net, "watched-run")
    (wallet,) = await _funded(net, 1)
    source = SolanaCoordinatorSource([net.url], "watched-run", ws_urls=[net.ws_url])
    try:
        assert (await source.snapshot()).joined == 0
        assert source.subscription is not None
        await asyncio.wait_for(source.subscription.connected.wait(), 10)
        reads = net.validator.calls["getAccountInfo"] + net.validator.calls["getProgramAccounts"]
        for _ in range(20):  # the TUI asks often
            assert (await source.snapshot()).joined == 0
            await asyncio.sleep(0.02)
        async with SolanaRpc([net.url]) as rpc:
            account = decode_coordinator(await rpc.account_data(run))
            authorization = ix.authorization_address(account.join_authority, Pubkey.default())
            await rpc.send_instructions([ix.join_run(run, wallet.pubkey(), authorization)], wallet)
        for _ in range(250):
            if (await source.snapshot()).joined == 1:
                break
            await asyncio.sleep(0.02)
        assert (await source.snapshot()).joined == 1
        assert net.validator.calls["getAccountInfo"] + net.validator.calls["getProgramAccounts"] \
            - reads <= 2  # the catch-up read of a (re)connection at most
    finally:
        await source.close()


async def test_of_several_clients_about_one_sends_each_due_tick(net):
    config = STATE.config.model_copy(update={
        "waiting_for_members_extra_time": 1, "warmup_time": 2, "max_round_train_time": 2,
        "round_witness_time": 1, "cooldown_time": 1, "epoch_time": 4})
    run = await _open_run(net, "tick-run", STATE.model_copy(update={"config": config}))
    wallets = await _funded(net, 4)
    stop = asyncio.Event()
    backends = [SolanaBackend(SolanaBackendOptions(
        rpc=[net.url], ws_rpc=[net.ws_url], wallet=w, run_id="tick-run", p2p_address="x"))
        for w in wallets]
    phases: list[tuple[str, int, int]] = []
    seen_nonce = -1
    async with SolanaRpc([net.url]) as rpc:
        watcher = AccountSubscription(rpc, [net.ws_url], run)

        async def watch() -> None:
            nonlocal seen_nonce
            async for data in watcher.changes():
                account = decode_coordinator(data)
                state = account.state
                assert state is not None
                seen_nonce = account.nonce
                phase = (state.run_state.name, state.progress.step, state.progress.epoch)
                if not phases or phases[-1] != phase:
                    phases.append(phase)

        tasks = [asyncio.create_task(b.run(_ignore, lambda e: None, stop)) for b in backends]
        watching = asyncio.create_task(watch())
        try:
            await asyncio.sleep(10.0)
        finally:
            stop.set()
            await asyncio.gather(*[asyncio.wait_for(t, 10) for t in tasks])
            # A tick sent just before the stop has landed, but its notification may still
            # be on its way: the watcher must see the final account before it is cancelled,
            # or that tick is counted without its move (8 ticks for 7 moves once in CI).
            final = await rpc.account_data(run)
            assert final is not None
            final_nonce = decode_coordinator(final).nonce
            for _ in range(250):
                if seen_nonce >= final_nonce:
                    break
                await asyncio.sleep(0.02)
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)
    assert seen_nonce >= final_nonce, (seen_nonce, final_nonce)
    ticks = sum(b.ticks_sent for b in backends)
    moves = len(phases) - 1
    assert moves >= 3, phases  # the run did move: WaitingForMembers -> Warmup -> ...
    # every move is at most one due tick (joins and ticks move it): the first key in
    # tick_order sends it, the next only after the grace (a random backoff once let
    # several send on a loaded machine: 10 ticks for 7 moves)
    assert ticks <= moves, (ticks, moves, [b.ticks_sent for b in backends], phases)


def test_the_clients_ws_rpc_must_be_a_websocket_url():
    refused = subprocess.run([sys.executable, "-m", "client_image.cli", "train", "--run-id", "x",
                              "--rpc", "http://127.0.0.1:1", "--ws-rpc", "http://127.0.0.1:2"],
                             check=False, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert refused.stderr.strip() == \
        "error: --ws-rpc must be a ws:// or wss:// URL, got 'http://127.0.0.1:2'"
    # the third endpoint (RPC_3 / WS_RPC_3, as the run-manager's) is read and checked alike
    refused = subprocess.run([sys.executable, "-m", "client_image.cli", "train", "--run-id", "x",
                              "--rpc", "http://127.0.0.1:1"],
                             env={**os.environ, "RPC_3": "http://127.0.0.1:3",
                                  "WS_RPC_3": "http://127.0.0.1:4"},
                             check=False, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert refused.stderr.strip() == \
        "error: --ws-rpc-3 must be a ws:// or wss:// URL, got 'http://127.0.0.1:4'"


async def test_the_subscription_polls_while_the_websocket_is_down_and_reconnects(net):
    from psyche_solana.pubsub import PubSubServer

    run = await _open_run(net, "restart-run")
    port = int(net.ws_url.rsplit(":", 1)[1])
    async with SolanaRpc([net.url]) as rpc:
        payer = Keypair()
        await rpc.airdrop(payer.pubkey(), 10**9)
        subscription = AccountSubscription(rpc, [net.ws_url], run, fallback_poll_s=0.1,
                                           backoff_s=0.5, max_backoff_s=0.5)
        seen: list[bytes] = []

        async def follow() -> None:
            async for data in subscription.changes():
                seen.append(data)  # noqa: PERF401 (endless: each item must land now)

        task = asyncio.create_task(follow())
        replacement = None
        try:
            await asyncio.wait_for(subscription.connected.wait(), 10)
            await asyncio.to_thread(net.pubsub.stop)  # closes the socket: 1001 going away
            await _wait_for(lambda: not subscription.connected.is_set())
            await rpc.send_instructions([ix.tick(run)], payer)
            down = await rpc.account_data(run)
            await _wait_for(lambda: seen and seen[-1] == down)  # seen by polling
            replacement = PubSubServer(net.validator, "127.0.0.1", port).start()
            await asyncio.wait_for(subscription.connected.wait(), 10)
            pushed = subscription.notifications
            await rpc.send_instructions([ix.tick(run)], payer)
            up = await rpc.account_data(run)
            await _wait_for(lambda: seen[-1] == up)
            assert subscription.notifications == pushed + 1  # pushed again, not polled
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            if replacement is not None:
                net.pubsub = replacement  # the fixture's teardown stops this one
