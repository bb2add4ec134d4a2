"""The index of benchmark results: per result its target, key figure, commit, GPU and date.

A result is the files of one stem in one folder (``NAME.json`` with its ``NAME.md``, or a lone
``.md`` / ``.txt`` / ``.png``). The key figure, commit, GPU and date come from the JSON (the
``environment`` every script records) or, for a lone text file, from its header lines. The target
is that of the ``benchmarks/gpu.sh`` suite that produced the result (recorded as
``environment.suite``, or the suite's folder under a runner's ``$OUT``); :data:`EARLIER` names it
for results measured before results recorded their suite, and describes those that are cited as
evidence rather than as a target's figure.

    python benchmarks/index.py                      # writes benchmarks/results/INDEX.md
    python benchmarks/index.py --check              # fails if INDEX.md is not up to date
    python benchmarks/index.py --dir "$OUT" --print # a gpu.sh run's results, on stdout

Pure Python (no torch): run it after adding or removing a result file.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _index_figures import FIGURES, results_table_figure  # noqa: E402

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
RUNNER = HERE / "gpu.sh"
#: Files of a run's output folder that are not results.
SKIPPED = {"INDEX.md", "log.txt"}
SKIPPED_SUFFIXES = {".log", ".tmp"}

#: Results measured before they recorded their suite: stem -> suite (``None`` for evidence that
#: documents cite), and what no JSON says: ``target`` for evidence, ``figure`` for lone text files.
EARLIER: dict[str, dict[str, str | None]] = {
    "target_sharded_vs_ddp_h200": {
        "suite": "train-synthetic-1.5b",
        "figure": "analysis: 1.5B 1.10x (FairScale), 1.08x (FSDP2) of ddp bf16; 124M 1.0-1.27x "
        "within one machine state; not met",
    },
    "train_speed_piqa_h200x2_804582a": {"suite": "train-piqa"},
    "train_speed_piqa_124m_b16_gap_h200": {"suite": "train-piqa"},
    "host_overhead_piqa_h200": {
        "suite": "profile",
        "figure": "analysis: 124M FairScale bf16 + checkpointing keeps the GPU busy 12 of 78 ms; "
        "FairScale's hooks ~3 ms per unit and step",
    },
    "eval_speed_packing_h200_777bde0": {"suite": "eval"},
    "eval_speed_packing_h200_47e7b6b": {"suite": "eval"},
    "logit_chunk_probe_h200": {
        "suite": "eval",
        "figure": "19,940-20,652 q/s (bf16, packed, 4,096-row logit chunks); smaller chunks slower",
    },
    "scoring_probe_tokenizing_parts_h200": {
        "suite": "eval",
        "figure": "tokenizing on a thread while scoring: 15,031-19,513 q/s, no faster than "
        "tokenizing first (17,578-18,017 on that machine); reverted",
    },
    "eval_speed_parts512_h200": {
        "suite": None,
        "target": "evidence (the predictions step): tokenizing in parts of 512 examples while "
        "scoring, slower than in one part",
    },
    "eval_speed_parts100000_h200": {
        "suite": None,
        "target": "evidence (the predictions step): the same commit tokenizing in one part",
    },
    "precision_h200_ws1": {"suite": "precision"},
    "startup_probe_h200_afe755f": {
        "suite": None,
        "target": "evidence (the main job's start-up): a training process's start-up, piece by "
        "piece; the first forward 7.1 s with the compiled loss, 2.2 s with it eager below 4,096 "
        "tokens",
    },
    "startup_profile_h200_b0af250": {
        "suite": None,
        "target": "evidence (a command's fixed cost): py-spy of the main job and of an "
        "evaluation-only command; uncompiled bytecode 8.7 s a process on the device, cuDNN "
        "attention's plan per new length up to 1.2 s; the main job 55.0 s as a machine's third "
        "command",
    },
    "checkpoint_ab_fsdp2_h100_331f446": {
        "suite": None,
        "target": "evidence (background checkpoints): fsdp2's 1.5B checkpoint write "
        "with DCP's snapshot copied to host memory against the same snapshot copied on the GPU",
        "figure": "write 10.47 / 11.54 s (host copy, before and after) against 10.73 s (GPU "
        "copy) in one call; visible 3.4-4.0 %",
    },
    "profile_lm_eval_h100_a5e020c": {
        "suite": "profile-lm-eval",
        "figure": "analysis (H100, py-spy and torch.profiler): scoring passes' kernels 1.36 s "
        "(HellaSwag) and 0.89 s (MMLU); a second model's load 4.6 s under the profiler, mostly "
        "transformers' imports (~2.8 s; the package scan gone); lm-eval's task loading 1.6 s",
    },
    "warm_up_ab_h100_49cff88": {
        "suite": None,
        "target": "evidence (PERFORMANCE, the lm-eval row): the synthetic suite's package "
        "commands without and with 49cff88's scoring warm-up, one host, one call",
        "figure": "commands 20.7 / 15.8 s without, 19.2 / 14.8 s with (first / second model); "
        "scoring passes 1.73 + 1.16 s without, 1.75 + 1.23 s with: the warm-up removed",
    },
    "cuda_start_ab_h100_e3daf3c": {
        "suite": None,
        "target": "evidence (PERFORMANCE, the lm-eval row): the synthetic suite's package "
        "commands without and with e3daf3c's CUDA started on a thread, one host, one call",
        "figure": "commands 14.17 / 11.38 s without, 13.80 / 11.13 s with (first / second model, "
        "means of two runs each, interleaved)",
    },
    "train_speed_synth_124m_h100_29acc9b": {
        "suite": None,
        "target": "evidence (PERFORMANCE, the 124M MFU row): the best FairScale and FSDP2 "
        "configurations with GPT-2's dropout (0.1), beside the same call's dropout-0 run",
    },
    "train_speed_synth_124m_dropout0_h100_29acc9b": {
        "suite": None,
        "target": "evidence (PERFORMANCE, the 124M MFU row): the same configurations with every "
        "dropout 0 (train_speed.py --dropout 0), one call after the run with GPT-2's dropout",
    },
    "train_speed_synth_1.5b_h100_9d99f50": {
        "suite": None,
        "target": "evidence (PERFORMANCE, the 1.5B MFU row): the best FairScale configuration "
        "with GPT-2's dropout (0.1), beside the same call's dropout-0 run",
    },
    "train_speed_synth_1.5b_dropout0_h100_9d99f50": {
        "suite": None,
        "target": "evidence (PERFORMANCE, the 1.5B MFU row): the same configuration with every "
        "dropout 0 (train_speed.py --dropout 0), one call after the run with GPT-2's dropout",
    },
    "profile_final_1.5b_h200_b1bdb4d": {
        "suite": None,
        "target": "evidence (PERFORMANCE, the checkpoint row): the 1.5B command's end of run "
        "under py-spy (checkpoint-1.5b's command, one variant)",
        "figure": "analysis (H200, py-spy): final 15.4 s = the final write waited for 9.7 s + "
        "the model copied from the GPU again 6.0 s (before bb0e467)",
    },
    "profile_main_job_h200_1686201": {
        "suite": "profile-main-job",
        "figure": "analysis: each process of the main job's command (300 steps) under cProfile",
    },
    "max_model_ws1_h200x2": {"suite": "max-model"},
    "max_model_ws2_h200x2": {"suite": "max-model"},
    "train_speed_pipe_h200x2": {"suite": "pipe"},
    "multinode_h200x2": {"suite": "multinode"},
    "e2e_tango_run_h200": {"suite": "e2e"},
    "e2e_tango_run_h100_05a98eb": {"suite": "e2e"},
    "e2e_tango_run_h200x2": {"suite": "e2e"},
    "mfu_h200": {
        "suite": None,
        "target": "figure (README): MFU before and after the fused GELU and aligned projection "
        "(plot_results.py over train_speed_synth_ws1_h200x2 and _fused_h200x2)",
        "figure": "plot",
    },
    "train_speed_synth_ws1_h200x2": {
        "suite": None,
        "target": "evidence (README): seq-1024 batches, FairScale bf16 + checkpointing against "
        "DDP fp32 on one GPU; before the fused GELU",
    },
    "train_speed_synth_ws1_fused_h200x2": {
        "suite": None,
        "target": "evidence (ARCHITECTURE): training after the fused GELU and aligned projection",
    },
    "train_speed_piqa_fused_h200x2": {
        "suite": None,
        "target": "evidence (ARCHITECTURE): PIQA steps after the fused GELU and aligned projection",
    },
    "eval_speed_fused_h200x2": {
        "suite": None,
        "target": "evidence (ARCHITECTURE): scoring after the fused GELU and aligned projection",
    },
    "train_speed_piqa_packing_124m_b16_h200": {
        "suite": None,
        "target": "evidence (ARCHITECTURE): packed against padded PIQA batches, 124M batch 16",
    },
    "train_speed_piqa_profiled_1.5b_b16_h200": {
        "suite": None,
        "target": "evidence (ENGINES): where a 1.5B PIQA step's time goes, fused and packed",
    },
    "train_speed_piqa_packing_1.5b_b64_h200": {
        "suite": None,
        "target": "evidence (README, ARCHITECTURE): packed against padded PIQA batches, 1.5B "
        "batch 64",
    },
}


def suites() -> dict[str, str]:
    """``gpu.sh``'s suites in order: name -> the figure it produces (its ``#@`` lines)."""
    found = {}
    for line in RUNNER.read_text().splitlines():
        if line.startswith("#@ "):
            name, _gpus, _seconds, target = (part.strip() for part in line[3:].split("|", 3))
            found[name] = target
    return found


