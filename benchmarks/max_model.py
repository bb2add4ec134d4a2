"""The largest GPT-2-shaped model that trains N steps, per engine configuration and world size.

For each configuration (``--configs``, names as in ``train_speed.py``, e.g. ``fsdp2-bf16-ckpt``)
and world size (``--world-size``: 1 GPU, or 2 GPUs of one host) this searches a ladder of GPT-2
shapes that grow in depth and width together::

    1.5b (48, 1600, 25)   2.7b (32, 2560, 32)   4b  (40, 2816, 32)   6.7b (32, 4096, 32)
    8b   (40, 4096, 32)   10b  (48, 4096, 32)   13b (40, 5120, 40)   16b  (48, 5120, 40)
    20b  (44, 6144, 48)                                   (n_layer, n_embd, n_head)

Parameters (unique, tied ``wte``/``lm_head`` counted once; counted by ``_train_configs``'s
``count_parameters`` on the meta device): ``V d + P d + L (12 d^2 + 13 d) + 2 d`` with V = 50257,
P = n_positions = 1024, L = n_layer, d = n_embd.

The search starts at ``--start`` (a rung, or per world size: ``1=6.7b,2=13b``), goes up while a
trial trains and down while one fails; it stops at the boundary, at an end of the ladder
(``--max-params`` cuts its top) or when its share of ``--budget-s`` is spent. A trial is
``_train_launch.run_config`` (as in ``train_speed.py``): fresh processes (one per GPU) build the
engine as the training step does and run ``--steps`` steps on a fixed random ``--batch-size`` x
``--seq-len`` batch per GPU within ``--trial-timeout``; out-of-memory errors, crashes and
timeouts are recorded. A rung is skipped (a failure for the search) when its host RAM exceeds
/proc/meminfo MemAvailable: 4 bytes/param per process that builds the fp32 model on the CPU
(offload configs or ``--init-device cpu``; else it is built on the GPU), plus 12 bytes/param
(gradients, AdamW moments) if offloaded.

Run by path (``benchmarks/`` is not a package)::

    python benchmarks/max_model.py --world-size 1,2 --start 1=6.7b,2=13b --budget-s 420 \
        --tokenizer .gpudata/gpt2-tokenizer --out /tmp/max_model.json
    python benchmarks/max_model.py --tiny --out /tmp/max_model_cpu.json    # CPU smoke test

Writes ``--out`` (JSON: environment, settings, the ladder, every trial, per search the largest
trained and smallest failed rung; rewritten after every trial) and the same name with ``.md``: a
table per world size and a check against the targets (>= 6e9 parameters on one H200,
>= 12e9 on two).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402

_bench.setup_paths()

import _train_configs  # noqa: E402
import _train_launch  # noqa: E402

from tango_fairscale.runtime.process_group import free_port  # noqa: E402

LADDER = [  # name, n_layer, n_embd, n_head
    ("1.5b", 48, 1600, 25), ("2.7b", 32, 2560, 32), ("4b", 40, 2816, 32),
    ("6.7b", 32, 4096, 32), ("8b", 40, 4096, 32), ("10b", 48, 4096, 32),
    ("13b", 40, 5120, 40), ("16b", 48, 5120, 40), ("20b", 44, 6144, 48),
]  # fmt: skip
TINY_LADDER = [("t64", 2, 64, 2), ("t128", 2, 128, 2), ("t256", 4, 256, 4)]
DEFAULT_CONFIGS = (
    "fsdp2-bf16-ckpt,fsdp2-bf16-ckpt-offload,fairscale-bf16-ckpt,fairscale-bf16-ckpt-offload,"
    "ddp-bf16"
)
#: The targets: parameters that must train, by world size (GPUs).
TARGETS = {1: 6e9, 2: 12e9}
#: A trial is not started with less time than this left in its search's share of the budget.
MIN_TRIAL_S = 20.0


def host_bytes_needed(spec: dict[str, Any]) -> int:
    """Host RAM a trial needs (see the module docstring); mirrors ``_train_worker.build_engine``."""
    offload = "offload" in spec["modifiers"]
    on_cpu = offload or not spec["cuda"] or spec["init_device"] == "cpu"
    return spec["n_params"] * (4 * spec["world_size"] * on_cpu + 12 * offload)


def mem_available() -> int:
    """Host RAM available now (/proc/meminfo MemAvailable), in bytes."""
    lines = Path("/proc/meminfo").read_text().splitlines()
    return next(int(x.split()[1]) * 1024 for x in lines if x.startswith("MemAvailable:"))


def run_trial(spec: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """``_train_launch.run_config``, unless the host RAM is too small (then skipped)."""
    need, have = host_bytes_needed(spec), mem_available()
    if need > have:
        message = f"needs ~{need / 1e9:.0f} GB host RAM, have {have / 1e9:.0f}"
        row = {**_train_launch.summarize(spec, [], message, 0.0), "error": "skipped"}
    else:
        row = _train_launch.run_config(spec, timeout_s)
    row.update(success="error" not in row, host_gb_needed=round(need / 1e9, 1))
    return {**row, "host_gb_available": round(have / 1e9, 1)}


def summary(outcome: dict[int, bool], ladder: list[dict[str, Any]]) -> dict[str, Any]:
    """The largest rung that trained, the smallest above it that failed, and why it stopped."""
    best = max((i for i, ok in outcome.items() if ok), default=-1)
    worst = min((i for i, ok in outcome.items() if not ok and i > best), default=None)
    if worst is not None and worst == best + 1:
        status = "bounded" if best >= 0 else "nothing trained (smallest rung failed)"
    elif best == len(ladder) - 1:
        status = "top of the ladder trained (raise --max-params / extend the ladder)"
    elif outcome:
        status = "unbounded: budget spent"
    else:
        status = "no trial: budget spent"
    top, bottom = ladder[best] if best >= 0 else {}, {} if worst is None else ladder[worst]
    return {"largest_trained": top.get("name"), "largest_trained_params": top.get("n_params"),
            "smallest_failed": bottom.get("name"), "smallest_failed_params": bottom.get("n_params"),
            "status": status}  # fmt: skip


def billions(n: float | None) -> str:
    return "-" if n is None else f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.1f}M"


def markdown(report: dict[str, Any]) -> str:
    env, settings = report["environment"], report["settings"]
    rungs = {r["name"]: r for r in report["ladder"]}
    init = settings["init_device"] if report["device"] == "cuda" else "cpu"
    lines = [
        f"# Largest GPT-2 model that trains {settings['steps']} steps: "
        f"{env.get('gpu_name') or 'CPU'}, commit {str(env.get('commit'))[:12]}",
        "",
        f"Batch {settings['batch_size']} x {settings['seq_len']} tokens per GPU, AdamW lr 1e-4, "
        f"model init on {init} (offload configs: CPU); host RAM available "
        f"at start {report['host_gb_available_at_start']} GB. Peak GiB: max over GPUs of "
        "allocated / reserved, of the largest trained rung. Ladder: "
        + ", ".join(f"{r['name']} {billions(r['n_params'])}" for r in report["ladder"]),
    ]
    for world_size in sorted({s["world_size"] for s in report["searches"]}):
        lines += ["", f"## World size {world_size}", ""]
        lines += ["| config | largest trained | smallest failed | peak GiB | search |"]
        lines += ["|---|---|---|---|---|"]
        searches = [s for s in report["searches"] if s["world_size"] == world_size]
        for s in searches:
            trials = {t["shape"]: t for t in report["trials"] if t["search"] == s["id"]}
            best, worst = trials.get(s["largest_trained"], {}), trials.get(s["smallest_failed"])
            peak = f"{best.get('peak_allocated_gib')} / {best.get('peak_reserved_gib')}"
            peak = peak if best.get("peak_allocated_gib") is not None else "-"
            failed = "-"
            if worst:
                failed = f"{billions(worst['n_params'])} ({worst['shape']}): {worst['error']} "
                failed += (worst.get("message") or "")[:100].replace("|", "/")
            trained = "-"
            if best:
                trained = f"{billions(best['n_params'])} ({best['shape']}: "
                trained += f"{rungs[best['shape']]['shape']})"
            lines.append(f"| {s['config']} | {trained} | {failed} | {peak} | {s['status']} |")
        target = TARGETS.get(world_size)
        if target is None or report["device"] != "cuda":
            continue
        lines += ["", f"Target: >= {target / 1e9:g}e9 parameters on {world_size} GPU(s):", ""]
        for s in searches:
            best = s["largest_trained_params"] or 0
            verdict = "met" if best >= target else "missed"
            if best < target:
                verdict += f" by {billions(target - best)} ({100 * (1 - best / target):.0f}% short)"
                if s["status"].startswith("unbounded"):
                    verdict += "; search not finished"
            lines.append(f"- {s['config']}: largest {billions(best or None)}, {verdict}")
    lines += ["", "## Trials", "", "| world | config | rung | params | result | s | peak GiB |"]
    lines += ["|---|---|---|---|---|---|---|"]
    for t in report["trials"]:
        result = "trained" if t["success"] else f"{t['error']}: {(t.get('message') or '')[:80]}"
        lines.append(
            f"| {t['world_size']} | {t['config']} | {t['shape']} | {billions(t['n_params'])} "
            f"| {result.replace('|', '/')} | {t['wall_s']} | {t.get('peak_allocated_gib', '-')} |"
        )
    return "\n".join(lines) + "\n"


def write(path: Path, report: dict[str, Any], started: float) -> None:
    report["total_wall_s"] = round(time.perf_counter() - started, 1)
    _bench.write_json(path, report)
    _bench.write_text(path.with_suffix(".md"), markdown(report))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-size", default="1", help="comma list, e.g. 1,2")
    parser.add_argument("--configs", default=DEFAULT_CONFIGS, help="comma list (train_speed)")
    parser.add_argument("--start", default=None, help="rung name or WS=NAME,... (default 6.7b)")
    parser.add_argument("--max-params", type=float, default=None, help="drop larger rungs")
    parser.add_argument("--batch-size", type=int, default=1, help="rows per GPU")
    parser.add_argument("--seq-len", type=int, default=1024, help="at most 1024 (n_positions)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=0, help="steps before the counted ones")
    parser.add_argument("--trial-timeout", type=float, default=300.0, help="seconds per trial")
    parser.add_argument("--budget-s", type=float, default=None, help="seconds for all searches")
    parser.add_argument("--init-device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument(
        "--tokenizer", default=str(_bench.REPO_ROOT / ".gpudata" / "gpt2-tokenizer")
    )
    parser.add_argument("--commit", default=None, help="code commit (default BENCH_COMMIT / git)")
    parser.add_argument("--out", type=Path, required=True, help="result JSON (and .md beside it)")
    parser.add_argument("--tiny", action="store_true", help="CPU smoke test (tiny rungs)")
    args = parser.parse_args(argv)
    if args.tiny:
        args.world_size, args.seq_len, args.batch_size, args.steps = "1", 64, 2, 3
        args.configs, args.start = "fsdp2-fp32-ckpt,ddp-fp32", "t128"  # the tiny ladder
        shared = _bench.REPO_ROOT.parent / "shared" / "data" / "gpt2-tokenizer"
        if not Path(args.tokenizer).is_dir() and shared.is_dir():
            args.tokenizer = str(shared)
    args.start = args.start or "6.7b"
    if args.seq_len > 1024:
        raise SystemExit("--seq-len is at most 1024 (n_positions of the ladder's models)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    import multiprocessing

    import torch

    started = time.perf_counter()
    deadline = float("inf") if args.budget_s is None else started + args.budget_s
    tokenizer = str(Path(args.tokenizer).resolve())
    if not Path(tokenizer).is_dir():
        raise SystemExit(f"--tokenizer {tokenizer} is not a directory (GPT-2 tokenizer files)")
    configs = [c for c in args.configs.split(",") if c]
    parsed = {c: _train_configs.parse_config(c) for c in configs}
    if any(p["engine"] == "pipe" for p in parsed.values()):
        raise SystemExit("pipe configs are not data parallel: use ddp, fairscale or fsdp2")
    cuda = torch.cuda.is_available()
    gpus = torch.cuda.device_count() if cuda else 0
    multiprocessing.set_forkserver_preload(_train_launch.PRELOAD)
    start_method = "forkserver"

    ladder = []
    for name, n_layer, n_embd, n_head in TINY_LADDER if args.tiny else LADDER:
        shape = {"n_layer": n_layer, "n_embd": n_embd, "n_head": n_head}
        config = {"model_type": "gpt2", "vocab_size": 50257, "n_positions": 1024, **shape}
        n_params = _train_configs.count_parameters(config)
        if args.max_params is None or n_params <= args.max_params:
            ladder.append({"name": name, "shape": f"{n_layer}x{n_embd}, {n_head} heads",
                           "n_params": n_params, "model_config": config})  # fmt: skip
            print(f"rung {name}: {shape} {n_params:,} parameters", flush=True)
    names = [r["name"] for r in ladder]

    report: dict[str, Any] = {
        "benchmark": "max_model",
        "environment": _bench.environment(args.commit, query_gpu=False),
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "device": "cuda" if cuda else "cpu",
        "targets_params": TARGETS,
        "host_gb_available_at_start": round(mem_available() / 1e9, 1),
        "ladder": [{k: v for k, v in r.items() if k != "model_config"} for r in ladder],
        "searches": [],  # per (world size, config): largest trained, smallest failed
        "trials": [],
    }
    pairs = [(int(w), c) for w in args.world_size.split(",") for c in configs]
    for k, (w, c) in enumerate(pairs):
        report["searches"].append({"id": k, "world_size": w, "config": c, **summary({}, ladder)})
    checked = False  # has a trial shown that the start method works?
    for k, (world_size, name) in enumerate(pairs):
        start = _bench.per_shape(args.start, str(world_size), str)
        if start not in names:
            raise SystemExit(f"--start {start!r}: not a rung of {names} (--max-params?)")
        if cuda and world_size > gpus:
            report["searches"][k]["status"] = f"skipped: needs {world_size} GPUs, {gpus} visible"
            continue
        # An equal share of what is left: a search that ends early leaves more to the rest.
        search_end = time.perf_counter() + (deadline - time.perf_counter()) / (len(pairs) - k)
        # The search: up while a rung trains, down while it fails, until a rung repeats.
        outcome: dict[int, bool] = {}
        i = names.index(start)
        while 0 <= i < len(ladder) and i not in outcome:
            if search_end - time.perf_counter() < MIN_TRIAL_S:
                break
            spec = {
                **parsed[name], "data": "synthetic", "piqa_batches": None, "pipe": None,
                "pipe_devices": None, "start_method": start_method, "world_size": world_size,
                "shape": ladder[i]["name"], "model_config": ladder[i]["model_config"],
                "n_params": ladder[i]["n_params"], "batch_size": args.batch_size,
                "steps": args.steps, "warmup": args.warmup, "seq_len": args.seq_len,
                "lr": 1e-4, "max_grad_norm": None, "seed": 1, "tokenizer": tokenizer,
                "init_device": args.init_device, "cuda": cuda, "port": free_port(),
            }  # fmt: skip
            timeout = min(args.trial_timeout, deadline - time.perf_counter())
            print(f"=== world {world_size} {name} {names[i]}: start", flush=True)
            row = run_trial(spec, timeout)
            if (
                not checked
                and start_method == "forkserver"
                and _train_launch.forkserver_failed(row)
            ):
                print(f"forkserver failed ({row.get('message')}); using spawn", flush=True)
                start_method = spec["start_method"] = "spawn"
                row = run_trial(spec, timeout)
            checked = checked or row["success"]
            if row.get("error") == "timeout" and timeout < args.trial_timeout:
                row["message"] += " (cut short by --budget-s: not a boundary)"
            row.pop("no_rank_reported", None)
            report["environment"].update(row.pop("gpu_info", {}))
            report["trials"].append({"search": k, **row})
            outcome[i] = row["success"]
            report["searches"][k].update(summary(outcome, ladder))
            write(args.out, report, started)
            result = "trained" if row["success"] else f"{row['error']} {row.get('message')}"
            print(f"=== world {world_size} {name} {names[i]}: {result} ({row['wall_s']} s)")
            i = i + 1 if row["success"] else i - 1
    write(args.out, report, started)
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
