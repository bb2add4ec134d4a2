"""Where a process's first scoring pass loses the GPU, forward by forward.

A GPT-2 124M (random weights, bf16-mixed, one GPU) scores the synthetic suite's shapes
(``scoring_probe.task_queries``: HellaSwag's, then MMLU's) twice in a fresh process, as
``score_queries`` scores them in a ``task_scores`` step (batches of 1,024 queries and 32,768
tokens, packed). For each pass: its wall seconds, NVML's busy share, and per forward the host's
milliseconds packing it and inside ``forward()``, the GPU's milliseconds between CUDA events
around it, the GPU's gap before it, and whether its ``(rows, width)`` shape is new to the process;
the GPU's idle time before the first forward and after the last.

``--variant``: ``default``; ``bucket`` (each packed batch padded to a multiple of 8 rows and 64
positions: few shapes, more padding). Run each variant in a process of its own: the first
forward's cost is once a process.

    python benchmarks/first_pass_probe.py --variant default [--tokenizer DIR] [--out F.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402
from scoring_probe import task_queries  # noqa: E402

_bench.setup_paths()

VARIANTS = ("default", "bucket")
#: A packed batch of the ``bucket`` variant: rows a multiple of this, positions of the second.
BUCKET = (8, 64)
PAD_VALUES = {"input_ids": 0, "attention_mask": 0, "labels": -100, "position_ids": 0}


def bucketed(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``batch`` (packed) with rows of padding added, and positions of padding on each row."""
    rows, width = batch["input_ids"].shape
    new_rows = -(-rows // BUCKET[0]) * BUCKET[0]
    new_width = -(-width // BUCKET[1]) * BUCKET[1]
    grown = {}
    for key, value in batch.items():
        filled = torch.full((new_rows, new_width), PAD_VALUES.get(key, -1), dtype=value.dtype)
        filled[:rows, :width] = value
        grown[key] = filled
    return grown


class ForwardLog:
    """Each forward of a pass: packing ms, host ms, CUDA events around it, whether it is new."""

    def __init__(self, model: Any, device: torch.device, bucket: bool) -> None:
        self.model, self.device, self.bucket = model, device, bucket
        self.rows: list[dict[str, Any]] = []
        self.seen: set[tuple[int, ...]] = set()

    def pack(self, pack: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            batch = pack(*args, **kwargs)
            batch = bucketed(batch) if self.bucket else batch
            self.rows.append({"pack_ms": (time.perf_counter() - started) * 1e3})
            return batch

        return timed

    def __call__(self, batch: dict[str, torch.Tensor]) -> Any:
        from tango_fairscale.runtime.devices import move_batch

        row = self.rows[-1]
        shape = tuple(batch["input_ids"].shape)
        row["new_shape"] = shape not in self.seen
        self.seen.add(shape)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        started = time.perf_counter()
        start.record()
        outputs = self.model(**move_batch(batch, self.device))
        end.record()
        row["host_ms"] = (time.perf_counter() - started) * 1e3
        row["events"] = (start, end)
        return outputs


def pass_figures(log: ForwardLog, begin: Any, finish: Any) -> dict[str, Any]:
    """A pass's per-forward figures (after ``torch.cuda.synchronize``)."""
    rows = log.rows
    gpu = [row["events"][0].elapsed_time(row["events"][1]) for row in rows]
    gaps = [a["events"][1].elapsed_time(b["events"][0]) for a, b in zip(rows, rows[1:])]
    new = [i for i, row in enumerate(rows) if row["new_shape"]]
    seen = [i for i, row in enumerate(rows) if not row["new_shape"]]

    def mean(values: list[float], indices: list[int]) -> float | None:
        return round(sum(values[i] for i in indices) / len(indices), 2) if indices else None

    host = [row["host_ms"] for row in rows]
    return {
        "forwards": len(rows),
        "new_shapes": len(new),
        "pack_ms_sum": round(sum(row["pack_ms"] for row in rows), 1),
        "host_ms_sum": round(sum(host), 1),
        "gpu_ms_sum": round(sum(gpu), 1),
        "gpu_ms_sum_after_first": round(sum(gpu[1:]), 1),
        "gap_ms_sum": round(sum(gaps), 1),
        "first_forward_gpu_ms": round(gpu[0], 1),
        "gpu_ms_new_shape_after_first": mean(gpu, [i for i in new if i > 0]),
        "gpu_ms_seen_shape": mean(gpu, seen),
        "largest_gaps_ms": sorted((round(g, 1) for g in gaps), reverse=True)[:5],
        "gpu_idle_before_first_forward_ms": round(begin.elapsed_time(rows[0]["events"][0]), 1),
        "gpu_idle_after_last_forward_ms": round(rows[-1]["events"][1].elapsed_time(finish), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", choices=VARIANTS, default="default")
    _bench.add_data_arguments(parser)
    parser.add_argument("--out", type=Path, default=Path("first_pass_probe.json"))
    args = parser.parse_args()
    from tango_fairscale.evaluation import scoring
    from tango_fairscale.evaluation.call import EvalOptions
    from tango_fairscale.evaluation.lm import scoring_precision
    from tango_fairscale.model.causal_lm import ModelWrapper
    from tango_fairscale.parallel.precision import resolve_precision

    device = torch.device("cuda")
    model = ModelWrapper(config=_bench.gpt2_config("124m"), tokenizer=str(args.tokenizer))
    model.eval().to(device)
    log = ForwardLog(model, device, bucket=args.variant == "bucket")
    scoring.packed_batch = log.pack(scoring.packed_batch)  # type: ignore[assignment]
    precision = resolve_precision("bf16-mixed", device)
    options = EvalOptions(1024, 32768, packed=True, progress=False)
    sampler = _bench.GpuSampler()
    sampler.start()
    rows = []
    with scoring_precision(model, precision):
        queries = {task: task_queries(task) for task in ("hellaswag", "mmlu")}
        for label in ("first", "second"):
            for task, task_queries_ in queries.items():
                log.rows.clear()
                begin, finish = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                started = time.perf_counter()
                begin.record()
                scoring.score_queries(log, task_queries_, options, pad_token_id=0, device=device)
                finish.record()
                torch.cuda.synchronize()
                window = (started, time.perf_counter())
                figures = pass_figures(log, begin, finish)
                rows.append(
                    {
                        "variant": args.variant,
                        "pass": label,
                        "task": task,
                        "wall_s": round(window[1] - window[0], 3),
                        "nvml_busy_pct": sampler.busy(window),
                        **figures,
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    sampler.stopped.set()
    environment = {**_bench.environment(None), "variant": args.variant}
    _bench.write_json(args.out, {"environment": environment, "passes": rows})


if __name__ == "__main__":
    main()
