"""SparseLoCo's frontier: its loss over dense DiLoCo's (same H, same seeds) against its
bytes ratio over dense fp32 AdamW, from runs of bench/optimizers.py written with --jsonl.

    .venv/bin/python -m bench.sparseloco_frontier --diloco RUN.jsonl \\
        --point "1/40, 2-bit=RUN1.jsonl" --point "..." [--out bench/results/NAME]

Each --point is a label and a --jsonl file of one SparseLoCo setting (its own outer-lr grid
on the first seed, the chosen point on the others, as bench/optimizers.py runs it); the
--diloco file holds DiLoCo's runs (the setting chosen on its first seed). A point's ratio is
the mean over the seeds both ran of SparseLoCo's val loss over DiLoCo's. Writes OUT.md (the
table) and OUT.png (the frontier, with the target box: ratio <= 1.02 at >= 1000x) and
prints, last, one JSON line with every point.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from bench.optimizers import chosen_settings, read_outcomes

TARGET_LOSS_RATIO = 1.02
TARGET_BYTES_RATIO = 1000.0


def chosen_by_seed(records: list[dict[str, Any]], method: str) -> dict[int, dict[str, Any]]:
    """The method's record per seed at the setting chosen on its first seed."""
    mine = [r for r in records if r["method"] == method]
    if not mine:
        raise SystemExit(f"no {method} runs in the given file")
    setting = chosen_settings(mine)[method]
    return {int(r["seed"]): r for r in mine if r["setting"] == setting}


def frontier(diloco: dict[int, dict[str, Any]], points: list[tuple[str, Path]]
             ) -> list[dict[str, Any]]:
    rows = []
    for label, path in points:
        sparse = chosen_by_seed(read_outcomes([path]), "sparseloco")
        seeds = sorted(set(sparse) & set(diloco))
        if not seeds:
            raise SystemExit(f"{path}: no seed in common with the DiLoCo runs")
        ratios = [sparse[s]["val_loss"] / diloco[s]["val_loss"] for s in seeds]
        rows.append({"label": label, "seeds": seeds,
                     "setting": sparse[seeds[0]]["setting"],
                     "val_loss": round(statistics.fmean(sparse[s]["val_loss"] for s in seeds), 4),
                     "sparseloco_vs_diloco": round(statistics.fmean(ratios), 4),
                     "spread": round(max(ratios) - min(ratios), 4),
                     "bytes_ratio": round(statistics.fmean(sparse[s]["bytes_ratio"]
                                                           for s in seeds), 1)})
    return rows


def write_table(rows: list[dict[str, Any]], path: Path) -> None:
    lines = ["| setting | seeds | outer lr chosen | val loss | vs DiLoCo | spread | bytes ratio |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['label']} | {' '.join(map(str, r['seeds']))} | {r['setting']} | "
              f"{r['val_loss']:.4f} | {r['sparseloco_vs_diloco']:.4f} | {r['spread']:.4f} | "
              f"{r['bytes_ratio']:.0f} |" for r in rows]
    path.write_text("\n".join(lines) + "\n")


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 5))
    axes.fill_between([TARGET_BYTES_RATIO, 4000], 0.99, TARGET_LOSS_RATIO, color="tab:green",
                      alpha=0.15, label="target: <= 1.02 at >= 1000x")
    for row in rows:
        axes.scatter(row["bytes_ratio"], row["sparseloco_vs_diloco"],
                     marker="o" if len(row["seeds"]) > 1 else "x")
        axes.annotate(f"{row['label']} ({len(row['seeds'])} seed"
                      f"{'s' if len(row['seeds']) > 1 else ''})",
                      (row["bytes_ratio"], row["sparseloco_vs_diloco"]), fontsize=7,
                      xytext=(4, 3), textcoords="offset points")
    axes.set_xscale("log")
    axes.set_xlabel("bytes ratio per token over dense fp32 AdamW")
    axes.set_ylabel("SparseLoCo val loss / DiLoCo val loss (same H)")
    axes.set_title("SparseLoCo frontier, tiny model (bench/optimizers.py)")
    axes.legend(loc="upper left", fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--diloco", type=Path, required=True,
                        help="a --jsonl file of bench/optimizers.py holding DiLoCo's runs")
    parser.add_argument("--point", action="append", required=True,
                        help="LABEL=FILE: a --jsonl file of one SparseLoCo setting")
    parser.add_argument("--out", type=Path, default=Path("bench/results/sparseloco_frontier"))
    args = parser.parse_args()
    points = []
    for point in args.point:
        label, sep, file = point.rpartition("=")
        if not sep or not label:
            parser.error(f"--point {point!r} is not LABEL=FILE")
        points.append((label, Path(file)))
    rows = frontier(chosen_by_seed(read_outcomes([args.diloco]), "diloco"), points)
    write_table(rows, args.out.with_suffix(".md"))
    plot(rows, args.out.with_suffix(".png"))
    for row in rows:
        print(f"{row['label']:32s} seeds {row['seeds']} vs diloco "
              f"{row['sparseloco_vs_diloco']:.4f} bytes ratio {row['bytes_ratio']:.0f}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
