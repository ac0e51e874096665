"""After a local run: what its clients' checkpoints say about it.

checkpoints_equal_initial
                      checkpoints after step 0 whose weights equal the initial model's
                      (a reset epoch that then applied nothing; undercounts resets)
hub_fallback_epochs   epochs after the first that restarted from the stored checkpoint
                      (optionally only those that threw applied training away)
clients_at_cooldown   per epoch, the clients listed when its cooldown began (its holders)
checkpoint_agreement  the steps saved by two or more clients, and those whose
                      safetensors differ (clients that diverged)
checkpoint_pairs      every pair of clients compared at every step both saved
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator
from pathlib import Path

from local_testnet.client_log import client_events


def checkpoints_equal_initial(work_dir: Path, clients: int, initial: Path) -> tuple[int, int]:
    """(checkpoints equal to the initial model, checkpoints examined), after step 0."""
    import torch
    from safetensors.torch import load_file

    # Checkpoints are bf16 (Psyche's cooldown rounding): a reset model is the initial one
    # rounded to bf16, so both sides are compared in bf16.
    start = {name: tensor.to(torch.bfloat16) for name, tensor in load_file(initial).items()}
    reset = examined = 0
    for i in range(1, clients + 1):
        for directory in sorted((work_dir / f"client-{i}" / "checkpoints").glob("*-step*")):
            if int(directory.name.rsplit("-step", 1)[1]) == 0:
                continue
            weights: dict[str, torch.Tensor] = {}
            for file in directory.glob("*.safetensors"):
                weights.update(load_file(file))
            if not weights:
                continue
            examined += 1
            if all(name in weights and torch.equal(weights[name].to(torch.bfloat16), tensor)
                   for name, tensor in start.items()):
                reset += 1
    return reset, examined


def checkpoint_digests(work_dir: Path, clients: int) -> Iterator[tuple[int, int, str]]:
    """(client, step, SHA-256 of its safetensors) of every checkpoint the clients saved."""
    for i in range(1, clients + 1):
        for directory in (work_dir / f"client-{i}" / "checkpoints").glob("*-step*"):
            files = sorted(directory.glob("*.safetensors"))
            if not files:
                continue
            digest = hashlib.sha256()
            for file in files:
                digest.update(file.name.encode() + file.read_bytes())
            yield i, int(directory.name.rsplit("-step", 1)[1]), digest.hexdigest()


def checkpoint_agreement(work_dir: Path, clients: int) -> tuple[int, list[int]]:
    """(steps saved by 2+ clients, the steps among them whose checkpoints differ)."""
    digests: dict[int, set[str]] = {}
    savers: dict[int, int] = {}
    for _client, step, digest in checkpoint_digests(work_dir, clients):
        digests.setdefault(step, set()).add(digest)
        savers[step] = savers.get(step, 0) + 1
    shared = sorted(step for step, count in savers.items() if count >= 2)
    return len(shared), [step for step in shared if len(digests[step]) > 1]


def checkpoint_pairs(work_dir: Path, clients: int) -> tuple[int, list[tuple[int, int, int]]]:
    """Every pair of clients compared at every step both checkpointed: (pairs compared,
    the (step, client, client) whose safetensors differ)."""
    digests: dict[int, dict[int, str]] = {}  # step -> client -> digest
    for client, step, digest in checkpoint_digests(work_dir, clients):
        digests.setdefault(step, {})[client] = digest
    compared, differing = 0, []
    for step, by_client in sorted(digests.items()):
        for a, b in itertools.combinations(sorted(by_client), 2):
            compared += 1
            if by_client[a] != by_client[b]:
                differing.append((step, a, b))
    return compared, differing


def hub_fallback_epochs(work_dir: Path, clients: int, *, lossy_only: bool = False,
                        initial_only: bool = False) -> list[int]:
    """Epochs after the first whose clients loaded the run's stored checkpoint (Hub, or a
    GCS bucket's latest upload) instead of the model from the previous epoch's clients
    (the coordinator fell back to it: nobody who held the model was left). In a run whose
    stored checkpoint is its initial model, each one restarts training from scratch,
    whatever the step counter says.

    lossy_only: only those that threw training away, i.e. some client had applied peers'
    results since the stored model was last loaded (a fallback right after another one,
    before anything was applied, loses nothing).
    initial_only: only those that loaded the initial model (a Hub checkpoint, which no
    local run moves, or a bucket's step-0 upload), not a later uploaded cooldown."""
    loads: dict[int, float] = {}  # epoch -> first load of the stored checkpoint in it
    initial: set[int] = set()  # epochs whose stored load was the initial model
    applied: list[float] = []  # times results were applied to the model
    for i in range(1, clients + 1):
        epoch = 0
        for event in client_events(work_dir, i):
            when = event.get("time")
            if not isinstance(when, int | float):
                continue
            if event["event"] == "state" and isinstance(event.get("epoch"), int):
                epoch = event["epoch"]
            elif event["event"] == "model_loaded" and event.get("source") in ("hub", "gcs"):
                loads[epoch] = min(when, loads.get(epoch, when))
                if event.get("source") == "hub" or event.get("detail") == "step0":
                    initial.add(epoch)
            elif event["event"] == "applied" and (event.get("results") or 0) > 0:
                applied.append(when)
    epochs = sorted(loads)
    wanted = [epoch for epoch in epochs if epoch and (not initial_only or epoch in initial)]
    if not lossy_only:
        return wanted
    return [epoch for previous, epoch in itertools.pairwise(epochs)
            if epoch in wanted and any(loads[previous] <= t < loads[epoch] for t in applied)]


def clients_at_cooldown(work_dir: Path, clients: int) -> dict[int, int]:
    """epoch -> how many clients the coordinator listed when the epoch's cooldown began
    (the first Cooldown state any client logged): the epoch's holders of the model. An
    epoch that reached its cooldown with none lost its model with its clients' processes,
    and only a stored checkpoint could have kept it."""
    first: dict[int, tuple[float, int]] = {}
    for i in range(1, clients + 1):
        for event in client_events(work_dir, i, "state"):
            epoch, when, count = event.get("epoch"), event.get("time"), event.get("clients")
            if (event.get("phase") != "Cooldown" or not isinstance(epoch, int)
                    or not isinstance(when, int | float) or not isinstance(count, int)):
                continue
            if epoch not in first or when < first[epoch][0]:
                first[epoch] = (when, count)
    return {epoch: count for epoch, (_, count) in first.items()}
