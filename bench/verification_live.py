"""Verification in whole local runs: for each live attack, a real testnet (TCP
coordinator, 3 client processes, the tiny model, CPU) where client 3 publishes dishonest
results (`psyche-client train --test-adversary KIND`), and one honest run. Prints one
line per run, then ONE JSON line. About a minute per run on 2 cores.

    .venv/bin/python -m bench.verification_live [--steps 16] [--attacks random_signs,...]

`verification_percent = 67`: every client is followed by both others (docs/
verification.md), one client trains per round. Per attack: whether the attacker was
ejected, the step of its first reported result, whether any honest result failed, whether
the two honest clients' checkpoints are identical, and the final loss over the honest
run's. The quantization is the local-testnet config's (1-bit), in
which a `scaled` result is byte for byte the honest one (only signs travel), so it is left
out of the default attacks.

JSON fields: ejected_<attack> (bool), first_report_step_<attack>,
honest_reported_<attack> (honest results that failed, 0 expected),
honest_identical_<attack>, loss_vs_honest_<attack>, honest_run_reports (reports in the
honest run, 0 expected), honest_run_verified (results verified there),
honest_run_identical.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import tempfile
from pathlib import Path
from typing import Any

from local_testnet.client_log import client_events
from local_testnet.config_variant import write_config_variant
from local_testnet.testnet import Testnet, TestnetOptions, run_headless

DEFAULT_ATTACKS = ("random_signs", "stale", "zeros", "flipped_signs", "wrong_batch")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _digests(work: Path, client: int) -> dict[str, str]:
    import hashlib
    out = {}
    for directory in sorted((work / f"client-{client}" / "checkpoints").glob("*-step*")):
        digest = hashlib.sha256()
        for file in sorted(directory.glob("*.safetensors")):
            digest.update(file.read_bytes())
        out[directory.name] = digest.hexdigest()
    return out


async def run_one(root: Path, steps: int, attack: str | None) -> dict[str, Any]:
    data_port = _free_port()
    config = write_config_variant(root / "config", data_port, total_steps=steps,
                                  epoch_time=30, warmup_time=25, verification_percent=67,
                                  min_clients=2)
    args = {3: ["--test-adversary", attack]} if attack else {}
    testnet = Testnet(TestnetOptions(
        num_clients=3, config_path=config, work_dir=root / "work", server_port=_free_port(),
        metrics_base_port=_free_port() - 4, timeout_s=600, client_args_of=args))
    summary = await run_headless(testnet)
    work = testnet.options.work_dir

    def events(client: int, name: str) -> list[dict[str, Any]]:
        return list(client_events(work, client, name))

    cheat = events(3, "started")[0]["identity"] if attack else None
    reports = [e for i in (1, 2, 3) for e in events(i, "verification_report")]
    ejected = events(3, "ejected") if attack else []
    digests = [_digests(work, i) for i in (1, 2)]
    return {
        "error": summary["error"], "last_loss": summary["last_loss"],
        "reports": len(reports), "reported": sorted({e["accused"][:12] for e in reports}),
        "first_report_step": min((e["of_step"] for e in reports), default=None),
        "ejected": bool(ejected),
        "verified": sum(len(events(i, "result_verified")) for i in (1, 2, 3)),
        "failed_honest": sum(1 for i in (1, 2, 3) for e in events(i, "result_verified")
                             if not e["ok"] and e["trainer"] != cheat),
        "honest_identical": bool(digests[0]) and digests[0] == digests[1],
        "left_out": sum(1 for i in (1, 2) for e in events(i, "result_left_out")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--attacks", default=",".join(DEFAULT_ATTACKS))
    args = parser.parse_args()
    attacks = [a for a in args.attacks.split(",") if a]
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="psyche-verify-live-") as scratch:
        honest = asyncio.run(run_one(Path(scratch) / "honest", args.steps, None))
        print(f"{'honest':>14}: {honest}")
        report.update(honest_run_reports=honest["reports"], honest_run_verified=honest["verified"],
                      honest_run_identical=honest["honest_identical"])
        for attack in attacks:
            result = asyncio.run(run_one(Path(scratch) / attack, args.steps, attack))
            print(f"{attack:>14}: {result}")
            loss = (result["last_loss"] / honest["last_loss"]
                    if result["last_loss"] and honest["last_loss"] else None)
            report.update({f"ejected_{attack}": result["ejected"],
                           f"first_report_step_{attack}": result["first_report_step"],
                           f"honest_reported_{attack}": result["failed_honest"],
                           f"honest_identical_{attack}": result["honest_identical"],
                           f"loss_vs_honest_{attack}": round(loss, 4) if loss else None})
    print(json.dumps(report))


if __name__ == "__main__":
    main()
