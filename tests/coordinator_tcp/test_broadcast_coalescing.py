"""Events that arrive together make one broadcast: a round's witnesses, sent at once, reach
every client as one new state with all of them, not one state per witness."""

from __future__ import annotations

import asyncio

from tcp_helpers import Clock, identity, join, make_state_file, next_state, server_options, wait_for

from coordinator import (
    Coordinator,
    RunState,
    Witness,
    decode_state,
    selection_for_round,
)
from coordinator_tcp.protocol import WitnessModel, WitnessSubmit, encode
from coordinator_tcp.server import CoordinatorServer
from psyche_common.tcp.framing import encode_frame

CLIENTS = 6


async def test_witnesses_arriving_together_are_broadcast_once() -> None:
    clock = Clock()
    state_file = make_state_file(init_min_clients=CLIENTS, min_clients=CLIENTS,
                                 witness_nodes=4)
    server = CoordinatorServer(Coordinator.from_state_file(state_file), server_options(),
                               clock=clock)
    await server.start()
    connections = [await join(server, identity(i)) for i in range(1, CLIENTS + 1)]
    observer = await join(server, identity(99), observe=True)
    try:
        clock.now += 2
        await wait_for(lambda: server.state.run_state is RunState.Warmup)
        listed = [c.id.key for c in server.state.epoch_state.clients]
        clock.now += 3  # the warm-up times out: the first round starts
        await wait_for(lambda: server.state.run_state is RunState.RoundTrain)
        selection = selection_for_round(server.state)
        witnesses = list(selection.witness_indices())
        assert len(witnesses) >= 2, witnesses
        by_key = {identity(i).public_key: c for i, c in enumerate(connections, start=1)}
        before = server.stats.broadcasts
        # Every witness's frame written before the server's loop runs again: they are read
        # in one turn of it, as witnesses sent at the same moment are.
        for index in witnesses:
            message = WitnessSubmit(witness=WitnessModel.of(Witness(selection.witness_of(index))))
            by_key[listed[index]].writer.write(encode_frame(encode(message)))
        await wait_for(lambda: len(server.state.current_round.witnesses) == len(witnesses))
        await asyncio.sleep(0.1)
        assert server.stats.broadcasts - before == 1, server.stats.broadcasts - before
        timing = server.stats.broadcast_ms()  # what `run` logs on stopping
        assert timing is not None and 0 < timing[0] <= timing[1] < 1000, timing

        # What the observer saw: no state with some of the witnesses, one with all.
        counts = []
        while not counts or counts[-1] < len(witnesses):
            counts.append(len(decode_state((await next_state(observer)).state_bytes)
                              .current_round.witnesses))
        assert set(counts) <= {0, len(witnesses)}, counts
    finally:
        for connection in [*connections, observer]:
            await connection.close()
        await server.stop()
