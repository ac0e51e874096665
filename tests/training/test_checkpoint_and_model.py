"""Model loading (directory, hub cache) and checkpoints: bf16, Psyche- and transformers-readable
config, normal file modes, shards; the cooldown's bf16 rounding."""

import copy
import json
import os
import re
import resource
import shutil
import signal
import stat
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from training_assets import TINY_MODEL
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from client_image.training.checkpoint import (
    CheckpointError,
    checkpoint_config,
    checkpoint_dir_problem,
    list_checkpoints,
    save_checkpoint,
    upload_checkpoint,
)
from client_image.training.model import (
    ModelLoadError,
    load_causal_lm,
    pick_device,
    resolve_model_dir,
    round_to_bf16_,
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


def _perturbed(source=TINY_MODEL, **load):
    """The model of `source`, moved off its stored weights (and off bf16 values)."""
    model = load_causal_lm(source, device="cpu", **load)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 1e-3)
    return model


def _rounded_copy(model):
    rounded = copy.deepcopy(model)
    round_to_bf16_(rounded)
    return rounded.eval()


def _logits(model):
    ids = torch.arange(48).reshape(2, 24)
    with torch.no_grad():
        return model.eval()(ids).logits


def _same_weights(model, reloaded):
    """Bit-identical weights, compared in the reloaded model's dtype (a bf16 value is exact
    in fp32 and back)."""
    ours = model.state_dict()
    theirs = reloaded.state_dict()
    assert ours.keys() == theirs.keys()
    for name, tensor in theirs.items():
        assert torch.equal(ours[name].to(tensor.dtype), tensor), name


def test_checkpoint_is_bf16_and_plain_transformers_reads_the_bf16_rounded_model(tmp_path):
    model = _perturbed()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    path = save_checkpoint(model, tmp_path, "run-a", 7, tokenizer_dir=TINY_MODEL)
    assert path.name == "run-a-step7"
    # Saving leaves the model alone: rounding what is kept in memory is the cooldown's job.
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert {t.dtype for t in load_file(path / "model.safetensors").values()} == {torch.bfloat16}
    rounded = _rounded_copy(model)
    assert not torch.equal(_logits(model), _logits(rounded))  # the rounding is real
    reloaded = AutoModelForCausalLM.from_pretrained(path)  # no dtype: the config's
    assert reloaded.dtype == torch.float32  # what the original config.json says
    _same_weights(rounded, reloaded)
    assert torch.equal(_logits(rounded), _logits(reloaded))
    _same_weights(rounded, AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16))
    AutoTokenizer.from_pretrained(path)
    assert (path / "generation_config.json").read_bytes() == (TINY_MODEL / "generation_config.json").read_bytes()


def test_rounding_to_bf16_is_in_place_idempotent_and_keeps_the_training_dtype():
    model = _perturbed()
    round_to_bf16_(model)
    once = {k: v.clone() for k, v in model.state_dict().items()}
    assert all(v.dtype == torch.float32 for v in once.values())
    assert all(torch.equal(v, v.to(torch.bfloat16).float()) for v in once.values())
    round_to_bf16_(model)
    assert all(torch.equal(once[k], v) for k, v in model.state_dict().items())
    # RoPE frequencies are no weights: recomputed on load, so never rounded.
    fresh = load_causal_lm(TINY_MODEL, device="cpu")
    assert torch.equal(model.model.rotary_emb.inv_freq, fresh.model.rotary_emb.inv_freq)


def _variant(tmp_path, name, edit):
    """tiny-llama with an edited config.json (same weights and tokenizer)."""
    directory = tmp_path / name
    shutil.copytree(TINY_MODEL, directory)
    config = json.loads((TINY_MODEL / "config.json").read_text())
    edit(config)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return directory, config


def _transformers4_layout(config):
    """How transformers 4 and Psyche's own configs say it (Llama 3: rope_theta 500 000)."""
    del config["rope_parameters"], config["dtype"]
    config.update(rope_theta=500000.0, torch_dtype="bfloat16", transformers_version="4.44.0",
                  rope_scaling=None)


def _transformers5_layout(config):
    config["rope_parameters"] = {"rope_theta": 500000.0, "rope_type": "default"}


def _transformers5_llama3_rope(config):
    config["rope_parameters"] = {
        "rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 512,
    }