# --- one row per result ----------------------------------------------------------------------


def _kind_by_keys(data: dict[str, Any]) -> str | None:
    """The benchmark of a JSON file written before its script named it (``"benchmark"``)."""
    if "runs" in data and "gpus" in data:
        return "multinode"
    if "variants" in data and "train_steps" in data:
        return "main_job"
    return None


def describe(stem: str, files: list[Path], runner_suite: str | None) -> dict[str, Any]:
    earlier = EARLIER.get(stem, {})
    row: dict[str, Any] = {
        "stem": stem,
        "files": files,
        "suite": runner_suite or earlier.get("suite"),
        "target": earlier.get("target"),
        "figure": earlier.get("figure"),
        "commit": None,
        "gpu": None,
        "date": None,
    }
    json_file = next((f for f in files if f.suffix == ".json"), None)
    if json_file is not None:
        data = json.loads(json_file.read_text())
        env = data.get("environment") or {}
        kind = data.get("benchmark") or _kind_by_keys(data)
        row["suite"] = env.get("suite") or row["suite"]
        row["figure"] = row["figure"] or (FIGURES[kind](data) if kind in FIGURES else None)
        row["commit"] = env.get("commit") or data.get("commit")
        gpus = data.get("gpus") or []
        name = env.get("gpu_name") or (gpus[0] if gpus else None)
        count = env.get("gpu_count") or len(gpus)
        row["gpu"] = f"{name.removeprefix('NVIDIA ')} x{count}" if name else "CPU"
        row["date"] = (env.get("timestamp_utc") or "")[:10] or None
        return row
    text_file = next((f for f in files if f.suffix in (".md", ".txt")), None)
    if text_file is not None:
        text = text_file.read_text()
        head = "\n".join(text.splitlines()[:4])
        commit = re.search(r"commits? ([0-9a-f]{7,40})", head, re.IGNORECASE)
        date = re.search(r"\b(20\d\d-\d\d-\d\d)\b", head)
        gpu = re.search(r"(\d+) x H200|one H200|H200", head)
        row["commit"] = commit.group(1) if commit else None
        row["date"] = date.group(1) if date else None
        if gpu:
            row["gpu"] = f"H200 x{gpu.group(1)}" if gpu.group(1) else "H200 x1"
        row["figure"] = row["figure"] or results_table_figure(text)
    return row


