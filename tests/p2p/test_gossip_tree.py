"""PlumTree bookkeeping, driven directly (no network): prune, IHAVE, graft, cache."""

import asyncio

from client_image.p2p.gossip.tree import BroadcastTree, TreeConfig, decode_ids, encode_ids
from client_image.p2p.gossip.wire import FrameKind

A, B, C = b"A" * 32, b"B" * 32, b"C" * 32


def make_tree(seen: set[bytes]) -> tuple[BroadcastTree, list[tuple[bytes, bytes]]]:
    sent: list[tuple[bytes, bytes]] = []
    config = TreeConfig(graft_timeout_s=0.05, ihave_interval_s=0.01)
    tree = BroadcastTree(lambda peer, frame: sent.append((peer, frame)), seen.__contains__, config)
    for peer in (A, B, C):
        tree.neighbour_up(peer)
    return tree, sent


async def test_duplicates_prune_edges_and_lazy_peers_get_ihave() -> None:
    seen: set[bytes] = set()
    tree, sent = make_tree(seen)
    frame1 = bytes([FrameKind.MESSAGE]) + b"one"
    tree.on_new_message(b"1" * 32, frame1, source=A)
    assert sorted(sent) == sorted([(B, frame1), (C, frame1)])  # eager to all but the source
    sent.clear()
    tree.on_duplicate(B)
    assert sent == [(B, bytes([FrameKind.PRUNE]))] and B in tree.lazy
    sent.clear()
    frame2 = bytes([FrameKind.MESSAGE]) + b"two"
    tree.on_new_message(b"2" * 32, frame2, source=None)
    assert sorted(sent) == sorted([(A, frame2), (C, frame2)])
    await asyncio.sleep(0.05)
    assert (B, encode_ids(FrameKind.IHAVE, [b"2" * 32])) in sent
    tree.close()


async def test_missing_announced_message_is_grafted_from_the_announcer() -> None:
    seen: set[bytes] = set()
    tree, sent = make_tree(seen)
    tree.on_prune(C)
    assert C in tree.lazy
    tree.on_ihave(C, [b"9" * 32, b"8" * 32])
    seen.add(b"8" * 32)  # one of them arrives eagerly meanwhile
    await asyncio.sleep(0.1)
    assert sent == [(C, encode_ids(FrameKind.GRAFT, [b"9" * 32]))]
    assert C in tree.eager  # the repaired edge joins the tree
    sent.clear()
    cached = bytes([FrameKind.MESSAGE]) + b"cached"
    tree.on_new_message(b"7" * 32, cached, source=A)
    sent.clear()
    tree.on_graft(B, [b"7" * 32, b"unknown-id".ljust(32, b"-")])
    assert sent == [(B, cached)]
    tree.close()


def test_id_lists_are_validated() -> None:
    ids = [bytes([i]) * 32 for i in range(3)]
    assert decode_ids(encode_ids(FrameKind.IHAVE, ids)[1:]) == ids
    for bad in (b"x" * 33, b"x" * 32 * 121):
        try:
            decode_ids(bad)
        except ValueError as error:
            assert "ids" in str(error)
        else:
            raise AssertionError("accepted a malformed id list")
