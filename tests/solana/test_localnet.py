"""psyche-localnet: Solana JSON-RPC over LiteSVM, its error format and limits; the RPC
client's fallback endpoint and error words."""

from __future__ import annotations

import base64

import httpx
import pytest
from solders.keypair import Keypair
from solders.message import Message
from solders.pubkey import Pubkey
from solders.transaction import Transaction

from psyche_solana import instructions as ix
from psyche_solana.accounts import COORDINATOR_ACCOUNT_SIZE
from psyche_solana.deploy import UPGRADEABLE_LOADER_ID
from psyche_solana.ids import coordinator_program
from psyche_solana.localnet import Localnet
from psyche_solana.rpc import ProgramError, RpcUnavailable, SolanaRpc, TransactionTooLarge


@pytest.fixture(scope="module")
def net():
    with Localnet() as localnet:
        yield localnet


def _call(net: Localnet, method: str, *params):
    return httpx.post(net.url, json={"jsonrpc": "2.0", "id": 7, "method": method,
                                     "params": list(params)}).json()


def test_programs_are_deployed_through_the_upgradeable_loader(net):
    info = _call(net, "getAccountInfo", str(coordinator_program()))["result"]["value"]
    assert info["owner"] == str(UPGRADEABLE_LOADER_ID) and info["executable"] is True
    assert _call(net, "getHealth")["result"] == "ok"


def test_errors_follow_solanas_json_format(net):
    assert _call(net, "noSuchMethod")["error"]["code"] == -32601
    bad = _call(net, "getBalance", "not-a-key")["error"]
    assert bad["code"] == -32602 and "not a base-58 public key" in bad["message"]
    garbage = httpx.post(net.url, content=b"{nope").json()
    assert garbage["error"]["code"] == -32700 and garbage["id"] is None
    payer = Keypair()
    _call(net, "requestAirdrop", str(payer.pubkey()), 10**9)
    blockhash = _call(net, "getLatestBlockhash")["result"]["value"]["blockhash"]
    from solders.hash import Hash

    tick = ix.tick(Keypair().pubkey())
    tx = Transaction([payer], Message([tick], payer.pubkey()), Hash.from_string(blockhash))
    failed = _call(net, "sendTransaction", base64.b64encode(bytes(tx)).decode(),
                   {"encoding": "base64"})["error"]
    assert failed["code"] == -32002
    assert failed["message"].startswith("Transaction simulation failed: Error processing Instruction 0")
    assert failed["data"]["err"] == {"InstructionError": [0, "MissingAccount"]} or \
        "InstructionError" in failed["data"]["err"]
    big = base64.b64encode(bytes(1300)).decode()
    too_big = _call(net, "sendTransaction", big, {"encoding": "base64"})["error"]
    assert too_big["code"] == -32602 and "too large: 1300 bytes" in too_big["message"]


async def test_rpc_client_falls_back_and_names_program_errors(net):
    async with SolanaRpc(["http://127.0.0.1:9", net.url], backoff_s=0.01) as rpc:
        payer, client = Keypair(), Keypair()
        await rpc.airdrop(payer.pubkey(), 5 * 10**9)
        assert await rpc.balance(payer.pubkey()) == 5 * 10**9
        run = Keypair()
        rent = await rpc.minimum_balance(COORDINATOR_ACCOUNT_SIZE)
        await rpc.send_instructions([
            ix.create_coordinator_account(payer.pubkey(), run.pubkey(), rent),
            ix.init_coordinator(run.pubkey(), payer.pubkey(), "rpc-run", payer.pubkey(),
                                payer.pubkey(), "v")], payer, [run])
        with pytest.raises(ProgramError, match="NotAuthorized") as caught:
            await rpc.send_instructions([ix.join_run(run.pubkey(), client.pubkey(), Pubkey.default())],
                                        payer, [client])
        assert caught.value.code == 108 and caught.value.logs
        from coordinator import Witness, WitnessProof

        witness_ix = ix.witness(run.pubkey(), client.pubkey(), Witness(WitnessProof(0, 0, True)))
        with pytest.raises(TransactionTooLarge, match="1232"):
            await rpc.send_instructions([witness_ix] * 3, payer, [client])
        found = await rpc.program_accounts(coordinator_program(), COORDINATOR_ACCOUNT_SIZE,
                                           [(88, b"rpc-run".ljust(32, b"\0"))])
        assert [address for address, _ in found] == [run.pubkey()]
    async with SolanaRpc(["http://127.0.0.1:9"], retries=2, backoff_s=0.01) as dead:
        with pytest.raises(RpcUnavailable, match="no RPC endpoint answered"):
            await dead.call("getHealth")
