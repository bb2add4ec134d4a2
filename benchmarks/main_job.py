"""The README's main job measured as a user runs it: ``tango run configs/gpt2_piqa.jsonnet`` on a
random GPT-2 124M and the official PIQA files, with every default and with the peer settings
(``-D engine=ddp -D precision=32-true``; ``fsdp2``: ``-D engine=fsdp2``, whose checkpoints are
DCP's), each in a fresh workspace, in one call. A variant named
twice (``--variants default,ddp-fp32,default``) runs again as ``"<name> (again)"``: the first
command on a fresh machine also builds Inductor's and CUDA's caches and reads cold files, which
every later command finds (lm-eval's task index is built at setup, as ``scripts/setup.sh`` does);
the step speed-up compares the repeated default with the peer.

Per command: wall time; the time split — before the training step starts (imports, config, Tango
hashing the steps), the run's own split (``time split:`` of the training step: data, engine,
setup, first step, steps, validation, checkpoints waited for, final), the training step's time
outside it (the trained model rebuilt and stored in the step's cache), and after the step
(scoring, export, exit);
step time and tokens/s from the training log; peak GPU memory; the GPU's busy share (NVML's
utilisation counter sampled every 100 ms through ``nvidia-smi``) over the whole command and over
the span of the step loop (from the first to the last logged training step).

    python benchmarks/main_job.py --piqa DIR --tokenizer DIR --out main_job.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402

_bench.setup_paths()

VARIANTS = {
    "default": [],
    "ddp-fp32": ["-D", "engine=ddp", "-D", "precision=32-true"],
    "fsdp2": ["-D", "engine=fsdp2"],
}


class Sampler(_bench.GpuSampler):
    """:class:`~_bench.GpuSampler`, and when each training-log line appeared, on the same
    clock."""

    def __init__(self, log_path_glob: tuple[Path, str]) -> None:
        super().__init__()
        self.log_times: list[float] = []
        self.root, self.pattern = log_path_glob

    def run(self) -> None:
        threading.Thread(target=self._watch_log, daemon=True).start()
        super().run()

    def _watch_log(self) -> None:
        seen = 0
        while not self.stopped.is_set():
            for path in self.root.glob(self.pattern):
                lines = [x for x in path.read_text().splitlines() if '"train_loss"' in x]
                now = time.perf_counter()
                self.log_times += [now] * (len(lines) - seen)
                seen = max(seen, len(lines))
            time.sleep(0.05)


def run_command(name: str, extra: list[str], args: argparse.Namespace) -> dict[str, Any]:
    workspace = Path(tempfile.mkdtemp(prefix=f"main-job-{name}-"))
    command = [
        sys.executable,
        "-u",
        "-m",
        "tango",
        "run",
        "configs/gpt2_piqa.jsonnet",
        "-w",
        str(workspace),
        "-n",
        name,
        "-D",
        f"model={args.model}",
        "-D",
        f"data_dir={args.piqa}",
        "-D",
        f"train_steps={args.train_steps}",
        *extra,
    ]
    sampler = Sampler((workspace, "cache/*/work/training_log.jsonl"))
    sampler.start()
    started = time.perf_counter()
    lines: list[tuple[float, str]] = []
    process = subprocess.Popen(
        command, cwd=_bench.REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert process.stdout is not None
    for line in process.stdout:
        lines.append((time.perf_counter() - started, line.rstrip("\n")))
    code = process.wait(timeout=args.timeout_s)
    ended = time.perf_counter()
    time.sleep(0.3)
    sampler.stopped.set()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    (Path(args.out).parent / f"main_job_{name}.log").write_text(
        "".join(f"{t:8.2f} {line}\n" for t, line in lines)
    )
    result: dict[str, Any] = {
        "command": " ".join(command[2:]),
        "exit_code": code,
        "wall_s": round(ended - started, 2),
    }
    result.update(split(lines, ended - started))
    result.update(training_figures(workspace))
    if result.get("phases_s") and "training_step_s" in result:
        # The trained model rebuilt from its state and stored in the step's cache, mostly.
        outside = result["training_step_s"] - sum(result["phases_s"].values())
        result["outside_phases_s"] = round(outside, 2)
    loop = sampler.log_times
    result["gpu_busy_pct_command"] = sampler.busy((started, ended))
    if len(loop) >= 2:
        result["gpu_busy_pct_step_loop"] = sampler.busy((loop[0], loop[-1]))
        result["step_loop_span_s"] = round(loop[-1] - loop[0], 2)
    if sampler.samples:
        result["gpu_memory_used_max_mib"] = max(memory for _, _, memory in sampler.samples)
    return result


def split(lines: list[tuple[float, str]], wall: float) -> dict[str, Any]:
    """Before, during and after the training step, from the output's timestamps."""

    def first(pattern: str) -> float | None:
        return next((t for t, line in lines if re.search(pattern, line)), None)

    train_start = first(r'Starting step "trained_model"')
    train_end = first(r'Finished step "trained_model"')
    out: dict[str, Any] = {}
    if train_start is not None:
        out["before_training_step_s"] = round(train_start, 2)
    if train_start is not None and train_end is not None:
        out["training_step_s"] = round(train_end - train_start, 2)
        out["after_training_step_s"] = round(wall - train_end, 2)
    return out


