"""Rebuild the bundled assets reproducibly: data set, tokenizer, token files, tiny model.

    .venv/bin/python scripts/build_assets.py [--deb python3.11-doc_*.deb] [--out assets]

1. Text: the reStructuredText sources of the Python 3.11 documentation from Debian's
   `python3.11-doc` package (PSF License 2.0), fetched with `apt-get download` unless
   `--deb` names the package file. Documents are read in sorted path order from a fixed
   list of sections until TEXT_BUDGET_CHARS characters; every VALIDATION_EVERY-th
   document is held out for validation. Stored as `data/documents.jsonl.xz`.
2. Tokenizer: a byte-level BPE trained with `tokenizers` on the training documents,
   vocabulary VOCAB_SIZE (a multiple of 64 so DCT chunks stay 64 wide).
3. Tokens: each document's ids followed by `<|endoftext|>`, written as Psyche's headerless
   little-endian u16 (TwoBytes) `.ds` files: `data/train/train-0000{0,1}.ds`,
   `data/validation/validation-00000.ds`.
4. Tiny model: a LlamaForCausalLM (hidden 128, 4 layers, intermediate 384, 4 heads) whose
   weights are drawn from torch's generator seeded with MODEL_SEED, stored as fp32
   safetensors beside the tokenizer in `tiny-llama/`.
"""

from __future__ import annotations

import argparse
import json
import lzma
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

TEXT_BUDGET_CHARS = 4_000_000
VALIDATION_EVERY = 20
VOCAB_SIZE = 4096
MODEL_SEED = 1234
EOS = "<|endoftext|>"
# Prose-heavy sections first; c-api, distutils and whatsnew (changelogs) are left out.
SECTIONS = ["tutorial", "howto", "faq", "reference", "using", "extending", "library"]
DOCS_PREFIX = "usr/share/doc/python3.11/html/_sources"


def fetch_deb(workdir: Path) -> Path:
    subprocess.run(["apt-get", "download", "python3.11-doc"], cwd=workdir, check=True)
    return next(workdir.glob("python3.11-doc_*.deb"))


def read_documents(deb: Path, workdir: Path) -> tuple[list[dict[str, str]], str]:
    root = workdir / "x"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    sources = root / DOCS_PREFIX
    documents: list[dict[str, str]] = []
    total = 0
    for section in SECTIONS:
        for path in sorted((sources / section).rglob("*.rst.txt")):
            text = path.read_text(encoding="utf-8").strip()
            if len(text) < 200 or total >= TEXT_BUDGET_CHARS:
                continue
            documents.append({"path": str(path.relative_to(sources)), "text": text})
            total += len(text)
    licence = (sources / "license.rst.txt").read_text(encoding="utf-8")
    return documents, licence


def train_tokenizer(texts: list[str]):  # -> tokenizers.Tokenizer
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    assert tokenizer.get_vocab_size() == VOCAB_SIZE, tokenizer.get_vocab_size()
    return tokenizer


def tokenize(tokenizer, texts: list[str]) -> np.ndarray:
    eos_id = tokenizer.token_to_id(EOS)
    ids: list[int] = []
    for encoding in tokenizer.encode_batch(texts):
        ids.extend(encoding.ids)
        ids.append(eos_id)
    return np.asarray(ids, dtype="<u2")


def build_model(out: Path, tokenizer) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    eos_id = tokenizer.token_to_id(EOS)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(MODEL_SEED)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS, bos_token=EOS)
    fast.save_pretrained(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deb", type=Path, help="python3.11-doc .deb (default: apt-get download)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "assets")
    args = parser.parse_args()
    out: Path = args.out
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        deb = args.deb.resolve() if args.deb else fetch_deb(workdir)
        documents, licence = read_documents(deb, workdir)

    validation = [d for i, d in enumerate(documents) if i % VALIDATION_EVERY == VALIDATION_EVERY - 1]
    train = [d for i, d in enumerate(documents) if i % VALIDATION_EVERY != VALIDATION_EVERY - 1]
    data = out / "data"
    for sub in ("train", "validation"):
        shutil.rmtree(data / sub, ignore_errors=True)
        (data / sub).mkdir(parents=True)
    with lzma.open(data / "documents.jsonl.xz", "wt", encoding="utf-8", preset=9) as f:
        for i, doc in enumerate(documents):
            split = "validation" if i % VALIDATION_EVERY == VALIDATION_EVERY - 1 else "train"
            f.write(json.dumps({**doc, "split": split}, ensure_ascii=False) + "\n")
    (data / "LICENSE-python-docs.rst").write_text(licence, encoding="utf-8")

    tokenizer = train_tokenizer([d["text"] for d in train])
    train_ids = tokenize(tokenizer, [d["text"] for d in train])
    # Two shards so that providers are exercised across file boundaries.
    half = len(train_ids) // 2
    train_ids[:half].tofile(data / "train" / "train-00000.ds")
    train_ids[half:].tofile(data / "train" / "train-00001.ds")
    tokenize(tokenizer, [d["text"] for d in validation]).tofile(
        data / "validation" / "validation-00000.ds"
    )

    model_dir = out / "tiny-llama"
    shutil.rmtree(model_dir, ignore_errors=True)
    build_model(model_dir, tokenizer)
    chars = sum(len(d["text"]) for d in documents)
    print(f"{len(documents)} documents, {chars} chars, {len(train_ids)} train tokens")


if __name__ == "__main__":
    main()
