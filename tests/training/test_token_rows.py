"""DisTrO's `embeddings_per_token`: the embedding's and output head's rows are kept apart
(identity row basis), so a token no batch touched is never moved."""

import torch
from training_assets import TINY_MODEL, TRAIN_DATA

from client_image.training.defaults import DISTRO_PSYCHE
from client_image.training.distro import (
    BlockLayout,
    compress,
    decompress,
    decompress_blocks,
    plan_model,
)
from client_image.training.model import load_causal_lm
from client_image.training.trainer import DistroTrainer, trainable_parameters
from coordinator.config import ConstantLR
from psyche_common.token_files.local import LocalDataProvider


def _rows_touched(update: torch.Tensor) -> set[int]:
    return set(torch.nonzero(update.abs().sum(dim=1)).flatten().tolist())


def test_identity_rows_keep_an_update_on_the_rows_that_had_one():
    momentum = torch.zeros(128, 64)
    momentum[[3, 70]] = torch.randn(2, 64)
    apart, mixed = (plan_model([("embed", (128, 64))], 64, 8, token_rows=rows)
                    for rows in ({"embed"}, set()))
    assert not apart[0].mix_rows and mixed[0].mix_rows
    kept = decompress([compress([momentum], apart)], apart, torch.float32, "cpu")[0]
    assert _rows_touched(kept) == {3, 70}
    spread = decompress([compress([momentum], mixed)], mixed, torch.float32, "cpu")[0]
    assert len(_rows_touched(spread)) > 60  # the DCT along rows moves the whole block
    # The identity basis is orthonormal too: every coefficient kept gives the tensor back.
    full = plan_model([("embed", (128, 64))], 64, 64 * 64, token_rows={"embed"})
    back = decompress([compress([momentum], full)], full, torch.float32, "cpu")[0]
    torch.testing.assert_close(back, momentum)


def test_each_parameter_alone_and_grouped_decoding_agree_for_identity_rows():
    momentum, square = torch.randn(128, 64), torch.randn(64, 64)
    plans = plan_model([("embed", (128, 64)), ("w", (64, 64))], 64, 8, token_rows={"embed"})
    peers = [compress([momentum * s, square * s], plans) for s in (1.0, -0.5, 2.0)]
    layout = BlockLayout(plans)
    grouped = layout.scatter(decompress_blocks(peers, layout, torch.float32, "cpu"))
    for i, plan in enumerate(plans):
        alone = decompress([[p[i]] for p in peers], [plan], torch.float32, "cpu")[0]
        torch.testing.assert_close(alone, grouped[i], rtol=0, atol=1e-6)


def test_tokens_missing_from_the_batch_keep_their_embeddings():
    model = load_causal_lm(TINY_MODEL, device="cpu")
    config = DISTRO_PSYCHE.model_copy(update={"embeddings_per_token": True})
    trainer = DistroTrainer(model, config, ConstantLR(base_lr=1e-3, warmup_init_lr=0.0,
                                                       warmup_steps=0), micro_batch_size=2)
    names = {name for name, _ in trainable_parameters(model)}
    token_rows = {p.name for p in trainer.plans if not p.mix_rows}
    assert token_rows == {"model.embed_tokens.weight", "lm_head.weight"} <= names
    embedding = model.get_input_embeddings().weight
    before = embedding.detach().clone()
    batch = LocalDataProvider(TRAIN_DATA, 32).get_samples(0, 1)
    out = trainer.train(0, batch)
    assert trainer.apply(2, [trainer.decode(out.payload)])
    moved = _rows_touched(embedding.detach() - before)
    seen = set(batch.flatten().tolist())
    assert moved and moved <= seen  # only tokens of the batch (it has no weight decay)
