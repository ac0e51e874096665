"""DisTrO as a torch.optim.Optimizer: the update rule, any objective, and real gloo
workers that stay bit-identical through TorchDistributedExchange."""

import hashlib
import multiprocessing

import pytest
import torch
import torch.distributed as dist
from loopback import free_port
from training_assets import TINY_MODEL, TRAIN_DATA

from client_image.formats.blocks import SparseResult
from client_image.training.distro import compress, decompress, plan_model
from client_image.training.distro_optimizer import DisTrO, LocalExchange, TorchDistributedExchange
from client_image.training.model import load_causal_lm
from coordinator.config import DistroOptimizer
from psyche_common.token_files.local import LocalDataProvider

CONFIG = DistroOptimizer(compression_decay=0.95, compression_topk=4, compression_chunk=8,
                         quantize_1bit=True, clip_grad_norm=None, weight_decay=None)


def test_one_step_is_theta_minus_lr_sign_of_the_decompressed_momentum():
    torch.manual_seed(0)
    layer = torch.nn.Linear(16, 8)
    before = [p.detach().clone() for p in layer.parameters()]
    optimizer = DisTrO(layer.parameters(), CONFIG, LocalExchange(), lr=0.01)
    layer(torch.randn(4, 16)).square().mean().backward()
    grads = [p.grad.clone() for p in layer.parameters()]
    optimizer.step()
    plans = plan_model([(f"param{i}", g.shape) for i, g in enumerate(grads)], 8, 4)
    momentum = [0.01 * g for g in grads]  # delta = 0.95 * 0 + lr * grad
    sent = [SparseResult(t.idx, torch.sign(t.val)) for t in compress(momentum, plans)]  # 1-bit
    signs = [torch.sign(d) for d in decompress([sent], plans, torch.float32, "cpu")]
    for p, b, s in zip(layer.parameters(), before, signs, strict=True):
        torch.testing.assert_close(p.detach(), b - 0.01 * s, rtol=0, atol=1e-7)


def test_any_objective_trains_through_it():
    """A regression loss, not a language model's: the optimizer only reads .grad."""
    torch.manual_seed(1)
    target = torch.nn.Linear(32, 32)
    model = torch.nn.Linear(32, 32)
    optimizer = DisTrO(model.parameters(), CONFIG.model_copy(update={"compression_topk": 16}),
                       LocalExchange(), lr=3e-3)
    losses = []
    for _ in range(60):
        x = torch.randn(64, 32)
        loss = (model(x) - target(x).detach()).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.5 * losses[0]
    assert optimizer.steps_taken == 60


def _worker(rank: int, world: int, port: int, queue: "multiprocessing.Queue[object]") -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        torch.manual_seed(0)
        model = load_causal_lm(TINY_MODEL, device="cpu")
        config = CONFIG.model_copy(update={"compression_chunk": 64, "compression_topk": 8,
                                           "clip_grad_norm": 1.0})
        optimizer = DisTrO(model.parameters(), config, TorchDistributedExchange(), lr=2e-3)
        data = LocalDataProvider(TRAIN_DATA, 32)
        losses = []
        for step in range(3):
            batch = data.get_samples(4 * step + 2 * rank, 4 * step + 2 * rank + 1)
            optimizer.zero_grad()
            loss = model(input_ids=batch, labels=batch).loss  # this loop's own objective
            loss.backward()
            optimizer.step()
            losses.append(float(loss))
        digest = hashlib.sha256()
        for p in model.parameters():
            digest.update(p.detach().numpy().tobytes())
        queue.put((rank, digest.hexdigest(), losses))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_gloo_workers_stay_bit_identical():
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    port = free_port()
    workers = [context.Process(target=_worker, args=(rank, 2, port, queue)) for rank in range(2)]
    for worker in workers:
        worker.start()
    results = {rank: (digest, losses) for rank, digest, losses in
               (queue.get(timeout=240) for _ in workers)}
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    (digest0, losses0), (digest1, losses1) = results[0], results[1]
    assert digest0 == digest1  # both applied the same two payloads, in rank order
    assert losses0 != losses1  # ... computed from different data
    untrained = hashlib.sha256()
    for p in load_causal_lm(TINY_MODEL, device="cpu").parameters():
        untrained.update(p.detach().numpy().tobytes())
    assert digest0 != untrained.hexdigest()


def test_sharded_parameters_are_refused_with_the_way_to_train_them():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        sharded = torch.nn.Parameter(distribute_tensor(torch.zeros(8, 8), mesh, [Shard(0)]))
        with pytest.raises(ValueError, match="ShardedDistroTrainer"):
            DisTrO([sharded], CONFIG, LocalExchange(), lr=1e-3)
    finally:
        dist.destroy_process_group()
