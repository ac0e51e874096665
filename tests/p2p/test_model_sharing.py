"""A joiner rebuilds a tiny Llama's exact state dict from three peers."""

import hashlib
import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from client_image.p2p import ModelFetchOptions, ModelManifest, ModelSharingError
from client_image.p2p.model_sharing import ParameterEntry, tensor_bytes

from .swarm import started_nodes

QUICK = ModelFetchOptions(manifest_timeout_s=1.5)  # a peer not sharing: give up soon

pytestmark = pytest.mark.timeout(90)  # a hang fails fast instead of blocking CI


def tiny_llama() -> tuple[LlamaConfig, dict[str, torch.Tensor]]:
    torch.manual_seed(1234)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    return config, {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def state_hash(state: dict[str, torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for name, tensor in state.items():
        digest.update(name.encode())
        digest.update(str((tuple(tensor.shape), tensor.dtype)).encode())
        digest.update(tensor_bytes(tensor))
    return digest.hexdigest()


async def test_joiner_reproduces_the_exact_state_dict_from_three_peers() -> None:
    config, state = tiny_llama()
    tokenizer_json = json.dumps({"model": {"type": "BPE"}, "added_tokens": []})
    async with started_nodes(5) as (*sharers, outsider, joiner):
        for sharer in sharers:
            sharer.model_sharing.share(state, config.to_json_string(), tokenizer_json)
        outsider.model_sharing.share({"other": torch.zeros(3)}, "{}")  # not a source: never asked
        joiner.add_peer_addresses([node.address for node in [*sharers, outsider]])
        progress: list[tuple[int, int]] = []
        manifest, fetched, report = await joiner.model_sharing.fetch_model(
            [s.node_id for s in sharers],
            ModelFetchOptions(max_concurrent_parameter_requests=4),
            progress=lambda done, total: progress.append((done, total)),
        )
        assert state_hash(fetched) == state_hash(state)
        assert list(fetched) == list(state)
        assert all(torch.equal(fetched[name], state[name]) for name in state)
        assert json.loads(manifest.config_json)["hidden_size"] == 64
        assert manifest.tokenizer_json == tokenizer_json
        # each tensor requested from a different peer in turn: all three served a share
        assert set(report.served_by) == {s.node_id for s in sharers}
        assert max(report.served_by.values()) - min(report.served_by.values()) <= 1
        assert progress[-1] == (len(state), len(state))
        rebuilt = LlamaForCausalLM(LlamaConfig.from_dict(json.loads(manifest.config_json)))
        rebuilt.load_state_dict(fetched)
        ids = torch.tensor([[1, 2, 3, 4]])
        reference = LlamaForCausalLM(config)
        reference.load_state_dict(state)
        assert torch.equal(rebuilt(ids).logits, reference(ids).logits)


async def test_bf16_state_and_a_source_that_stops_mid_fetch() -> None:
    _, state = tiny_llama()
    bf16 = {name: tensor.to(torch.bfloat16) for name, tensor in state.items()}
    async with started_nodes(3) as (first, second, joiner):
        for sharer in (first, second):
            sharer.model_sharing.share(bf16)
        joiner.add_peer_addresses([first.address, second.address])
        await second.stop()  # listed as a source but gone: its tensors come from `first`
        _, fetched, report = await joiner.model_sharing.fetch_model([second.node_id, first.node_id])
        assert state_hash(fetched) == state_hash(bf16)
        assert set(report.served_by) == {first.node_id}


async def test_a_peer_still_sharing_an_older_model_is_skipped() -> None:
    """A joiner asks for the model of its epoch's start step; a peer that shares the model
    of an earlier cooldown (it missed the last one) is passed over, never trusted."""
    _, state = tiny_llama()
    older = {name: tensor + 1 for name, tensor in state.items()}
    async with started_nodes(3) as (stale, current, joiner):
        stale.model_sharing.share(older, step=40)
        current.model_sharing.share(state, step=57)
        joiner.add_peer_addresses([stale.address, current.address])
        manifest, fetched, report = await joiner.model_sharing.fetch_model(
            [stale.node_id, current.node_id], step=57)
        assert manifest.step == 57 and state_hash(fetched) == state_hash(state)
        assert set(report.served_by) == {current.node_id}
        with pytest.raises(ModelSharingError, match="shares the model of step 57, not 60"):
            await joiner.model_sharing.fetch_model([current.node_id], QUICK, step=60)


async def test_a_holder_still_loading_its_model_is_asked_again_until_it_shares() -> None:
    """A holder that restarted answers "not sharing" for the second or two it takes to load
    its own checkpoint: the joiner asks again instead of sitting the epoch out."""
    import asyncio
    import time

    _, state = tiny_llama()
    async with started_nodes(2) as (holder, joiner):
        joiner.add_peer_addresses([holder.address])

        async def load_then_share() -> None:
            await asyncio.sleep(1.2)
            holder.model_sharing.share(state, step=9)

        began = time.monotonic()
        sharing = asyncio.create_task(load_then_share())
        manifest, fetched, _ = await joiner.model_sharing.fetch_model([holder.node_id], step=9)
        await sharing
        assert manifest.step == 9 and state_hash(fetched) == state_hash(state)
        assert 1.2 <= time.monotonic() - began < 8


async def test_a_holder_announcing_its_load_is_waited_for_past_the_manifest_timeout() -> None:
    """A restarted holder says it is loading the model of the step asked for, and how big
    it is: the joiner waits as long as that size may take to load (here 1 s timeout +
    4 MB at 2 MB/s), not just the manifest timeout, and gets the model once shared."""
    import asyncio
    import time

    _, state = tiny_llama()
    options = ModelFetchOptions(manifest_timeout_s=1.0, holder_load_bytes_per_second=2e6)
    async with started_nodes(2) as (holder, joiner):
        joiner.add_peer_addresses([holder.address])
        holder.model_sharing.announce_loading(9, 4_000_000)

        async def load_then_share() -> None:
            await asyncio.sleep(2.5)  # past the 1 s manifest timeout
            holder.model_sharing.share(state, step=9)

        began = time.monotonic()
        sharing = asyncio.create_task(load_then_share())
        manifest, fetched, _ = await joiner.model_sharing.fetch_model(
            [holder.node_id], options, step=9)
        await sharing
        assert manifest.step == 9 and state_hash(fetched) == state_hash(state)
        assert 2.5 <= time.monotonic() - began < 5


async def test_a_holder_loading_too_long_or_another_step_is_given_up_on() -> None:
    """The wait follows the announced size: a holder still "loading" well past what its
    size allows is given up on, and one loading another step's model gets no extension."""
    import time

    async with started_nodes(2) as (holder, joiner):
        joiner.add_peer_addresses([holder.address])
        options = ModelFetchOptions(manifest_timeout_s=0.5, holder_load_bytes_per_second=1e6)
        holder.model_sharing.announce_loading(9, 2_000_000)  # 0.5 + 2 s from now at most
        began = time.monotonic()
        with pytest.raises(ModelSharingError, match="still loading the model of step 9"):
            await joiner.model_sharing.fetch_model([holder.node_id], options, step=9)
        # Past the 0.5 s manifest timeout; given up within a retry (0.5 s) of the 2.5 s.
        assert 1.6 <= time.monotonic() - began < 4.5
        holder.model_sharing.announce_loading(8, 100_000_000)  # not the step asked for
        began = time.monotonic()
        with pytest.raises(ModelSharingError, match="step 8"):
            await joiner.model_sharing.fetch_model([holder.node_id], options, step=9)
        assert time.monotonic() - began < 2


def test_the_wait_for_a_loading_holder_follows_its_size_and_elapsed_time() -> None:
    from client_image.p2p.model_sharing import LoadingNotice

    options = ModelFetchOptions(manifest_timeout_s=10, holder_load_bytes_per_second=5e6,
                                max_holder_wait_s=100)
    assert options.holder_wait_s(LoadingNotice(step=1, bytes=50_000_000)) == 20
    assert options.holder_wait_s(LoadingNotice(step=1, bytes=50_000_000, elapsed_s=15)) == 5
    assert options.holder_wait_s(LoadingNotice(step=1, bytes=50_000_000, elapsed_s=30)) == 0
    assert options.holder_wait_s(LoadingNotice(step=1, bytes=10**12)) == 100


async def test_fetch_fails_clearly_without_sharing_sources() -> None:
    async with started_nodes(2) as (idle, joiner):
        joiner.add_peer_addresses([idle.address])
        with pytest.raises(ModelSharingError, match="not sharing a model"):
            await joiner.model_sharing.fetch_model([idle.node_id], QUICK)
        with pytest.raises(ModelSharingError, match="no peers"):
            await joiner.model_sharing.fetch_model([])


def test_manifest_with_inconsistent_sizes_is_rejected() -> None:
    entry = ParameterEntry(name="w", shape=[2, 3], dtype="float32", size=20, hash=bytes(32))
    with pytest.raises(ModelSharingError, match="does not match shape"):
        ModelManifest(parameters=[entry]).validate_sizes()
    ok = entry.model_copy(update={"size": 24})
    with pytest.raises(ModelSharingError, match="twice"):
        ModelManifest(parameters=[ok, ok]).validate_sizes()


async def test_a_silent_source_does_not_hold_up_the_live_one() -> None:
    """Sources are asked at once: a holder that restarted (its old address now a socket
    that never answers) costs nothing while another source serves the manifest."""
    import socket
    import time

    from client_image.p2p import Identity, PeerAddress

    _, state = tiny_llama()
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # receives, never answers
    silent.bind(("127.0.0.1", 0))
    ghost = Identity.generate().public_key
    try:
        async with started_nodes(2) as (current, joiner):
            current.model_sharing.share(state, step=57)
            joiner.add_peer_addresses([
                PeerAddress(ghost, (f"127.0.0.1:{silent.getsockname()[1]}",)), current.address])
            started = time.monotonic()
            manifest, fetched, _ = await joiner.model_sharing.fetch_model(
                [ghost, current.node_id], ModelFetchOptions(manifest_timeout_s=10), step=57)
            assert time.monotonic() - started < 4  # not the ghost's 10 s timeout first
            assert manifest.step == 57 and state_hash(fetched) == state_hash(state)
    finally:
        silent.close()