def _psyche_reads(config):
    """What Psyche's Rust loader (and transformers 4) take from a config.json: top-level
    rope_theta, 10 000 when missing, and the rope_scaling table."""
    return config.get("rope_theta", 10000.0), config.get("rope_scaling")


@pytest.mark.parametrize("layout", [_transformers4_layout, _transformers5_layout,
                                    _transformers5_llama3_rope])
def test_rope_theta_500000_and_every_original_field_survive(tmp_path, layout):
    source, original = _variant(tmp_path, "rope-500k", layout)
    model = _perturbed(source)
    assert model.config.rope_parameters["rope_theta"] == 500000.0
    path = save_checkpoint(model, tmp_path / "ckpt", "run", 3, tokenizer_dir=source)
    written = json.loads((path / "config.json").read_text())
    for key, value in original.items():
        assert written[key] == value, key
    # Psyche (and transformers 4) read the same RoPE as the model in memory ...
    theta, scaling = _psyche_reads(written)
    assert theta == 500000.0
    rope = model.config.rope_parameters
    if rope["rope_type"] == "default":
        assert scaling is None
    else:
        assert scaling == {k: v for k, v in rope.items() if k != "rope_theta"}
    # ... and so does the installed transformers.
    assert AutoConfig.from_pretrained(path).rope_parameters == rope
    rounded = _rounded_copy(model)
    reloaded = AutoModelForCausalLM.from_pretrained(path)
    # In the dtype the original config.json names (torch_dtype bfloat16), else fp32.
    assert reloaded.dtype == (torch.bfloat16 if layout is _transformers4_layout else torch.float32)
    _same_weights(rounded, reloaded)
    reloaded = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)  # as we train
    assert torch.equal(reloaded.model.rotary_emb.inv_freq, model.model.rotary_emb.inv_freq)
    assert torch.equal(_logits(rounded), _logits(reloaded))


def test_the_original_config_is_found_where_the_model_was_loaded_from(tmp_path):
    source, _ = _variant(tmp_path, "rope-500k", _transformers4_layout)
    model = load_causal_lm(source, device="cpu")
    assert checkpoint_config(model)["torch_dtype"] == "bfloat16"
    path = save_checkpoint(model, tmp_path / "ckpt", "run", 1)  # no tokenizer_dir given
    assert json.loads((path / "config.json").read_text())["rope_theta"] == 500000.0
    assert (path / "tokenizer.json").is_file()


def test_a_model_built_in_memory_gets_a_config_both_layouts_read(tmp_path):
    fields = json.loads((TINY_MODEL / "config.json").read_text())
    fields.update(rope_parameters={"rope_theta": 500000.0, "rope_type": "default"})
    config = AutoConfig.for_model(**fields)  # no source directory, so no original config.json
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    path = save_checkpoint(model, tmp_path, "built", 1)
    written = json.loads((path / "config.json").read_text())
    assert _psyche_reads(written) == (500000.0, None)
    reloaded = AutoModelForCausalLM.from_pretrained(path)
    assert torch.equal(_logits(_rounded_copy(model)), _logits(reloaded))
    # Tied embeddings are not exercised here: after other tests ran clients in this process,
    # from_config of a tied config sometimes leaves the weights untied (under
    # investigation; the bundled model is untied).


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o027, 0o640)])
def test_checkpoint_files_get_the_mode_of_normal_files(tmp_path, umask, mode):
    previous = os.umask(umask)
    try:
        path = save_checkpoint(load_causal_lm(TINY_MODEL, device="cpu"), tmp_path, "modes", 1,
                               tokenizer_dir=TINY_MODEL)
    finally:
        os.umask(previous)
    files = sorted(p.name for p in path.iterdir())
    assert "model.safetensors" in files and "tokenizer.json" in files
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in path.iterdir()} == dict.fromkeys(files, mode)


