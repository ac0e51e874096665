"""`psyche-client plan`, training/model_shape.py and training/memory_plan.py: meta-device
planning, sharding, fit.

Expected numbers are derived here from the model configs and state files (closed-form
parameter counts, the state's batch and optimizer), from real models and real encoded
results, or from measured memory; none is copied from the planner's own output.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import typer
from typer.testing import CliRunner

from client_image.cli import app
from client_image.formats.distro_wire import encode_result
from client_image.formats.replay_settings import ReplaySettings
from client_image.plan_cli import check_fits_or_exit
from client_image.training import memory_plan as mp
from client_image.training import model_shape as ms
from client_image.training.distro import compress, plan_model
from client_image.verification.settings import capture
from coordinator.config import load_state_file
from tests.training.training_assets import TINY_MODEL

ROOT = Path(__file__).resolve().parents[2]
DEV_STATE = ROOT / "config" / "llama2-20m-dev" / "state.toml"
TESTNET_STATE = ROOT / "config" / "local-testnet" / "state.toml"
LLAMA_1B = ROOT / "config" / "models" / "llama-1b" / "config.json"
LLAMA_8B = ROOT / "config" / "models" / "llama-8b" / "config.json"
GIB = 1 << 30

runner = CliRunner()


def _shape(source: Path) -> ms.ModelShape:
    return ms.describe_model(ms.meta_model(ms.load_model_config(source)))


def _llama_params(config: dict) -> int:
    """A Llama's parameter count from its config.json, term by term."""
    h, i, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    head_dim = config.get("head_dim", h // config["num_attention_heads"])
    q = config["num_attention_heads"] * head_dim
    kv = config["num_key_value_heads"] * head_dim
    attention = h * q + 2 * h * kv + q * h  # q, k, v, o projections (no biases)
    mlp = 3 * h * i  # gate, up, down
    per_layer = attention + mlp + 2 * h  # two RMSNorm weights
    embeddings = config["vocab_size"] * h * (1 if config["tie_word_embeddings"] else 2)
    return layers * per_layer + embeddings + h  # + the final norm


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


# ----------------------------------------------------------------- the model


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc (Linux)")
def test_meta_instantiation_of_8b_allocates_no_weights():
    _shape(TINY_MODEL)  # imports and transformers' lazy modules out of the measurement
    before = _rss()
    started = time.perf_counter()
    model = ms.meta_model(ms.load_model_config(LLAMA_8B))
    shape = ms.describe_model(model)
    plan = mp.plan_memory(shape, mp.run_settings(None), dp=8)
    elapsed = time.perf_counter() - started
    grown = _rss() - before
    assert all(p.is_meta for p in model.parameters())
    # 8.03 B fp32 weights would be 32 GB of storage; meta tensors have none.
    assert shape.n_params > 8 * 10**9
    assert grown < 256 * 2**20, f"RSS grew {grown / 2**20:.0f} MiB"
    assert elapsed < 1.0, f"planning the 8 B model took {elapsed:.2f} s"
    assert plan.parameters == 4 * plan.params_per_device


def test_parameter_count_equals_the_real_tiny_model():
    from transformers import AutoModelForCausalLM

    real = AutoModelForCausalLM.from_pretrained(TINY_MODEL)
    shape = _shape(TINY_MODEL)
    real_params = [(n, tuple(p.shape)) for n, p in real.named_parameters() if p.requires_grad]
    assert shape.n_params == sum(math.prod(s) for _, s in real_params)
    assert [(p.name, p.shape) for p in shape.params] == real_params
    config = json.loads((TINY_MODEL / "config.json").read_text())
    assert shape.n_params == _llama_params(config)


@pytest.mark.parametrize(("path", "billions"), [(LLAMA_1B, 1.24), (LLAMA_8B, 8.03)])
def test_llama_configs_have_their_published_sizes(path, billions):
    # Llama-3.2-1B (tied embeddings) is 1.24 B parameters, Llama-3.1-8B 8.03 B.
    config = json.loads(path.read_text())
    shape = _shape(path)
    assert shape.n_params == _llama_params(config)
    assert round(shape.n_params / 1e9, 2) == billions
    assert (shape.hidden, shape.layers, shape.kv_heads) == (
        config["hidden_size"], config["num_hidden_layers"], config["num_key_value_heads"])


def test_tensor_parallel_split_follows_the_llama_block_plan():
    shape = _shape(TINY_MODEL)
    styles = {p.name: p.tp_style for p in shape.params}
    assert styles["model.layers.0.self_attn.q_proj.weight"] == "colwise"
    assert styles["model.layers.3.mlp.down_proj.weight"] == "rowwise"
    assert styles["model.embed_tokens.weight"] is None
    assert styles["lm_head.weight"] is None
    assert styles["model.layers.0.input_layernorm.weight"] is None


# ----------------------------------------------------------------- sharding


@pytest.mark.parametrize(("dp", "tp"), [(2, 1), (4, 1), (1, 2), (2, 2), (1, 4)])
def test_sharding_divides_the_sharded_terms(dp, tp):
    shape = _shape(TINY_MODEL)
    run = mp.run_settings(load_state_file(TESTNET_STATE))
    one = mp.plan_memory(shape, run, compute="fp32")
    split = mp.plan_memory(shape, run, dp=dp, tp=tp, compute="fp32")
    # TP splits only the decoder blocks' projections (parallel.LLAMA_BLOCK_TP_PLAN);
    # embeddings, norms and the head stay whole on every TP rank. FSDP then splits all of
    # it over D. Every dimension of the tiny model divides by 4, so the shares are exact.
    projections = sum(p.numel for p in shape.params
                      if ".self_attn." in p.name or ".mlp." in p.name)
    whole = shape.n_params - projections
    expected = (projections // tp + whole) // dp
    assert split.params_per_device == expected
    for term in ("parameters", "gradients", "optimizer_state", "lookahead"):
        assert getattr(split, term) == 4 * expected, term
        assert getattr(one, term) == 4 * shape.n_params, term
    if tp == 1:
        assert one.parameters == dp * split.parameters
    # Activations and logits are per rank's micro-batch: D does not divide them...
    if tp == 1:
        assert split.logits == one.logits
    # ...T divides only the attention / MLP part of the activations.
    if tp > 1:
        assert one.activations / tp < split.activations < one.activations


def test_tensor_parallelism_must_divide_the_heads():
    shape = _shape(TINY_MODEL)  # 4 heads, 4 key/value heads, MLP 384
    with pytest.raises(ms.PlanError, match="num_attention_heads = 4"):
        mp.plan_memory(shape, mp.run_settings(None), tp=3)


# ----------------------------------------------------------------- the formulas


def test_wire_size_is_the_encoded_result_size():
    shape = _shape(TINY_MODEL)
    # The longest declaration the wire allows: 10-byte varints, 64-character texts.
    longest = ReplaySettings(compute="bf16", device="cpu", attention="efficient", onednn=True,
                             micro_batch=2**63, threads=2**63, torch_version="v" * 64,
                             hardware="h" * 64)
    typical = capture("bf16", 4, "cpu", threads=2)
    for chunk, topk, one_bit in ((16, 4, False), (64, 8, True), (64, 3, False)):
        plans = plan_model([(p.name, p.shape) for p in shape.params], chunk, topk)
        generator = torch.Generator().manual_seed(chunk + topk)
        # Gaussian values: no coefficient is zero, so every block carries k of them.
        tensors = [torch.randn(p.shape, generator=generator) for p in shape.params]
        sizes = {}
        for name, settings in (("longest", longest), ("typical", typical), ("none", None)):
            sizes[name] = len(encode_result(
                compress(tensors, plans), plans, step=7, trainer_nonce=3, batch_start=1,
                batch_end=2**40, one_bit=one_bit, settings=settings))
        assert mp.result_wire_bytes(plans, one_bit) == sizes["longest"]
        # The section is the only difference: at most 156 bytes, a real one far fewer.
        assert sizes["longest"] - sizes["none"] == 156
        assert 0 < sizes["typical"] - sizes["none"] < 80


def test_terms_scale_with_the_micro_batch_and_checkpointing_keeps_less():
    shape = _shape(LLAMA_1B)
    run = mp.run_settings(None)
    plans = [mp.plan_memory(shape, run, micro_batch_size=m) for m in (1, 2, 5)]
    # Activations and logits are per sequence: linear in the micro-batch, the rest fixed.
    assert plans[1].activations == 2 * plans[0].activations
    assert plans[2].logits == 5 * plans[0].logits
    assert plans[2].logits == 12 * 5 * run.seq_len * shape.vocab
    assert plans[0].parameters == plans[2].parameters
    checkpointed = mp.plan_memory(shape, run, micro_batch_size=2, activation_checkpointing=True)
    assert checkpointed.activations < plans[1].activations / 4
    # What checkpointing keeps is at least every layer's input (2048 fp32 values a token).
    assert checkpointed.activations > shape.layers * 2 * run.seq_len * shape.hidden * 4
    # DisTrO's delta is fp32 whatever the compute dtype (precision.py).
    fp32 = mp.plan_memory(shape, run, compute="fp32")
    assert fp32.optimizer_state == plans[0].optimizer_state == 4 * shape.n_params


def test_largest_micro_batch_is_monotone_in_memory_and_exact():
    shape = _shape(LLAMA_1B)
    run = mp.run_settings(None)
    sizes = (8, 24, 40, 48, 80, 141, 400)
    found = {gib: mp.max_micro_batch(shape, run, gib * GIB, compute="bf16") for gib in sizes}
    assert list(found.values()) == sorted(found.values())
    assert found[8] == 0 and found[400] > found[40] > 0
    for gib in (40, 80, 141):
        device, largest = gib * GIB, found[gib]
        assert mp.fits(mp.plan_memory(shape, run, micro_batch_size=largest), device) is None
        assert mp.fits(mp.plan_memory(shape, run, micro_batch_size=largest + 1), device)


def test_a_run_that_does_not_fit_gets_a_one_line_reason():
    shape = _shape(LLAMA_8B)
    plan = mp.plan_memory(shape, mp.run_settings(None), reserve_bytes=mp.CUDA_RESERVE_BYTES)
    # 8 B fp32 weights, gradients, delta and the lookahead copy alone are 128 GB.
    assert plan.persistent + plan.lookahead > 4 * 4 * 8 * 10**9
    reason = mp.fits(plan, 80 * GIB)
    assert reason is not None and "\n" not in reason
    assert "80.00 GiB" in reason and mp.human_bytes(plan.total) in reason
    assert mp.fits(plan, plan.total) is None
    assert mp.fits(plan, plan.total - 1) is not None


# A child process: glibc keeps freed heap resident unless told otherwise, which would count
# the allocator's slack instead of the live tensors the plan is about.
_MEASURE = textwrap.dedent("""
    import gc, json, sys
    from pathlib import Path
    import torch
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM, LlamaConfig
    from client_image.training.trainer import DistroTrainer
    from coordinator.config import ConstantLR, DistroOptimizer

    def status(key):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1]) * 1024

    config = LlamaConfig(hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=8000,
                         tie_word_embeddings=False, max_position_embeddings=256)
    warm = AutoModelForCausalLM.from_config(LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        vocab_size=64))
    warm(input_ids=torch.zeros(1, 8, dtype=torch.long),
         labels=torch.zeros(1, 8, dtype=torch.long)).loss.backward()
    del warm
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    base = status("VmRSS")
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    optimizer = DistroOptimizer(compression_decay=0.999, compression_chunk=64,
                                compression_topk=8, quantize_1bit=True)
    trainer = DistroTrainer(model, optimizer, ConstantLR(base_lr=1e-3, warmup_init_lr=0.0,
                            warmup_steps=0), micro_batch_size=4)
    batch = torch.randint(0, 8000, (4, 128), generator=torch.Generator().manual_seed(0))
    first = trainer.train(0, batch)
    trainer.train(1, batch)
    trainer.apply(2, [trainer.decode(first.payload) for _ in range(6)])
    trainer.train(2, batch)
    print(json.dumps({"peak": status("VmHWM") - base}))
""")


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_plan_bounds_the_measured_peak_of_real_training_steps():
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072",
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", _MEASURE], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    measured = json.loads(done.stdout.strip().splitlines()[-1])["peak"]
    from transformers import LlamaConfig

    config = LlamaConfig(hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=8000,
                         tie_word_embeddings=False, max_position_embeddings=256)
    shape = ms.describe_model(ms.meta_model(config))
    run = mp.RunSettings("measured", 128, 6, mp.DistroSettings(64, 8, True))
    plan = mp.plan_memory(shape, run, micro_batch_size=4, compute="fp32")
    # An upper bound of the live bytes, and not a wild one.
    assert measured <= plan.total <= 1.6 * measured, (measured, plan.total)


# ----------------------------------------------------------------- run settings


def test_run_settings_come_from_the_state_file():
    dev = mp.run_settings(load_state_file(DEV_STATE))
    # max_seq_len 512; at most min(256 clients, global batch 4) results a step; a client
    # gets at most ceil(4 / min_clients 2) sequences; DisTrO chunk 16, top-k 4, no 1-bit.
    assert (dev.seq_len, dev.peers, dev.client_batch) == (512, 4, 2)
    assert dev.distro == mp.DistroSettings(16, 4, False)
    assert dev.rank_share(2) == 1
    testnet = mp.run_settings(load_state_file(TESTNET_STATE), peers=3)
    assert (testnet.seq_len, testnet.peers, testnet.client_batch) == (128, 3, 12)
    assert testnet.distro == mp.DistroSettings(64, 8, True)


# ----------------------------------------------------------------- the CLI


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An HF cache holding only a config.json for the dev run's emozilla/llama2-20m-init
    (the tiny model's, standing in: the test is about the lookup, not the size)."""
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    return cache


def _put_in_cache(cache: Path, repo_id: str, config: Path) -> None:
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    revision = "b" * 40
    (repo / "snapshots" / revision).mkdir(parents=True)
    shutil.copy(config, repo / "snapshots" / revision / "config.json")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)


def test_cli_plans_the_llama2_20m_dev_run_from_the_hf_cache(hub_cache):
    _put_in_cache(hub_cache, "emozilla/llama2-20m-init", TINY_MODEL / "config.json")
    result = runner.invoke(app, ["plan", "--state", str(DEV_STATE), "--gpus", "1",
                                 "--gpu-memory-gib", "24"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    n = _llama_params(json.loads((TINY_MODEL / "config.json").read_text()))
    assert f"({n:,})" in out and "emozilla/llama2-20m-init" in out
    assert "consilience-llama2-20m-fineweb: seq_len 512" in out and "compute bf16" in out
    plans = plan_model([(p.name, p.shape) for p in _shape(TINY_MODEL).params], 16, 4)
    assert f"4 peers x {mp.human_bytes(mp.result_wire_bytes(plans, False))}" in out
    for label in ("parameters (fp32 master)", "gradients (fp32)", "DisTrO state (fp32 delta)",
                  "activations", "logits", "peers' results", "total"):
        assert label in out, label
    assert "fits: yes" in out and "largest micro-batch that fits:" in out
    # A client of this run trains at most 2 sequences a step: that is all a micro-batch holds.
    assert "a rank trains at most 2 sequences per step" in out


def test_cli_plans_the_local_testnet_run_without_a_gpu():
    result = runner.invoke(app, ["plan", "--state", str(TESTNET_STATE)])
    assert result.exit_code == 0, result.output
    out = result.stdout
    n = _llama_params(json.loads((TINY_MODEL / "config.json").read_text()))
    assert f"({n:,})" in out and "local-testnet: seq_len 128" in out
    assert "12 peers" in out
    if not torch.cuda.is_available():
        assert "compute fp32" in out and "no fit verdict" in out
    fp32_weights = f"{4 * n:>15,}"
    assert "parameters (fp32 master)" in out and fp32_weights in out


def test_cli_model_config_overrides_the_state_model_and_reports_no_fit():
    # One 80 GiB GPU cannot hold an 8 B model's fp32 weights, gradients, delta and
    # lookahead copy (4 x 32 GB) ...
    alone = runner.invoke(app, ["plan", "--state", str(TESTNET_STATE), "--model-config",
                                str(LLAMA_8B), "--gpus", "1", "--gpu-memory-gib", "80"])
    assert alone.exit_code == 1, alone.output
    assert "8.03 B parameters" in alone.stdout and "fits: NO" in alone.stdout
    # ... eight can: everything persistent is sharded 8 ways, and the sharded DisTrO step
    # works one parameter at a time (sharded.py), so its scratch is the embedding's.
    spread = runner.invoke(app, ["plan", "--state", str(TESTNET_STATE), "--model-config",
                                 str(LLAMA_8B), "--gpus", "8", "--gpu-memory-gib", "80",
                                 "--data-parallelism", "8"])
    assert spread.exit_code == 0, spread.output
    assert "D=8 x T=1" in spread.stdout and "fits: yes" in spread.stdout


def test_cli_without_a_state_needs_a_model_config():
    result = runner.invoke(app, ["plan"])
    assert result.exit_code == 2
    assert result.stderr.strip().startswith("error:") and "--model-config" in result.stderr


def _invalid_state(tmp_path: Path) -> Path:
    text = TESTNET_STATE.read_text().replace("min_clients = 1", "min_clients = 0", 1)
    path = tmp_path / "state.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("make_args", "needle"), [
    (lambda tmp: ["--state", str(tmp / "missing.toml")], "missing.toml"),
    (lambda tmp: ["--state", str(_invalid_state(tmp))], "min_clients"),
    (lambda tmp: ["--model-config", str(tmp / "nope" / "config.json")], "does not exist"),
    (lambda tmp: ["--model-config", str(_write(tmp / "bad.json", "{not json"))],
     "transformers cannot read"),
    (lambda tmp: ["--model-config", str(_write(tmp / "odd.json", '{"model_type": "nonsense"}'))],
     "nonsense"),
    (lambda tmp: ["--model-config", str(LLAMA_1B), "--gpus", "8", "--gpu-memory-gib", "80",
                  "--data-parallelism", "3"], "does not divide --gpus 8"),
    (lambda tmp: ["--model-config", str(LLAMA_1B), "--gpus", "6", "--gpu-memory-gib", "80",
                  "--tensor-parallelism", "3", "--data-parallelism", "2"],
     "tensor parallelism 3 does not divide num_attention_heads = 32"),
    (lambda tmp: ["--state", str(DEV_STATE)], "--model-config"),  # not in the (empty) cache
])
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, hub_cache, make_args, needle):
    result = runner.invoke(app, ["plan", *make_args(tmp_path)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    assert needle in lines[0]
    assert "Traceback" not in result.output and result.stdout == ""


@pytest.mark.skipif(torch.cuda.is_available(), reason="reads the local GPU's memory instead")
def test_cli_gpus_without_memory_on_a_cpu_host_is_an_error():
    result = runner.invoke(app, ["plan", "--model-config", str(LLAMA_1B), "--gpus", "2"])
    assert result.exit_code == 2
    assert "--gpu-memory-gib" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# ----------------------------------------------------------------- check_fits_or_exit


def test_check_fits_or_exit_on_cpu(monkeypatch, capsys):
    plan = check_fits_or_exit(TESTNET_STATE, "cpu", "auto", micro_batch_size=4)
    assert plan.compute == "fp32" and plan.micro_batch_size == 4 and plan.reserve == 0
    monkeypatch.setattr(mp, "available_system_memory", lambda: plan.total - 1)
    with pytest.raises(typer.Exit) as exited:
        check_fits_or_exit(TESTNET_STATE, "cpu", "auto", micro_batch_size=4)
    assert exited.value.exit_code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not fit on cpu" in err[0]
    monkeypatch.setattr(mp, "available_system_memory", lambda: plan.total)
    assert check_fits_or_exit(TESTNET_STATE, "cpu", "auto", micro_batch_size=4) == plan


def test_check_fits_or_exit_takes_a_model_and_reads_system_memory():
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(TINY_MODEL)
    plan = check_fits_or_exit(model, "cpu", "fp32", state=load_state_file(TESTNET_STATE))
    assert plan.n_params == sum(p.numel() for p in model.parameters())
    assert plan.seq_len == 128
    available = mp.available_system_memory()
    total = next(int(line.split()[1]) * 1024 for line in
                 Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal:"))
    assert 0 < available <= total
