"""Log-likelihood multiple-choice scoring on the bundled tiny Llama and its tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
import torch
from tokenizers import Tokenizer

from client_image.evals.catalog import load_task
from client_image.evals.scoring import (
    EvalDoc,
    accuracy,
    encode_pair,
    greedy_completion,
    score_doc,
)
from client_image.training.model import load_causal_lm

TINY_MODEL = Path(__file__).resolve().parents[2] / "assets" / "tiny-llama"


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(TINY_MODEL / "tokenizer.json"))


@pytest.fixture
def model() -> torch.nn.Module:
    return load_causal_lm(TINY_MODEL, device="cpu")


def hand_loglikelihood(model: torch.nn.Module, tokenizer: Tokenizer, context: str,
                       continuation: str) -> float:
    """sum_t log p(x_t | x_<t) over the continuation's tokens, one unpadded sequence."""
    context_ids = tokenizer.encode(context, add_special_tokens=False).ids
    whole = tokenizer.encode(context + continuation, add_special_tokens=False).ids
    assert whole[:len(context_ids)] == context_ids  # this tokenizer splits at the space
    with torch.no_grad():
        logits = model(torch.tensor([whole])).logits[0]
    total = 0.0
    for t in range(len(context_ids), len(whole)):
        total += float(torch.log_softmax(logits[t - 1], dim=-1)[whole[t]])
    return total


def test_a_docs_scores_are_the_hand_computed_sums_of_log_probabilities(
        model: torch.nn.Module, tokenizer: Tokenizer) -> None:
    doc = EvalDoc(context="Question: Which organ pumps blood through the body?\nAnswer:",
                  choices=("the heart", "a lung made of stone and glass", "brain"), gold=0)
    lls = score_doc(model, tokenizer, doc)  # one batch, right-padded: the choices differ
    expected = [hand_loglikelihood(model, tokenizer, doc.context, " " + c) for c in doc.choices]
    assert lls == pytest.approx(expected, abs=1e-4)
    assert all(ll < 0 for ll in lls)
    assert model.training  # put back in train mode
    model.eval()
    score_doc(model, tokenizer, doc)
    assert not model.training  # and an eval-mode model stays so


def test_acc_takes_the_largest_sum_and_acc_norm_the_largest_per_byte() -> None:
    doc = EvalDoc(context="q", choices=("a", "b" * 10), gold=1)
    # sums -2 and -5: acc picks choice 0; per byte -2 and -0.5: acc_norm picks choice 1
    score = accuracy(doc, [-2.0, -5.0])
    assert (score.acc, score.acc_norm) == (0.0, 1.0)
    assert EvalDoc("q", ("éé", "ab"), 0).choice_bytes(0) == 4  # UTF-8 bytes, not characters
    assert accuracy(EvalDoc("q", ("x", "y"), 0), [-1.0, -3.0]).acc == 1.0


def test_the_context_keeps_no_trailing_space_and_an_empty_context_is_end_of_text(
        tokenizer: Tokenizer) -> None:
    assert encode_pair(tokenizer, "Answer: ", "yes", 0) == encode_pair(
        tokenizer, "Answer:", " yes", 0)
    context, continuation = encode_pair(tokenizer, "", "Hello world", 7)
    assert context == [7]
    assert continuation == tokenizer.encode("Hello world", add_special_tokens=False).ids


def test_a_model_that_prefers_the_gold_answers_scores_one(
        model: torch.nn.Module, tokenizer: Tokenizer) -> None:
    """Trained on each document's context followed by its gold answer, the tiny model
    prefers the gold answers: acc and acc_norm are 1 over the task."""
    task = load_task("arc_easy")
    texts = [d.context + d.continuation(d.gold) for d in task.docs]
    rows = [tokenizer.encode(t, add_special_tokens=False).ids for t in texts]
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(80):
        loss = sum((model(torch.tensor([r]), labels=torch.tensor([r])).loss for r in rows),
                   torch.tensor(0.0))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scores = [accuracy(d, score_doc(model, tokenizer, d)) for d in task.docs]
        if all(s.acc == 1.0 and s.acc_norm == 1.0 for s in scores):
            break
    assert [s.acc for s in scores] == [1.0] * len(task.docs)
    assert [s.acc_norm for s in scores] == [1.0] * len(task.docs)


def test_the_prompt_task_is_the_models_greedy_continuation(
        model: torch.nn.Module, tokenizer: Tokenizer) -> None:
    prompt = "The most important thing to know is"
    text = greedy_completion(model, tokenizer, prompt, max_new_tokens=8)
    ids = tokenizer.encode(prompt, add_special_tokens=False).ids
    with torch.no_grad():
        generated = cast(Any, model).generate(torch.tensor([ids]), max_new_tokens=8, min_new_tokens=8,
                                   do_sample=False, pad_token_id=0)
    assert text == tokenizer.decode(generated[0, len(ids):].tolist(), skip_special_tokens=True)
    assert greedy_completion(model, tokenizer, prompt, max_new_tokens=8) == text
    assert model.training
