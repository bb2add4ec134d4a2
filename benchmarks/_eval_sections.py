"""eval_speed.py's sections, in the order they run; each adds its part to the report.

(a) :func:`batch_sizes`: the scoring path at each ``--batch-sizes`` (fp32), and its parts:
    scoring pre-tokenized queries, and the forwards alone on batches already on the device;
(b) :func:`single_queries`: one query at a time on the first ``--single-queries`` queries;
(c) :func:`variants`: fp32 / TF32 / bf16 autocast around the path at the largest batch size,
    with their log-likelihood differences and changed predictions;
(d) :func:`token_budgets`: the path with ``max_batch_tokens`` at ``32-true`` and ``bf16-mixed``
    for each layout (padded rows, or packed: ``pack_sequences``);
(e) :func:`profile`: ``--profile``: one warm run of the first budget in bf16 under the profiler;
(f) :func:`tokenizer_threads`: tokenization with the tokenizer's thread pool against without.

Times are the fastest of ``--repeats`` after a warm-up; sections past ``--budget-s`` are skipped
(noted in the report).
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass
from typing import Any

import _bench
import _eval_paths as paths
import _piqa


@dataclass
class Run:
    """What every section shares: the model, the data, the settings and the report."""

    args: Any
    model: Any
    examples: list[dict[str, Any]]
    queries: list[Any]
    device: Any
    clock: paths.Clock
    report: dict[str, Any]
    started: float
    #: Section (a)'s fp32 scores at its first batch size: what the other scores are compared to.
    reference_scores: list[float] | None = None

    def over_budget(self, reserve: float = 0.0) -> bool:
        budget = self.args.budget_s
        return budget is not None and time.perf_counter() - self.started + reserve > budget

    def note(self, text: str) -> None:
        self.report["notes"].append(text)

    def step(self, **options: Any) -> list[float]:
        return paths.run_scoring(self.model, self.examples, **options)

    def metrics(self, scores: list[float]) -> dict[str, float]:
        return _piqa.accuracy(self.examples, scores)

    def reference(self) -> list[float]:
        if self.reference_scores is None:
            raise SystemExit("section (a) runs first: --batch-sizes needs at least one size")
        return self.reference_scores


def largest_diff(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b))


def batch_sizes(run: Run, sizes: list[int]) -> None:
    import torch

    from tango_fairscale.data.schedules import scoring_batches

    n = len(run.queries)
    run.report["batch_sizes"] = []
    for bs in sizes:
        if run.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(run.device)
        step_times = []
        scores: list[float] = []
        for repeat in range(run.args.repeats):
            if repeat and run.over_budget(reserve=30):
                run.note(f"batch {bs}: repeats cut at {repeat} (budget)")
                break
            scores, seconds = run.clock.time(functools.partial(run.step, batch_size=bs))
            step_times.append(seconds)
        if run.reference_scores is None:
            run.reference_scores = scores
        metrics = run.metrics(scores)
        score = functools.partial(paths.score, run.model, run.queries, bs, run.device)
        score_times = [run.clock.time(score)[1] for _ in range(max(1, min(run.args.repeats, 2)))]
        batches = paths.device_batches(run.model, run.queries, bs, run.device)
        forwards = functools.partial(paths.forwards, run.model, batches)
        forwards()
        forward_times = [run.clock.time(forwards)[1] for _ in range(max(1, run.args.repeats))]
        del batches, forwards
        entry: dict[str, Any] = {
            "batch_size": bs,
            "num_forwards": len(scoring_batches(run.queries, bs)),
            "step_s": round(min(step_times), 4),
            "step_s_all": [round(t, 4) for t in step_times],
            "step_queries_per_s": round(n / min(step_times), 1),
            "score_only_s": round(min(score_times), 4),
            "score_only_queries_per_s": round(n / min(score_times), 1),
            "forward_only_s": round(min(forward_times), 4),
            "forward_only_queries_per_s": round(n / min(forward_times), 1),
            "acc": metrics["acc"],
            "acc_norm": metrics["acc_norm"],
            "max_abs_diff_vs_first_batch_size": largest_diff(scores, run.reference()),
        }
        if run.device.type == "cuda":
            entry["peak_allocated_gib"] = _bench.gib(torch.cuda.max_memory_allocated(run.device))
        run.report["batch_sizes"].append(entry)
        progress(f"batch {bs}", entry)


def single_queries(run: Run) -> None:
    if run.over_budget(reserve=20):
        run.note("one-at-a-time skipped (budget)")
        return
    subset = run.queries[: run.args.single_queries]
    paths.one_at_a_time(run.model, subset[:5], run.device)  # warm-up
    single, seconds = run.clock.time(lambda: paths.one_at_a_time(run.model, subset, run.device))
    run.report["one_at_a_time"] = {
        "queries": len(subset),
        "s": round(seconds, 4),
        "queries_per_s": round(len(subset) / seconds, 1),
        "max_abs_diff_vs_batched": largest_diff(single, run.reference()[: len(subset)]),
    }
    progress("one at a time", run.report["one_at_a_time"])


def variants(run: Run, names: list[str], batch_size: int) -> None:
    n = len(run.queries)
    reference = run.reference()
    run.report["variants"] = []
    for variant in names:
        if run.over_budget(reserve=10):
            run.note(f"variant {variant} skipped (budget)")
            continue
        with paths.variant_context(variant, run.device):
            paths.score(run.model, run.queries, batch_size, run.device)  # warm-up (new kernels)
            times = []
            scores: list[float] = []
            for _ in range(max(1, min(run.args.repeats, 2))):
                scores, seconds = run.clock.time(lambda: run.step(batch_size=batch_size))
                times.append(seconds)
            _, score_s = run.clock.time(
                lambda: paths.score(run.model, run.queries, batch_size, run.device)
            )
        metrics = run.metrics(scores)
        choices = [int(a < b) for a, b in zip(scores[::2], scores[1::2])]
        reference_choices = [int(a < b) for a, b in zip(reference[::2], reference[1::2])]
        entry = {
            "variant": variant,
            "batch_size": batch_size,
            "step_s": round(min(times), 4),
            "step_queries_per_s": round(n / min(times), 1),
            "score_only_queries_per_s": round(n / score_s, 1),
            "max_abs_diff_vs_fp32": largest_diff(scores, reference),
            "acc": metrics["acc"],
            "acc_norm": metrics["acc_norm"],
            "predictions_changed_vs_fp32": sum(a != b for a, b in zip(choices, reference_choices)),
        }
        run.report["variants"].append(entry)
        progress(f"variant {variant}", entry)


def token_budgets(run: Run, budgets: list[int], layouts: list[str], batch_size: int) -> None:
    n = len(run.queries)
    run.report["token_budgets"] = []
    for precision in ("32-true", "bf16-mixed"):
        for budget in budgets:
            for layout in layouts:
                if run.over_budget(reserve=10):
                    run.note(f"token budget {budget} {precision} {layout} skipped (budget)")
                    continue
                step = functools.partial(
                    run.step,
                    batch_size=batch_size,
                    max_batch_tokens=budget,
                    precision=precision,
                    pack_sequences=layout == "packed",
                )
                step()  # warm-up
                times = []
                scores: list[float] = []
                for _ in range(max(1, run.args.repeats)):
                    scores, seconds = run.clock.time(step)
                    times.append(seconds)
                metrics = run.metrics(scores)
                layout_counts = paths.batch_layout(
                    run.queries, batch_size, budget, layout == "packed", run.model.pad_token_id
                )
                entry = {
                    "step_s": round(min(times), 4),
                    "acc": metrics["acc"],
                    "acc_norm": metrics["acc_norm"],
                    "precision": precision,
                    "max_batch_tokens": budget,
                    "layout": layout,
                    **layout_counts,
                    "step_queries_per_s": round(n / min(times), 1),
                    "max_abs_diff_vs_fp32": largest_diff(scores, run.reference()),
                }
                run.report["token_budgets"].append(entry)
                progress(f"budget {budget} {precision} {layout}", entry)


def profile(run: Run, budget: int, layout: str, batch_size: int) -> None:
    if run.device.type != "cuda":
        run.note("profile skipped (GPU kernels only)")
        return
    if run.over_budget(reserve=10):
        run.note("profile skipped (budget)")
        return
    step = functools.partial(
        run.step,
        batch_size=batch_size,
        max_batch_tokens=budget,
        precision="bf16-mixed",
        pack_sequences=layout == "packed",
    )
    step()  # warm
    run.report["profile"] = {
        "precision": "bf16-mixed",
        "max_batch_tokens": budget,
        "layout": layout,
        "tokenize_s": run.report["tokenize"]["warm_s"],
        "gpu_ms": paths.profile_run(step, run.clock),
    }
    progress("profile", run.report["profile"]["gpu_ms"])


def tokenizer_threads(run: Run) -> None:
    """Tokenization with ``TOKENIZERS_PARALLELISM`` false, then true (it stays so after)."""
    threads = {}
    for setting in ("false", "true"):
        os.environ["TOKENIZERS_PARALLELISM"] = setting
        paths.encode_choices(run.model, run.examples)
        _, threads[setting] = run.clock.time(lambda: paths.encode_choices(run.model, run.examples))
    run.report["tokenize"]["parallel_warm_s"] = round(threads["true"], 4)
    run.report["tokenize"]["serial_warm_s"] = round(threads["false"], 4)


def progress(label: str, entry: dict[str, Any]) -> None:
    print(f"=== {label}: {entry}", flush=True)