def collect(folder: Path) -> list[dict[str, Any]]:
    known = suites()
    groups: dict[tuple[Path, str], list[Path]] = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.name not in SKIPPED and path.suffix not in SKIPPED_SUFFIXES:
            groups.setdefault((path.parent, path.stem), []).append(path)
    rows = []
    for (parent, stem), files in groups.items():
        runner_suite = parent.name if parent.name in known else None
        row = describe(stem, files, runner_suite)
        row["target"] = row["target"] or known.get(row["suite"] or "", "–")
        rows.append(row)
    order = list(known)

    def key(row: dict[str, Any]) -> tuple[int, str]:
        suite = row["suite"]
        return (order.index(suite) if suite in order else len(order), row["stem"])

    return sorted(rows, key=key)


def table(rows: list[dict[str, Any]], folder: Path) -> list[str]:
    lines = [
        "| result | suite | target | key figure | commit | GPU | date |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        links = " ".join(
            f"[{f.suffix[1:]}]({f.relative_to(folder).as_posix()})" for f in row["files"]
        )
        cells = [
            f"`{row['stem']}` {links}",
            row["suite"] or "–",
            row["target"],
            row["figure"] or "–",
            (row["commit"] or "–")[:7],
            row["gpu"] or "–",
            row["date"] or "–",
        ]
        lines.append("| " + " | ".join(cell.replace("|", "/") for cell in cells) + " |")
    return lines


def index_markdown(folder: Path) -> str:
    rows = collect(folder)
    lines = [
        "# Benchmark results: the current figures",
        "",
        "Generated by `python benchmarks/index.py` from the files in this folder; do not edit by "
        "hand. One row per result (a JSON file and the Markdown beside it, or a lone file). "
        "`suite`: the `benchmarks/gpu.sh` suite that measures it again; rows without one are "
        "evidence that the docs cite. Key figures come from the JSON (see each file for the "
        "settings and the same-run baseline); lone text files' figures are stated in "
        "`benchmarks/index.py`. Results that were replaced are in git's history: "
        "`git log --diff-filter=D --name-only -- benchmarks/results`.",
        "",
    ]
    return "\n".join(lines + table(rows, folder)) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=RESULTS, help="folder of results")
    parser.add_argument("--print", action="store_true", help="to stdout instead of INDEX.md")
    parser.add_argument("--check", action="store_true", help="exit 1 if INDEX.md is stale")
    args = parser.parse_args(argv)
    text = index_markdown(args.dir)
    target = args.dir / "INDEX.md"
    if args.print:
        print(text, end="")
    elif args.check:
        if not target.is_file() or target.read_text() != text:
            print(f"{target} is not up to date: run python benchmarks/index.py", file=sys.stderr)
            return 1
    else:
        target.write_text(text)
        print(f"wrote {target}: {text.count(chr(10)) - 6} results")
    return 0


if __name__ == "__main__":
    sys.exit(main())
