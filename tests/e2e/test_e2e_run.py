"""A whole run: coordinator + 3 clients training the tiny model over 2 epochs, while
garbage, a wrong run id, a forged identity and a flood of joins hit the server port."""

from __future__ import annotations

import asyncio
import contextlib
import os

import pytest
from e2e_helpers import checkpoint_digests, events, log_tails, make_testnet

from coordinator_tcp.client import JoinRefused, ProtocolConnection
from local_testnet.testnet import client_key, run_headless
from psyche_common.identity import Identity
from psyche_common.tcp.framing import encode_frame

pytestmark = pytest.mark.slow


async def _attack(port: int, run_id: str, report: dict[str, int]) -> None:
    """What a hostile or broken peer might send while the run trains."""
    await asyncio.sleep(8)
    for _ in range(3):
        with contextlib.suppress(OSError):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            await reader.read(4096)  # the challenge
            writer.write(encode_frame(os.urandom(300)))  # garbage instead of a join
            await writer.drain()
            report["garbage_answered"] += bool(await reader.read(4096))
            writer.close()
    with contextlib.suppress(JoinRefused):
        await ProtocolConnection.connect("127.0.0.1", port, Identity.generate(), "another-run")
        report["wrong_run_accepted"] += 1
    # Forged identity: claims client 1's key but signs with another key.
    forger = Identity.generate()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    from coordinator_tcp.protocol import (
        Challenge,
        Join,
        decode_server_message,
        encode,
        join_signing_bytes,
    )
    from psyche_common.tcp.framing import read_frame

    challenge = decode_server_message(await read_frame(reader, 1 << 20))
    assert isinstance(challenge, Challenge)
    signature = forger.sign(join_signing_bytes(challenge.nonce, run_id, ""))
    writer.write(encode_frame(encode(Join(run_id=run_id, identity=client_key(1), p2p_address="",
                                          signature=signature))))
    reply = decode_server_message(await read_frame(reader, 1 << 20))
    report["forged_refused"] += getattr(reply, "error", "") == "BadSignature"
    writer.close()
    # A flood of connections that never finish the handshake.
    flood = []
    for _ in range(150):
        with contextlib.suppress(OSError):
            flood.append(await asyncio.open_connection("127.0.0.1", port))
    await asyncio.sleep(2)
    for _, writer in flood:
        writer.close()
    report["flood"] = len(flood)


async def test_three_clients_two_epochs_identical_and_finished(tmp_path, monkeypatch) -> None:
    # No hub is reachable here (offline mode): every client's checkpoint upload must fail
    # cleanly at the hub call and the run go on.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    testnet = make_testnet(tmp_path, 3, client_args=["--hub-repo", "psyche-test/unreachable"],
                           config={"total_steps": 20, "epoch_time": 25, "warmup_time": 20})
    report = {"garbage_answered": 0, "wrong_run_accepted": 0, "forged_refused": 0, "flood": 0}
    attack = asyncio.create_task(_attack(testnet.options.server_port, testnet.run_id, report))
    summary = await run_headless(testnet)
    await attack

    assert summary["error"] is None, f"{summary}\n{log_tails(testnet.options.work_dir)}"
    assert summary["finished"] and summary["final_step"] == 20
    assert summary["epochs"] >= 2
    assert summary["last_loss"] < summary["first_loss"] - 0.5, summary
    # Every client holds bit-identical parameters at every epoch end.
    digests = [checkpoint_digests(testnet.options.work_dir, i) for i in (1, 2, 3)]
    assert len(digests[0]) >= 2, digests
    assert digests[0] == digests[1] == digests[2]
    # The hostile traffic was answered and refused; none of it joined the run.
    assert report["garbage_answered"] == 3 and report["wrong_run_accepted"] == 0
    assert report["forged_refused"] == 1 and report["flood"] > 100
    trained_by = {i: {e["step"] for e in events(testnet.options.work_dir, i, "trained")}
                  for i in (1, 2, 3)}
    assert all(len(steps) >= 10 for steps in trained_by.values()), trained_by
    # Every client screened every consensus result (verification/checks.py): no honest
    # one was left out.
    for i in (1, 2, 3):
        assert list(events(testnet.options.work_dir, i, "result_left_out")) == []
        assert all(e["left_out"] == 0 for e in events(testnet.options.work_dir, i, "applied"))
    for i in (1, 2, 3):
        failed = events(testnet.options.work_dir, i, "upload_failed")
        assert failed and all("offline" in e["error"] for e in failed), failed
