"""`psyche-train`: train a model with P simulated peers in one process, printing loss and bytes.

    psyche-train --model assets/tiny-llama --data assets/data/train --steps 100 \\
        --total-batch 16 --micro-batch 4 --peers 4 --optimizer distro|adamw|sparseloco

Defaults are client_image/training/defaults.py's (DisTrO: Psyche's settings). torch loads
inside the command, so `--help` and `--version` answer at once.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Literal

import typer

from client_image.training.defaults import DISTRO_PSYCHE, SPARSELOCO
from psyche_common.cli_conventions import PROGRAM_SETTINGS, version_option

app = typer.Typer(**PROGRAM_SETTINGS, add_completion=False)


@app.command()
def train(
    model: Annotated[Path, typer.Option(help="model directory (config.json + safetensors)")],
    data: Annotated[Path, typer.Option(help="directory of .ds/.bin/.npy token files")],
    steps: Annotated[int, typer.Option(min=1)] = 100,
    total_batch: Annotated[int, typer.Option(min=1, help="sequences per step, all peers")] = 16,
    micro_batch: Annotated[int, typer.Option(min=1)] = 4,
    peers: Annotated[int, typer.Option(min=1)] = 4,
    optimizer: Annotated[str, typer.Option(help="distro, adamw or sparseloco")] = "distro",
    seq_len: Annotated[int, typer.Option(min=2)] = 128,
    lr: Annotated[float | None, typer.Option(help="peak learning rate (default: tuned)")] = None,
    topk: Annotated[int, typer.Option(min=1)] = DISTRO_PSYCHE.compression_topk,
    chunk: Annotated[int, typer.Option(min=1)] = DISTRO_PSYCHE.compression_chunk,
    compression_decay: Annotated[float, typer.Option(min=0.0, max=1.0)] = (
        DISTRO_PSYCHE.compression_decay),
    inner_steps: Annotated[int, typer.Option(min=1, help="SparseLoCo: AdamW steps per round")] = (
        SPARSELOCO.inner_steps),
    topk_density: Annotated[float, typer.Option(min=1e-6, max=1.0, help="SparseLoCo")] = (
        SPARSELOCO.topk_density),
    quantize_1bit: Annotated[bool, typer.Option("--quantize-1bit/--no-quantize-1bit")] = True,
    device: str = "cpu",
    dtype: Annotated[str, typer.Option(help="fp32 or bf16")] = "fp32",
    seed: int = 0,
    val_data: Annotated[Path | None, typer.Option(help="validation token directory")] = None,
    checkpoint_dir: Annotated[Path | None, typer.Option()] = None,
    run_id: str = "psyche-train",
    keep_steps: Annotated[int, typer.Option(min=1)] = 3,
    hub_repo: Annotated[str | None, typer.Option(help="also upload the checkpoint (HF_TOKEN)")] = None,
    version: Annotated[bool, version_option("psyche-train")] = False,
) -> None:
    """Train a model with P simulated peers in one process, printing loss and bytes.

    Defaults are Psyche's DisTrO settings (client_image/training/defaults.py).
    """
    if optimizer not in ("distro", "adamw", "sparseloco"):
        raise typer.BadParameter(
            f"--optimizer must be distro, adamw or sparseloco, got {optimizer!r}")
    if dtype not in ("fp32", "bf16"):
        raise typer.BadParameter(f"--dtype must be fp32 or bf16, got {dtype!r}")
    if optimizer == "sparseloco" and steps % inner_steps:
        raise typer.BadParameter(f"--steps {steps} must be a multiple of --inner-steps {inner_steps}")
    from client_image.training.checkpoint import save_checkpoint, upload_checkpoint
    from client_image.training.simulate import (
        Simulation,
        SimulationConfig,
        default_schedule,
        validation_loss,
    )

    opt: Literal["distro", "adamw", "sparseloco"] = (
        "distro" if optimizer == "distro" else "adamw" if optimizer == "adamw" else "sparseloco")
    config = SimulationConfig(
        model=model, data=data, steps=steps, total_batch=total_batch, micro_batch=micro_batch,
        peers=peers, optimizer=opt, seq_len=seq_len, seed=seed, device=device,
        dtype="bf16" if dtype == "bf16" else "fp32",
    )
    config.distro = config.distro.model_copy(
        update={
            "compression_topk": topk, "compression_chunk": chunk,
            "quantize_1bit": quantize_1bit, "compression_decay": compression_decay,
        }
    )
    config.sparseloco = config.sparseloco.model_copy(
        update={"inner_steps": inner_steps, "topk_density": topk_density, "chunk": chunk})
    if opt == "sparseloco" and lr is not None:
        config.sparseloco = config.sparseloco.model_copy(update={"inner_lr": lr})
    config.lr_schedule = default_schedule(
        opt, steps, config.sparseloco.inner_lr if opt == "sparseloco" else lr)
    try:
        simulation = Simulation(config)
    except (ValueError, OSError, RuntimeError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(f"{simulation.params} parameters, {peers} peers, optimizer {opt}")
    started = time.perf_counter()
    for report in simulation.run():
        typer.echo(
            f"{'round' if opt == 'sparseloco' else 'step'} {report.step:5d}  "
            f"loss {report.loss:.4f}  "
            f"bytes/peer {report.payload_bytes_per_peer:9.0f}  dense fp32 {report.dense_fp32_bytes}"
        )
    summary: dict[str, float | str] = {"seconds": round(time.perf_counter() - started, 2)}
    validation = val_data or (data.parent / "validation")
    if validation.is_dir():
        summary["val_loss"] = validation_loss(simulation.model, validation, seq_len)
    if checkpoint_dir is not None:
        path = save_checkpoint(
            simulation.model, checkpoint_dir, run_id, steps - 1,
            tokenizer_dir=model, keep_steps=keep_steps,
        )
        summary["checkpoint"] = str(path)
        if hub_repo:
            summary["hub_revision"] = upload_checkpoint(path, hub_repo, steps - 1)
    typer.echo(json.dumps(summary))


def main() -> None:
    """Console-script entry point (psyche-train)."""
    app()


if __name__ == "__main__":
    main()
