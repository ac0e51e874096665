"""Log-likelihood multiple-choice scoring, as lm-eval scores its multiple-choice tasks.

    score_doc(model, tokenizer, doc)      the summed log-probability of each choice
    accuracy(doc, loglikelihoods)         acc and acc_norm of one document
    greedy_completion(model, tokenizer, prompt, max_new_tokens)   the prompt task

A document is a context ("Question: ...\\nAnswer:"), its choices ("Paris", "Rome"; each
scored as the continuation " Paris") and the index of the right one. For each choice c,
with its tokens x_1..x_n after the context's:

    ll(c)      = sum_{t=1..n} log p(x_t | context, x_<t)       (one forward pass per choice,
                                                                 all choices in one batch)
    acc        = 1 if argmax_c ll(c)            == gold else 0
    acc_norm   = 1 if argmax_c ll(c) / bytes(c) == gold else 0  (bytes(c): the choice's length
                                                                 in UTF-8 bytes, without the
                                                                 space that joins it)

Tokenization is lm-eval's `_encode_pair`: spaces that end the context move to the front of
the continuation, the pair is encoded whole, and the continuation's tokens are what follows
the context's own token count (so a merge across the boundary cannot drop a choice token).
No special tokens are added; an empty context is the end-of-text token. A sequence longer
than the model's context window keeps its last tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tokenizers import Tokenizer


@dataclass(frozen=True)
class EvalDoc:
    context: str
    choices: tuple[str, ...]  # as the data set words them ("Paris")
    gold: int
    delimiter: str = " "  # joins the context and a choice: the continuation is " Paris"

    def continuation(self, index: int) -> str:
        return self.delimiter + self.choices[index]

    def choice_bytes(self, index: int) -> int:
        """bytes(c): the choice's length in UTF-8 bytes (the delimiter not counted)."""
        return max(1, len(self.choices[index].encode()))


@dataclass(frozen=True)
class DocScore:
    acc: float
    acc_norm: float


def encode_pair(tokenizer: Tokenizer, context: str, continuation: str,
                end_of_text: int) -> tuple[list[int], list[int]]:
    """(context tokens, continuation tokens) as lm-eval splits them."""
    spaces = len(context) - len(context.rstrip(" "))
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = tokenizer.encode(context + continuation, add_special_tokens=False).ids
    context_len = len(tokenizer.encode(context, add_special_tokens=False).ids)
    if context_len == 0:
        return [end_of_text], whole
    return whole[:context_len], whole[context_len:]


def end_of_text_id(model: torch.nn.Module) -> int:
    eos = getattr(getattr(model, "config", None), "eos_token_id", None)
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    return int(eos) if eos is not None else 0


def context_window(model: torch.nn.Module) -> int:
    window = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return int(window) if window else 2048


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def loglikelihoods(model: torch.nn.Module, requests: Sequence[tuple[list[int], list[int]]]
                   ) -> list[float]:
    """ll of each (context tokens, continuation tokens), in one right-padded batch."""
    window = context_window(model)
    # Input = the sequence but its last token; logits at i predict token i + 1.
    sequences = [(ctx + cont)[-(window + 1):] for ctx, cont in requests]
    inputs = [seq[:-1] for seq in sequences]
    longest = max(len(i) for i in inputs)
    ids = torch.zeros((len(inputs), longest), dtype=torch.long)
    mask = torch.zeros((len(inputs), longest), dtype=torch.long)
    for row, tokens in enumerate(inputs):
        ids[row, :len(tokens)] = torch.tensor(tokens)
        mask[row, :len(tokens)] = 1
    device = model_device(model)
    logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.float()
    log_probs = torch.log_softmax(logits, dim=-1)
    out = []
    for row, ((_, cont), tokens) in enumerate(zip(requests, inputs, strict=True)):
        # The n continuation tokens are the sequence's last n: predicted at the n positions
        # that end the input.
        n = len(cont)
        positions = torch.arange(len(tokens) - n, len(tokens), device=device)
        targets = torch.tensor(cont, device=device)
        out.append(float(log_probs[row, positions, targets].sum()))
    return out


def score_doc(model: torch.nn.Module, tokenizer: Tokenizer, doc: EvalDoc) -> list[float]:
    """ll(c) of each choice of `doc` (the model put in eval mode, then back)."""
    eot = end_of_text_id(model)
    requests = [encode_pair(tokenizer, doc.context, doc.continuation(i), eot)
                for i in range(len(doc.choices))]
    was_training = model.training
    model.eval()
    try:
        return loglikelihoods(model, requests)
    finally:
        model.train(was_training)


def accuracy(doc: EvalDoc, lls: Sequence[float]) -> DocScore:
    best = max(range(len(lls)), key=lambda i: lls[i])
    best_norm = max(range(len(lls)), key=lambda i: lls[i] / doc.choice_bytes(i))
    return DocScore(acc=float(best == doc.gold), acc_norm=float(best_norm == doc.gold))


@torch.no_grad()
def greedy_completion(model: torch.nn.Module, tokenizer: Tokenizer, prompt: str,
                      max_new_tokens: int = 32) -> str:
    """The model's greedy continuation of `prompt` (argmax at each step), decoded."""
    ids = tokenizer.encode(prompt, add_special_tokens=False).ids or [end_of_text_id(model)]
    window = context_window(model)
    was_training = model.training
    model.eval()
    try:
        tokens = list(ids)
        device = model_device(model)
        for _ in range(max_new_tokens):
            logits = model(input_ids=torch.tensor([tokens[-window:]], device=device)).logits
            tokens.append(int(logits[0, -1].argmax()))
    finally:
        model.train(was_training)
    return tokenizer.decode(tokens[len(ids):], skip_special_tokens=True)
