"""Draw MFU per configuration from train_speed.py result files, one bar per file, side by side.

Each ``--run LABEL=FILE.json`` is one train_speed.py result; rows are matched by world size,
shape and config, and only those present in every file are drawn (so a before/after pair compares
the same settings). The figure goes to ``--out`` (PNG) for the README's performance section.

    python benchmarks/plot_results.py \
        --run "before (c69781a)=benchmarks/results/train_speed_synth_ws1_h200x2.json" \
        --run "after (793193e)=benchmarks/results/train_speed_synth_ws1_fused_h200x2.json" \
        --out benchmarks/results/mfu_h200.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def rows_by_key(path: Path) -> dict[tuple[int, str, str], dict]:
    results = json.loads(path.read_text())["results"]
    return {
        (r["world_size"], r["shape"], r["config"]): r for r in results if r.get("mfu") is not None
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", action="append", required=True, metavar="LABEL=FILE")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    runs = [(label, rows_by_key(Path(file))) for label, file in (r.split("=", 1) for r in args.run)]
    keys = [key for key in runs[0][1] if all(key in rows for _, rows in runs)]
    if not keys:
        raise SystemExit("no (world size, shape, config) is in every file")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    width = 0.8 / len(runs)
    figure, axes = plt.subplots(figsize=(1.1 * len(keys) + 2, 4))
    for index, (label, rows) in enumerate(runs):
        positions = [k + index * width for k in range(len(keys))]
        axes.bar(positions, [100 * rows[key]["mfu"] for key in keys], width, label=label)
    axes.set_xticks([k + width * (len(runs) - 1) / 2 for k in range(len(keys))])
    axes.set_xticklabels(
        [f"{shape}\n{config}\n{world} GPU" for world, shape, config in keys], fontsize=7
    )
    axes.set_ylabel("MFU % (bf16 peak 989 TFLOP/s)")
    axes.set_title("GPT-2 shapes, seq 1024, one H200 (benchmarks/train_speed.py)")
    axes.legend()
    figure.tight_layout()
    figure.savefig(args.out, dpi=120)
    print(f"wrote {args.out}: {len(keys)} configurations x {len(runs)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