def test_a_checkpoint_bigger_than_a_shard_is_split_with_an_index(tmp_path):
    model = _perturbed()
    path = save_checkpoint(model, tmp_path, "sharded", 2, tokenizer_dir=TINY_MODEL,
                           max_shard_bytes=1 << 20)
    shards = sorted(p.name for p in path.glob("*.safetensors"))
    assert len(shards) > 1 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    index = json.loads((path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(shards)
    for shard in shards:  # tensor bytes within the limit, as Psyche counts (a bigger tensor sits alone)
        sizes = [t.nbytes for t in load_file(path / shard).values()]
        assert sum(sizes) <= 1 << 20 or len(sizes) == 1, shard
    assert all(stat.S_IMODE(p.stat().st_mode) == stat.S_IMODE(path.joinpath("config.json").stat().st_mode)
               for p in path.iterdir())
    assert torch.equal(_logits(_rounded_copy(model)),
                       _logits(AutoModelForCausalLM.from_pretrained(path)))


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


def test_a_failed_write_is_a_checkpoint_error_and_keeps_the_earlier_checkpoints(tmp_path):
    """The file system refuses the write midway (here: a file size limit, as a full disk
    would): one CheckpointError naming the step, the directory and the cause; no partial
    files left, the earlier checkpoint untouched."""
    model = load_causal_lm(TINY_MODEL, device="cpu")
    earlier = save_checkpoint(model, tmp_path, "run-f", 1)
    before = {p.name: p.stat().st_size for p in earlier.iterdir()}
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a signal
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, limits[1]))
    try:
        with pytest.raises(CheckpointError) as failed:
            save_checkpoint(model, tmp_path, "run-f", 2)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)
    assert str(failed.value).startswith(
        f"the checkpoint of step 2 was not written to {tmp_path}: "), failed.value
    assert "File too large" in str(failed.value) or "27" in str(failed.value), failed.value
    assert [s for s, _ in list_checkpoints(tmp_path, "run-f")] == [1]
    assert not list(tmp_path.glob(".*partial"))
    assert {p.name: p.stat().st_size for p in earlier.iterdir()} == before
    # A checkpoint directory that became a file: the same, at the first step of the write.
    (tmp_path / "gone").write_text("")
    with pytest.raises(CheckpointError, match=f"not written to {tmp_path / 'gone'}: "):
        save_checkpoint(model, tmp_path / "gone", "run-f", 3)


@pytest.mark.parametrize(("make", "problem"), [
    (lambda d: d.write_text("x"), "is a file, not a directory"),
    (lambda d: None, None),  # missing: created, as the first save would
    (lambda d: d.mkdir(), None),
])
def test_the_checkpoint_dir_is_checked_before_the_run(tmp_path, make, problem):
    directory = tmp_path / "checkpoints"
    make(directory)
    found = checkpoint_dir_problem(directory)
    assert found == (None if problem is None else f"{directory} {problem}")
    if problem is None:
        assert directory.is_dir() and list(directory.iterdir()) == []  # the probe is gone


def test_a_checkpoint_dir_that_cannot_be_written_is_named_with_the_cause(tmp_path):
    (tmp_path / "file").write_text("x")
    assert checkpoint_dir_problem(tmp_path / "file" / "sub") == (
        f"{tmp_path / 'file' / 'sub'}: cannot write there (Not a directory)")
    # A directory that takes no files: the probe tells (root ignores permission bits, and
    # /proc takes files from no one).
    problem = checkpoint_dir_problem(Path("/proc"))
    assert problem is not None and problem.startswith("/proc: cannot write there ("), problem


class _RecordingHubApi:
    """Stands at huggingface_hub.HfApi's call boundary: no hub is reachable from the tests."""

    def __init__(self, oid: object = "0123abcd" * 5):
        self.calls: list[dict[str, object]] = []
        self.oid = oid

    def upload_folder(self, **kwargs):
        self.calls.append(kwargs)

        class CommitInfo:
            oid = self.oid

        return CommitInfo()


def test_hub_upload_up_to_the_call_boundary_no_hub_reachable(tmp_path):
    path = save_checkpoint(load_causal_lm(TINY_MODEL, device="cpu"), tmp_path, "run-c", 4)
    api = _RecordingHubApi()
    assert upload_checkpoint(path, "org/model", 4, api=api) == "0123abcd" * 5
    assert api.calls == [{
        "folder_path": str(path), "repo_id": "org/model", "repo_type": "model",
        "revision": None, "commit_message": "step 4",
    }]
    # The coordinator takes only a commit id: an answer without one is an upload error.
    for oid in ("0123abcd", "refs/pr/1", None, "https://huggingface.co/org/model/commit/x"):
        expected = f"without a commit id (got {oid!r})"
        with pytest.raises(CheckpointError, match=re.escape(expected)):
            upload_checkpoint(path, "org/model", 4, api=_RecordingHubApi(oid))


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
