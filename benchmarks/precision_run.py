"""Do mixed-precision runs of the real training step track the fp32 run? (PIQA, GPT-2 124M shape)

Runs the training step (``tango_fairscale::train``) through Tango's Python API in a fresh
``LocalWorkspace`` once per precision (default ``32-true``, ``bf16-mixed``, ``16-mixed``; the same
seed, data order and random-init model), with the FairScale engine (per-block units) by default.
Records every step's training loss, whether any was non-finite, the validation accuracy, the fp16
grad scaler's skipped (overflow) steps, wall time, and the relative difference of each run's final
loss from the fp32 run's: at the last step and averaged over the last ``--final-window`` steps
(target: within 2%).

Run by path (``benchmarks/`` is not a package)::

    python benchmarks/precision_run.py --piqa .gpudata/piqa --tokenizer .gpudata/gpt2-tokenizer \
        --out /tmp/precision.json
    python benchmarks/precision_run.py --tiny --precisions 32-true,bf16-mixed \
        --piqa ../shared/data/piqa --tokenizer ../shared/data/gpt2-tokenizer --out /tmp/p.json

Writes ``--out`` (JSON, rewritten after every run) and the same name with ``.md`` (a summary).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402

_bench.setup_paths()

#: Where the instrumented engines append one JSON line per optimizer step (rank 0).
STEP_LOG_ENV = "PRECISION_RUN_STEP_LOG"
#: ``--engine`` -> the registered engine that :func:`recording_engine` instruments.
ENGINES = {
    "fairscale": "tango_fairscale::fairscale",
    "fsdp2": "tango_fairscale::fsdp2",
    "ddp": "tango_fairscale::ddp",
}


class _StepRecorder:
    """Records, per optimizer step, the wall clock and the grad scaler's scale before / after.

    ``GradScaler.update`` halves the scale exactly when the step found inf/NaN gradients and was
    skipped, so ``scale_after < scale_before`` marks a skipped step. Only observation is added:
    the step itself is the engine's own.
    """

    def step(self) -> None:
        scaler = self.grad_scaler  # type: ignore[attr-defined]
        before = float(scaler.get_scale()) if scaler is not None else None
        super().step()  # type: ignore[misc]
        path = os.environ.get(STEP_LOG_ENV)
        if not path or not self.train_config.is_local_main_process:  # type: ignore[attr-defined]
            return
        record: dict[str, Any] = {"t": time.time()}
        if scaler is not None and before is not None:
            after = float(scaler.get_scale())
            record.update(scale_before=before, scale_after=after, skipped=after < before)
        with open(path, "a") as file:
            file.write(json.dumps(record) + "\n")


def recording_engine(engine: str) -> type:
    """The registered engine ``ENGINES[engine]`` plus :class:`_StepRecorder` (not registered;
    used through ``Lazy``). Named ``Recording<engine>`` in this module, so that processes that
    unpickle it (device_count > 1) find it through :func:`__getattr__`."""
    from tango.integrations.torch import TrainingEngine

    _bench.register_components()
    base: Any = TrainingEngine.by_name(ENGINES[engine])
    name = f"Recording{engine}"
    return type(name, (_StepRecorder, base), {"__module__": __name__, "__qualname__": name})


def __getattr__(name: str) -> type:
    if name.startswith("Recording") and name[len("Recording") :] in ENGINES:
        cls = recording_engine(name[len("Recording") :])
        globals()[name] = cls
        return cls
    raise AttributeError(name)


def run_once(args: argparse.Namespace, precision: str, dataset_dict: Any) -> dict[str, Any]:
    import torch
    from tango.common import Lazy, Params
    from tango.workspaces import LocalWorkspace

    from tango_fairscale.model.causal_lm import ModelWrapper
    from tango_fairscale.tasks.lm_eval import TaskSpec
    from tango_fairscale.train.plan import TrainRuntime
    from tango_fairscale.train.step import TrainStep  # the one place a step is imported here

    workspace_dir = Path(tempfile.mkdtemp(prefix=f"precision-{precision}-", dir=args.work_dir))
    step_log = workspace_dir / "steps.jsonl"
    os.environ[STEP_LOG_ENV] = str(step_log)
    model = Lazy(
        ModelWrapper,
        Params({"config": args.model_config, "tokenizer": args.tokenizer, "seed": args.seed}),
    )
    name, _, float8 = precision.partition("+")  # "bf16-mixed+tensorwise": with float8
    engine_params: dict[str, Any] = {
        "precision": name,
        "float8": float8 or None,
        "max_grad_norm": args.max_grad_norm,
        "optimizer": {"type": "torch::AdamW", "lr": args.lr, "weight_decay": 0.0},
    }
    if args.engine in ("fairscale", "fsdp2"):
        engine_params["sharding"] = json.loads(args.sharding)
    step = TrainStep(
        model=model,
        engine=Lazy(
            getattr(sys.modules[__name__], f"Recording{args.engine}"), Params(engine_params)
        ),
        task=TaskSpec(name="piqa", dataset=dataset_dict),
        train_steps=args.steps,
        batch_size=args.batch_size,
        seed=args.seed,
        validate_every=args.validate_every,
        runtime=TrainRuntime(
            device_count=args.world_size, checkpoint_every=args.steps, log_every=1
        ),
    )
    started = time.perf_counter()
    try:
        trained = step.result(LocalWorkspace(workspace_dir))
        wall_s = time.perf_counter() - started
        log = trained.training_log
        del trained
    finally:
        os.environ.pop(STEP_LOG_ENV, None)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    steps = _read_lines(step_log)
    shutil.rmtree(workspace_dir, ignore_errors=True)

    losses = [r["train_loss"] for r in log if "train_loss" in r]
    validation = [
        {k: r[k] for k in r if k == "step" or k.startswith("val_")} for r in log if "val_acc" in r
    ]
    nonfinite = [r["step"] for r in log if "train_loss" in r and not math.isfinite(r["train_loss"])]
    result: dict[str, Any] = {
        "precision": precision,
        "wall_s": round(wall_s, 1),
        "steps_logged": len(losses),
        "losses": losses,
        "any_nonfinite": bool(nonfinite),
        "nonfinite_steps": nonfinite,
        "final_loss": losses[-1] if losses else None,
        f"final_loss_mean_last_{args.final_window}": _tail_mean(losses, args.final_window),
        "validation": validation,
    }
    if len(steps) >= 2:
        intervals = [b["t"] - a["t"] for a, b in zip(steps, steps[1:], strict=False)]
        # Steps followed by validation or checkpointing take longer: the median is the step.
        result["median_step_interval_s"] = round(_bench.median(intervals), 4)
        result["train_loop_s"] = round(steps[-1]["t"] - steps[0]["t"], 1)
    scaled = [s for s in steps if "skipped" in s]
    if scaled:
        result["skipped_steps"] = [i + 1 for i, s in enumerate(steps) if s.get("skipped")]
        result["num_skipped_steps"] = len(result["skipped_steps"])
        result["grad_scale_final"] = scaled[-1]["scale_after"]
    else:
        result["skipped_steps"] = None  # no grad scaler: steps are never skipped
    return result


def _read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _tail_mean(values: list[float], window: int) -> float | None:
    tail = values[-window:]
    return sum(tail) / len(tail) if tail else None


def compare(runs: list[dict[str, Any]], window: int, tolerance: float) -> dict[str, Any]:
    """Relative difference of each run's final loss from the fp32 run's."""
    reference = next((r for r in runs if r["precision"] == "32-true" and "error" not in r), None)
    if reference is None:
        return {"reference": None}
    key = f"final_loss_mean_last_{window}"
    out: dict[str, Any] = {"reference": "32-true", "tolerance": tolerance}
    for run in runs:
        if run is reference or "error" in run or run["final_loss"] is None:
            continue
        last = abs(run["final_loss"] - reference["final_loss"]) / abs(reference["final_loss"])
        mean = abs(run[key] - reference[key]) / abs(reference[key])
        out[run["precision"]] = {
            "rel_diff_final_loss": round(last, 5),
            f"rel_diff_mean_last_{window}": round(mean, 5),
            "within_tolerance": bool(mean <= tolerance and not run["any_nonfinite"]),
            "max_abs_loss_diff_any_step": round(
                max(abs(a - b) for a, b in zip(run["losses"], reference["losses"], strict=False)),
                5,
            ),
        }
    return out


def markdown(report: dict[str, Any]) -> str:
    env = report["environment"]
    s = report["settings"]
    window = s["final_window"]
    lines = [
        f"# Precision run: {env.get('gpu_name') or 'CPU'}, commit {str(env.get('commit'))[:12]}",
        "",
        f"{s['engine']} engine, world size {s['world_size']}, {s['shape']} random init, PIQA, "
        f"{s['steps']} steps x batch {s['batch_size']}, AdamW lr {s['lr']}, seed {s['seed']}.",
        "",
        f"| precision | final loss | mean last {window} | rel diff vs fp32 (last / mean) | "
        "non-finite | skipped | val acc | wall s | step ms |",
        "|---|---:|---:|---:|---|---:|---|---:|---:|",
    ]
    comparison = report.get("comparison", {})
    for run in report["runs"]:
        if "error" in run:
            lines.append(
                f"| {run['precision']} | {run['error']}: {run['message'][:100]} |" + " |" * 7
            )
            continue
        diff = comparison.get(run["precision"])
        rel = (
            "–"
            if diff is None
            else (
                f"{100 * diff['rel_diff_final_loss']:.2f}% / "
                f"{100 * diff[f'rel_diff_mean_last_{window}']:.2f}%"
            )
        )
        accs = ", ".join(f"{v['val_acc']:.3f}@{v['step']}" for v in run["validation"])
        skipped = "–" if run["skipped_steps"] is None else str(run["num_skipped_steps"])
        step_ms = run.get("median_step_interval_s")
        lines.append(
            f"| {run['precision']} | {run['final_loss']:.4f} "
            f"| {run[f'final_loss_mean_last_{window}']:.4f} | {rel} | {run['any_nonfinite']} "
            f"| {skipped} | {accs} | {run['wall_s']} "
            f"| {'–' if step_ms is None else f'{1000 * step_ms:.1f}'} |"
        )
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _bench.add_data_arguments(parser)
    parser.add_argument(
        "--precisions",
        default="32-true,bf16-mixed,16-mixed",
        help="comma list; PRECISION+RECIPE adds the engine's float8, e.g. bf16-mixed+tensorwise",
    )
    parser.add_argument("--engine", choices=sorted(ENGINES), default="fairscale")
    parser.add_argument("--sharding", default="{}", help="the sharded engines' sharding, JSON")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=16, help="global, over all devices")
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--validate-every", type=int, default=100)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--max-grad-norm", type=float, default=None)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--limit", type=int, default=None, help="examples per PIQA split")
    parser.add_argument("--final-window", type=int, default=20)
    parser.add_argument("--tolerance", type=float, default=0.02)
    parser.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="do not start another precision after this many seconds",
    )
    parser.add_argument("--work-dir", default=None, help="where the temporary workspaces go")
    parser.add_argument("--commit", default=None, help="code commit (default BENCH_COMMIT / git)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="CPU smoke test: 2-layer 64-dim model, 64 examples/split, 10 steps",
    )
    args = parser.parse_args(argv)
    if args.tiny:
        args.shape, args.limit, args.steps = "tiny", args.limit or 64, 10
        args.batch_size, args.validate_every, args.final_window = 8, 5, 3
    args.model_config = _bench.gpt2_config(args.shape)
    args.tokenizer = str(Path(args.tokenizer).resolve())
    return args


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = parse_args(argv)
    from tango_fairscale.tasks.piqa import read_piqa

    started = time.perf_counter()
    if not Path(args.tokenizer).is_dir():
        raise SystemExit(f"--tokenizer {args.tokenizer} is not a directory")
    dataset_dict = read_piqa(args.piqa, args.limit)
    report: dict[str, Any] = {
        "benchmark": "precision_run",
        "environment": _bench.environment(args.commit),
        "settings": {
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "train_examples": len(dataset_dict["train"]),
            "validation_examples": len(dataset_dict["validation"]),
            "optimizer": {"type": "torch::AdamW", "lr": args.lr, "weight_decay": 0.0},
            "path": "the tango_fairscale::train step's result(LocalWorkspace(tmp)); the engine "
            "class adds only a per-step record (wall clock, grad-scaler scale)",
            "loss": "train_loss logged every step (mean over ranks of the step's loss)",
        },
        "runs": [],
    }
    for precision in args.precisions.split(","):
        elapsed = time.perf_counter() - started
        if args.budget_s is not None and elapsed > args.budget_s:
            report["runs"].append(
                {
                    "precision": precision,
                    "error": "skipped",
                    "message": f"budget of {args.budget_s} s spent",
                }
            )
            continue
        print(f"=== precision {precision}: start", flush=True)
        try:
            run = run_once(args, precision, dataset_dict)
        except Exception as error:  # recorded; the other precisions still run
            run = {
                "precision": precision,
                "error": "OOM" if _bench.is_oom(error) else "error",
                "message": _bench.short_error(error),
                "traceback": traceback.format_exc()[-3000:],
            }
        report["runs"].append(run)
        report["comparison"] = compare(report["runs"], args.final_window, args.tolerance)
        report["total_wall_s"] = round(time.perf_counter() - started, 1)
        _bench.write_json(args.out, report)
        _bench.write_text(args.out.with_suffix(".md"), markdown(report))
        summary = run.get("message") or (
            f"final loss {run['final_loss']:.4f}, non-finite {run['any_nonfinite']}, "
            f"wall {run['wall_s']} s"
        )
        print(f"=== precision {precision}: {summary}", flush=True)
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
