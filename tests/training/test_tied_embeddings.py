"""A joiner of a run whose model ties its output embedding to the input one: the shared
weights carry the tensor once, and the joiner's model must hold one tensor for both, equal
to its peer's (an untied head would keep its random init and diverge silently)."""

import json
import tomllib
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from client_image.runtime.worker import TrainingWorker
from client_image.training.checkpoint import bf16_state_dict
from coordinator.config import state_file_from_dict

LOCAL_TESTNET = Path(__file__).resolve().parents[2] / "config" / "local-testnet" / "state.toml"
LLM = state_file_from_dict(tomllib.loads(LOCAL_TESTNET.read_text())).model


async def test_a_joiner_of_a_tied_model_holds_one_embedding_tensor() -> None:
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         tie_word_embeddings=True)
    torch.manual_seed(3)
    peer = LlamaForCausalLM(config)
    shared = bf16_state_dict(peer)
    shared.pop("lm_head.weight", None)  # tied: sent once, under the embedding's name
    joiner = TrainingWorker(device="cpu", micro_batch_size=1)
    await joiner.load_from_peers(json.dumps(config.to_dict()), None, shared, LLM, start_step=1)
    model = joiner.model
    assert model is not None
    head, embedding = model.get_output_embeddings().weight, model.get_input_embeddings().weight
    assert head is embedding
    assert torch.equal(embedding, shared["model.embed_tokens.weight"].float())
    joiner.close()