def training_figures(workspace: Path) -> dict[str, Any]:
    logs = list(workspace.glob("cache/*/work/training_log.jsonl"))
    if not logs:
        return {}
    records = [json.loads(x) for x in logs[0].read_text().splitlines() if x.strip()]
    steps = [r for r in records if "tokens_per_s" in r and r["step"] > 10]
    phases = next((r["phases_s"] for r in records if "phases_s" in r), None)
    figures: dict[str, Any] = {"phases_s": phases}
    writes = next((r["checkpoint_writes_s"] for r in records if "checkpoint_writes_s" in r), None)
    if writes:  # the loop's visible cost of checkpoints against their background write time
        figures["checkpoint_writes"] = {"count": len(writes), "written_s": round(sum(writes), 2)}
        if phases and "checkpoints" in phases:
            figures["checkpoint_writes"]["visible_share"] = round(
                phases["checkpoints"] / max(sum(writes), 1e-9), 3
            )
    if steps:
        figures["tokens_per_s_median"] = sorted(r["tokens_per_s"] for r in steps)[len(steps) // 2]
        figures["peak_memory_gib"] = max(r.get("peak_memory_gib", 0) for r in steps)
    figures["train_losses"] = [[r["step"], r["train_loss"]] for r in records if "train_loss" in r]
    if phases and phases.get("steps"):
        last = max(r["step"] for r in records if "train_loss" in r)
        figures["step_ms_mean"] = round(phases["steps"] / max(last - 1, 1) * 1e3, 2)
    return figures


#: Logged losses averaged over windows of this many steps before two runs are compared.
LOSS_WINDOW = 100


def loss_curve_gap(ours: list[list[float]], theirs: list[list[float]]) -> dict[str, Any]:
    """How far one run's logged training losses are from another's (the same data, the same
    steps): window by window of :data:`LOSS_WINDOW` steps, the largest relative difference of
    the windows' means, over the first 300 steps and over the run."""
    by_step = dict((int(step), loss) for step, loss in theirs)
    pairs = [(int(step), loss, by_step[int(step)]) for step, loss in ours if int(step) in by_step]
    windows: dict[int, list[tuple[float, float]]] = {}
    for step, a, b in pairs:
        windows.setdefault((step - 1) // LOSS_WINDOW, []).append((a, b))
    gaps = {
        (index + 1) * LOSS_WINDOW: abs(sum(a for a, _ in values) / sum(b for _, b in values) - 1)
        for index, values in sorted(windows.items())
    }
    last = windows[max(windows)]
    return {
        "window_steps": LOSS_WINDOW,
        "steps_compared": len(pairs),
        "max_relative_gap_first_300": round(max(v for k, v in gaps.items() if k <= 300), 4),
        "max_relative_gap": round(max(gaps.values()), 4),
        "final_window_means": [round(sum(run) / len(last), 4) for run in zip(*last)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--piqa", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--model", help="a saved model (default: a random GPT-2 124M, written)")
    parser.add_argument("--tiny", action="store_true", help="CPU smoke test: a tiny GPT-2")
    parser.add_argument("--shape", default="124m", help="the random model's shape (_bench.SHAPES)")
    parser.add_argument("--train-steps", type=int, default=2000)
    parser.add_argument("--variants", default="default,ddp-fp32")
    parser.add_argument("--timeout-s", type=float, default=400)
    parser.add_argument("--out", required=True)
    parser.add_argument("--commit")
    args = parser.parse_args()
    if args.model is None:
        from tango_fairscale.model.causal_lm import ModelWrapper

        shape = "tiny" if args.tiny else args.shape
        args.model = tempfile.mkdtemp(prefix=f"gpt2-{shape}-")
        config = {"model_type": "gpt2", **_bench.SHAPES[shape]}
        ModelWrapper(config=config, tokenizer=args.tokenizer, seed=1).save(args.model)
    env = _bench.environment(args.commit)
    results: dict[str, Any] = {}
    for name in args.variants.split(","):  # a name given again: the same command, caches warm
        key = name if name not in results else f"{name} (again)"
        results[key] = run_command(name, VARIANTS[name], args)
    report: dict[str, Any] = {
        "benchmark": "main_job",
        "environment": env,
        "train_steps": args.train_steps,
        "variants": results,
    }
    base = results.get("default (again)", results.get("default", {}))
    peer = results.get("ddp-fp32", {})
    if base.get("step_ms_mean") and peer.get("step_ms_mean"):
        report["step_speedup_vs_ddp_fp32"] = round(peer["step_ms_mean"] / base["step_ms_mean"], 3)
    if base.get("train_losses") and peer.get("train_losses"):
        report["loss_curve_vs_ddp_fp32"] = loss_curve_gap(
            base["train_losses"], peer["train_losses"]
        )
    _bench.write_json(Path(args.out), report)
    print(
        json.dumps(
            {
                k: {
                    x: v.get(x)
                    for x in (
                        "wall_s",
                        "step_ms_mean",
                        "gpu_busy_pct_step_loop",
                        "gpu_busy_pct_command",
                        "outside_phases_s",
                    )
                }
                for k, v in results.items()
            }
        )
    )


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
