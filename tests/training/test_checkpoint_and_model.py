"""Model loading (directory, hub cache) and checkpoints that reload bit-identically."""

import shutil
from pathlib import Path

import pytest
import torch
from training_assets import TINY_MODEL
from transformers import AutoModelForCausalLM, AutoTokenizer

from client_image.training.checkpoint import (
    CheckpointError,
    list_checkpoints,
    save_checkpoint,
    upload_checkpoint,
)
from client_image.training.model import (
    ModelLoadError,
    load_causal_lm,
    pick_device,
    resolve_model_dir,
)


def test_tiny_model_dimensions_are_multiples_of_64():
    model = load_causal_lm(TINY_MODEL, device="cpu")
    cfg = model.config
    assert cfg.vocab_size % 64 == 0 and cfg.hidden_size % 64 == 0 and cfg.intermediate_size % 64 == 0
    tokenizer = AutoTokenizer.from_pretrained(TINY_MODEL)
    assert len(tokenizer) == cfg.vocab_size
    assert tokenizer.decode(tokenizer("def spam(): pass")["input_ids"]) == "def spam(): pass"


def test_bf16_load():
    model = load_causal_lm(TINY_MODEL, dtype="bf16", device="cpu")
    assert next(model.parameters()).dtype == torch.bfloat16


def test_checkpoint_reloads_in_transformers_with_identical_logits(tmp_path):
    model = load_causal_lm(TINY_MODEL, device="cpu")
    with torch.no_grad():  # make it differ from the bundled weights
        next(model.parameters()).add_(0.01)
    path = save_checkpoint(model, tmp_path, "run-a", 7, tokenizer_dir=TINY_MODEL)
    assert path.name == "run-a-step7"
    assert (path / "tokenizer.json").is_file() and (path / "config.json").is_file()
    reloaded = AutoModelForCausalLM.from_pretrained(path)
    for (name, a), (_, b) in zip(model.state_dict().items(), reloaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    ids = torch.arange(32).unsqueeze(0)
    model.eval()
    assert torch.equal(model(ids).logits, reloaded(ids).logits)
    AutoTokenizer.from_pretrained(path)


def test_only_the_newest_checkpoints_are_kept(tmp_path):
    model = load_causal_lm(TINY_MODEL, device="cpu")
    for step in (1, 2, 10, 3):
        save_checkpoint(model, tmp_path, "run-b", step, keep_steps=2)
    save_checkpoint(model, tmp_path, "other-run", 1, keep_steps=2)
    assert [s for s, _ in list_checkpoints(tmp_path, "run-b")] == [3, 10]
    assert [s for s, _ in list_checkpoints(tmp_path, "other-run")] == [1]
    assert not list(tmp_path.glob(".*partial"))


def test_bad_checkpoint_arguments_are_rejected(tmp_path):
    model = load_causal_lm(TINY_MODEL, device="cpu")
    with pytest.raises(CheckpointError, match="keep_steps"):
        save_checkpoint(model, tmp_path, "r", 1, keep_steps=0)
    with pytest.raises(CheckpointError, match="run id"):
        save_checkpoint(model, tmp_path, "../escape", 1)
    with pytest.raises(CheckpointError, match=r"no config\.json"):
        upload_checkpoint(tmp_path, "org/repo", 1, api=_RecordingHubApi())


class _RecordingHubApi:
    """Stands at huggingface_hub.HfApi's call boundary: no hub is reachable from the tests."""

    def __init__(self):
        self.calls = []

    def upload_folder(self, **kwargs):
        self.calls.append(kwargs)

        class CommitInfo:
            oid = "0123abcd"

        return CommitInfo()


def test_hub_upload_up_to_the_call_boundary_no_hub_reachable(tmp_path):
    path = save_checkpoint(load_causal_lm(TINY_MODEL, device="cpu"), tmp_path, "run-c", 4)
    api = _RecordingHubApi()
    assert upload_checkpoint(path, "org/model", 4, api=api) == "0123abcd"
    assert api.calls == [{
        "folder_path": str(path), "repo_id": "org/model", "repo_type": "model",
        "revision": None, "commit_message": "step 4",
    }]


def test_hub_repo_id_resolves_through_the_local_hf_cache(tmp_path, monkeypatch):
    # The cache layout huggingface_hub writes: models--org--name/{refs/main, snapshots/<rev>/}.
    cache = tmp_path / "hub"
    repo = cache / "models--psyche--tiny-llama"
    revision = "a" * 40
    snapshot = repo / "snapshots" / revision
    shutil.copytree(TINY_MODEL, snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    assert resolve_model_dir("psyche/tiny-llama", local_files_only=True) == snapshot
    model = load_causal_lm("psyche/tiny-llama", local_files_only=True, device="cpu")
    assert model.config.vocab_size == 4096
    with pytest.raises(ModelLoadError, match="unavailable"):
        resolve_model_dir("psyche/not-cached", local_files_only=True)


def test_model_source_errors_name_the_problem(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_causal_lm(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match=r"no config\.json"):
        load_causal_lm(tmp_path / "empty")
    (tmp_path / "empty" / "config.json").write_text("{}")
    with pytest.raises(ModelLoadError, match="safetensors"):
        load_causal_lm(tmp_path / "empty")
    with pytest.raises(ModelLoadError, match="unknown dtype"):
        load_causal_lm(TINY_MODEL, dtype="fp8")  # type: ignore[arg-type]  # deliberately invalid dtype
    with pytest.raises(ModelLoadError, match="unknown device"):
        pick_device("tpu")
    assert pick_device("auto").type in ("cpu", "cuda", "mps")
    assert isinstance(resolve_model_dir(TINY_MODEL), Path)
