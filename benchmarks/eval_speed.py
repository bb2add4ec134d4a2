"""PIQA validation scoring speed of the package's evaluation path (GPU, GPT-2 124M shape).

Scores all of PIQA validation (1,838 examples = 3,676 queries) with a randomly initialised
GPT-2-shaped model (no pretrained weights offline: speed does not depend on the weights) and
measures, after a warm-up pass:

* **step path**: ``PiqaPredictionsStep().run(model, dataset_dict, "validation", batch_size)``, the
  ``tango_fairscale::piqa_predictions`` step's own code (tokenize with ``choice_queries``, then
  ``score_queries``: length-sorted right-padded batches, one forward each), at each
  ``--batch-sizes``; wall time and queries/s (the fastest of ``--repeats``, first run also kept);
* its parts: ``choice_queries`` alone (tokenization), ``score_queries`` on pre-tokenized queries
  (collate + copy + forward + ``.cpu()``), and the forwards alone on pre-collated batches already
  on the device (the model's compute: an upper bound for this model and precision);
* **one query at a time** (lm-evaluation-harness with batch size 1: full-vocabulary logits,
  ``log_softmax``, sum at the continuation) on the first ``--single-queries`` queries;
* **precision variants** at the largest batch size: fp32 (the step's default), TF32 matmuls
  (``torch.set_float32_matmul_precision("high")``, GPU only) and ``torch.autocast(bfloat16)``
  around the step; each with its largest absolute log-likelihood difference from fp32 and its
  ``acc`` / ``acc_norm`` (and how many examples' predictions change);
* **token budgets**: the step path with ``batch_size`` ``--budget-batch-size`` and each
  ``--token-budgets`` value as ``max_batch_tokens`` (at most that many padded tokens per forward),
  at ``32-true`` and ``bf16-mixed`` (the step's own ``precision``), for each ``--layouts``:
  ``padded`` (right-padded rows, the step's default) and ``packed`` (``pack_sequences``:
  queries end to end, a shared context once); and
  tokenization with the tokenizer's thread pool on (``TOKENIZERS_PARALLELISM=true``) against off.

The issue's target is 20,000 queries/s for 124M; the report states the gap.

Run by path (``benchmarks/`` is not a package)::

    python benchmarks/eval_speed.py --piqa .gpudata/piqa --tokenizer .gpudata/gpt2-tokenizer \
        --out /tmp/eval_speed.json
    python benchmarks/eval_speed.py --tiny --out /tmp/eval_speed_cpu.json   # CPU smoke test

Writes ``--out`` (JSON, rewritten after every section) and the same name with ``.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402

_bench.setup_paths()

TARGET_QUERIES_PER_S = 20_000
EARLIER_QUERIES_PER_S = 260  # the earlier attempt


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    shared = _bench.REPO_ROOT.parent / "shared" / "data"
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _bench.add_data_arguments(parser)
    parser.add_argument("--batch-sizes", default="32,128,512")
    parser.add_argument("--examples", type=int, default=None, help="first N validation examples")
    parser.add_argument("--single-queries", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--variants",
        default="fp32,tf32,bf16-autocast",
        help="precision variants at the largest batch size (tf32 needs a GPU)",
    )
    parser.add_argument("--token-budgets", default="8192,16384,32768,65536")
    parser.add_argument("--budget-batch-size", type=int, default=4096)
    parser.add_argument(
        "--layouts", default="packed,padded", help="batch layouts of the token-budget section"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--budget-s", type=float, default=None, help="skip repeats and sections past this"
    )
    parser.add_argument("--commit", default=None, help="code commit (default BENCH_COMMIT / git)")
    parser.add_argument("--out", type=Path, required=True, help="result JSON (and .md beside it)")
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="CPU smoke test: shape tiny, 40 examples, batch sizes 8,32, 10 single queries",
    )
    args = parser.parse_args(argv)
    if args.tiny:
        args.shape, args.batch_sizes, args.token_budgets = "tiny", "8,32", "512,2048"
        args.examples = args.examples or 40
        args.single_queries, args.repeats = min(args.single_queries, 10), 2
        if not args.piqa.is_dir() and (shared / "piqa").is_dir():
            args.piqa = shared / "piqa"
        if not args.tokenizer.is_dir() and (shared / "gpt2-tokenizer").is_dir():
            args.tokenizer = shared / "gpt2-tokenizer"
    args.layouts = [layout for layout in args.layouts.split(",") if layout]
    unknown = [layout for layout in args.layouts if layout not in ("packed", "padded")]
    if unknown:
        raise SystemExit(f"--layouts: unknown {', '.join(unknown)}; use packed or padded")
    if not (args.piqa / "valid.jsonl").is_file():
        raise SystemExit(f"--piqa {args.piqa} holds no valid.jsonl (official PIQA files)")
    if not args.tokenizer.is_dir():
        raise SystemExit(f"--tokenizer {args.tokenizer} is not a directory")
    return args


class Clock:
    """Wall time with device synchronisation on both ends."""

    def __init__(self, device: Any) -> None:
        self.device = device

    def sync(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def time(self, function: Callable[[], Any]) -> tuple[Any, float]:
        self.sync()
        begin = time.perf_counter()
        value = function()
        self.sync()
        return value, time.perf_counter() - begin


def batch_layout(
    queries: list[Any], batch_size: int, budget: int | None, packed: bool, pad_token_id: int
) -> dict[str, Any]:
    """Forwards, positions fed to the model and the padding among them, as scoring builds them."""
    from tango_fairscale.batching import collate, packed_batch, scoring_batches
    from tango_fairscale.evaluation import SCORING_WIDTH_MULTIPLE

    batches = scoring_batches(queries, batch_size, budget, packed)
    fed = real = 0
    for indices in batches:
        rows = [queries[i] for i in indices]
        if packed:
            mask = packed_batch(rows, pad_token_id, SCORING_WIDTH_MULTIPLE)["attention_mask"]
        else:
            mask = collate(rows, pad_token_id)["attention_mask"][:, :-1]
        fed += mask.numel()
        real += int(mask.sum())
    return {
        "num_forwards": len(batches),
        "positions_fed": fed,
        "padding_fraction": round(1 - real / fed, 4),
    }


@contextlib.contextmanager
def variant_context(name: str, device: Any) -> Iterator[None]:
    """fp32 as is; tf32 matmuls; or bf16 autocast around everything inside."""
    import torch

    if name == "fp32":
        yield
    elif name == "tf32":
        previous = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("high")
        try:
            yield
        finally:
            torch.set_float32_matmul_precision(previous)
    elif name == "bf16-autocast":
        with torch.autocast(device.type, dtype=torch.bfloat16):
            yield
    else:
        raise SystemExit(f"unknown variant {name!r}; use fp32, tf32 or bf16-autocast")


def one_at_a_time(model: Any, queries: list[Any], device: Any) -> list[float]:
    """lm-eval's scoring with batch size 1: full logits, log_softmax, gather the continuation."""
    import torch

    scores = []
    with torch.inference_mode():
        for query in queries:
            tokens = torch.tensor([query.tokens], device=device)
            logits = model.model(tokens[:, :-1]).logits[0].float()
            log_probs = torch.log_softmax(logits, dim=-1)
            n = query.continuation_length
            targets = tokens[0, -n:]
            scores.append(float(log_probs[-n:].gather(1, targets[:, None]).sum()))
    return scores


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch
    from tango.common.dataset_dict import DatasetDict

    from tango_fairscale.batching import choice_queries, collate, scoring_batches
    from tango_fairscale.data import read_piqa
    from tango_fairscale.evaluation import (
        PiqaPredictionsStep,
        metrics_from_predictions,
        piqa_predictions,
        score_queries,
    )
    from tango_fairscale.model import ModelWrapper, move_batch

    started = time.perf_counter()

    def over_budget(reserve: float = 0.0) -> bool:
        return args.budget_s is not None and time.perf_counter() - started + reserve > args.budget_s

    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    clock = Clock(device)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b]
    largest = max(batch_sizes)
    variants = [v for v in args.variants.split(",") if v]
    if device.type != "cuda":
        variants = [v for v in variants if v != "tf32"]

    examples = list(read_piqa(args.piqa, limit=args.examples)["validation"])
    dataset_dict = DatasetDict(splits={"validation": examples})
    model_config = _bench.gpt2_config(args.shape)
    build_begin = time.perf_counter()
    with torch.device(device):
        model = ModelWrapper(config=model_config, tokenizer=str(args.tokenizer), seed=args.seed)
    model = model.eval()
    clock.sync()
    build_s = time.perf_counter() - build_begin

    report: dict[str, Any] = {
        "benchmark": "eval_speed",
        "environment": _bench.environment(args.commit),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "device": str(device),
        "model": {
            "shape": args.shape,
            "config": model_config,
            "parameters": sum(p.numel() for p in model.model.parameters()),
            "init": f"random, seed {args.seed}",
            "dtype": "float32",
            "build_s": round(build_s, 2),
        },
        "target_queries_per_s": TARGET_QUERIES_PER_S,
        "earlier_queries_per_s": EARLIER_QUERIES_PER_S,
        "notes": [],
    }

    def save() -> None:
        report["total_wall_s"] = round(time.perf_counter() - started, 1)
        report["summary"] = summarize(report)
        _bench.write_json(args.out, report)
        _bench.write_text(args.out.with_suffix(".md"), markdown(report))

    # --- tokenization: the first call fills the tokenizer's word cache ---------------------
    (queries, first_tokenize_s) = clock.time(
        lambda: choice_queries(examples, model.tokenizer, model.max_length)
    )
    _, tokenize_s = clock.time(lambda: choice_queries(examples, model.tokenizer, model.max_length))
    n = len(queries)
    lengths = [len(q) for q in queries]
    report["data"] = {
        "split": "PIQA validation",
        "examples": len(examples),
        "queries": n,
        "tokens": sum(lengths),
        "scored_tokens": sum(q.continuation_length for q in queries),
        "mean_tokens_per_query": round(sum(lengths) / n, 1),
        "max_tokens_per_query": max(lengths),
    }
    report["tokenize"] = {
        "first_s": round(first_tokenize_s, 4),
        "warm_s": round(tokenize_s, 4),
        "queries_per_s_warm": round(n / tokenize_s, 1),
    }
    # Sections (a)-(c) score right-padded rows, the step's default; (d) compares layouts.
    report["data"]["packed"] = False
    for bs in batch_sizes:
        layout = batch_layout(queries, bs, None, False, model.pad_token_id)
        report["data"].setdefault("padding_fraction_by_batch_size", {})[str(bs)] = layout[
            "padding_fraction"
        ]

    def forward(batch: dict[str, torch.Tensor]) -> Any:
        return model(**batch)

    def run_step(bs: int) -> list[dict[str, Any]]:
        return PiqaPredictionsStep().run(
            model=model, dataset_dict=dataset_dict, split="validation", batch_size=bs
        )

    def run_scores(bs: int) -> list[float]:
        with torch.no_grad():
            return score_queries(
                forward, queries, batch_size=bs, pad_token_id=model.pad_token_id,
                device=device, progress=False,
            )  # fmt: skip

    def on_device_batches(bs: int) -> list[dict[str, torch.Tensor]]:
        return [
            move_batch(collate([queries[i] for i in b], model.pad_token_id), device)
            for b in scoring_batches(queries, bs)
        ]

    def run_forwards(batches: list[dict[str, torch.Tensor]]) -> None:
        with torch.no_grad():
            for batch in batches:
                model(**batch)

    # --- warm-up: kernels, allocator, autotuning for every batch size -------------------------
    _, warmup_s = clock.time(lambda: [run_scores(bs) for bs in batch_sizes])
    report["warmup_s"] = round(warmup_s, 2)

    # --- (a) the step path and its parts, fp32 ------------------------------------------------
    reference: list[float] | None = None
    report["batch_sizes"] = []
    for bs in batch_sizes:
        entry: dict[str, Any] = {
            "batch_size": bs,
            "num_forwards": len(scoring_batches(queries, bs)),
        }
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        step_times = []
        predictions = None
        for repeat in range(args.repeats):
            if repeat and over_budget(reserve=30):
                report["notes"].append(f"batch {bs}: repeats cut at {repeat} (budget)")
                break
            predictions, seconds = clock.time(functools.partial(run_step, bs))
            step_times.append(seconds)
        assert predictions is not None
        scores = [ll for p in predictions for ll in p["loglikelihoods"]]
        if reference is None:
            reference = scores
        metrics = metrics_from_predictions(predictions)
        score_times = []
        for _ in range(max(1, min(args.repeats, 2))):
            _, seconds = clock.time(functools.partial(run_scores, bs))
            score_times.append(seconds)
        batches = on_device_batches(bs)
        run_forwards(batches)
        forward_times = []
        for _ in range(max(1, args.repeats)):
            _, seconds = clock.time(functools.partial(run_forwards, batches))
            forward_times.append(seconds)
        del batches
        entry.update(
            step_s=round(min(step_times), 4),
            step_s_all=[round(t, 4) for t in step_times],
            step_queries_per_s=round(n / min(step_times), 1),
            score_only_s=round(min(score_times), 4),
            score_only_queries_per_s=round(n / min(score_times), 1),
            forward_only_s=round(min(forward_times), 4),
            forward_only_queries_per_s=round(n / min(forward_times), 1),
            acc=metrics["acc"],
            acc_norm=metrics["acc_norm"],
            max_abs_diff_vs_first_batch_size=max(
                abs(a - b) for a, b in zip(scores, reference, strict=True)
            ),
        )
        if device.type == "cuda":
            entry["peak_allocated_gib"] = _bench.gib(torch.cuda.max_memory_allocated(device))
        report["batch_sizes"].append(entry)
        print(f"=== batch {bs}: {one_line(entry)}", flush=True)
        save()
    assert reference is not None

    # --- (b) one query at a time --------------------------------------------------------------
    if over_budget(reserve=20):
        report["notes"].append("one-at-a-time skipped (budget)")
    else:
        subset = queries[: args.single_queries]
        one_at_a_time(model, subset[:5], device)  # warm-up
        single, seconds = clock.time(lambda: one_at_a_time(model, subset, device))
        report["one_at_a_time"] = {
            "queries": len(subset),
            "s": round(seconds, 4),
            "queries_per_s": round(len(subset) / seconds, 1),
            "max_abs_diff_vs_batched": max(
                abs(a - b) for a, b in zip(single, reference[: len(subset)], strict=True)
            ),
        }
        print(f"=== one at a time: {report['one_at_a_time']}", flush=True)
        save()

    # --- (c) precision variants at the largest batch size -------------------------------------
    report["variants"] = []
    reference_predictions = piqa_predictions(examples, queries, reference)
    for variant in variants:
        if over_budget(reserve=10):
            report["notes"].append(f"variant {variant} skipped (budget)")
            continue
        with variant_context(variant, device):
            run_scores(largest)  # warm-up (new kernels)
            times = []
            predictions = None
            for _ in range(max(1, min(args.repeats, 2))):
                predictions, seconds = clock.time(lambda: run_step(largest))
                times.append(seconds)
            _, score_s = clock.time(lambda: run_scores(largest))
        assert predictions is not None
        scores = [ll for p in predictions for ll in p["loglikelihoods"]]
        metrics = metrics_from_predictions(predictions)
        flipped = sum(_choice(p) != _choice(q) for p, q in zip(predictions, reference_predictions))
        entry = {
            "variant": variant,
            "batch_size": largest,
            "step_s": round(min(times), 4),
            "step_queries_per_s": round(n / min(times), 1),
            "score_only_queries_per_s": round(n / score_s, 1),
            "max_abs_diff_vs_fp32": max(abs(a - b) for a, b in zip(scores, reference)),
            "acc": metrics["acc"],
            "acc_norm": metrics["acc_norm"],
            "predictions_changed_vs_fp32": flipped,
        }
        report["variants"].append(entry)
        print(f"=== variant {variant}: {entry}", flush=True)
        save()
    # --- (d) token budgets, through the step's own precision ---------------------------------
    report["token_budgets"] = []
    for precision in ("32-true", "bf16-mixed"):
        for budget in [int(b) for b in args.token_budgets.split(",") if b]:
            for layout in args.layouts:
                if over_budget(reserve=10):
                    report["notes"].append(
                        f"token budget {budget} {precision} {layout} skipped (budget)"
                    )
                    continue
                entry = measure_budget(
                    functools.partial(
                        PiqaPredictionsStep().run,
                        model=model,
                        dataset_dict=dataset_dict,
                        batch_size=args.budget_batch_size,
                        max_batch_tokens=budget,
                        precision=precision,
                        pack_sequences=layout == "packed",
                    ),
                    clock,
                    max(1, args.repeats),
                )
                scores = entry.pop("scores")
                entry.update(
                    precision=precision,
                    max_batch_tokens=budget,
                    layout=layout,
                    **batch_layout(
                        queries,
                        args.budget_batch_size,
                        budget,
                        layout == "packed",
                        model.pad_token_id,
                    ),
                    step_queries_per_s=round(n / entry["step_s"], 1),
                    max_abs_diff_vs_fp32=max(abs(a - b) for a, b in zip(scores, reference)),
                )
                report["token_budgets"].append(entry)
                print(f"=== budget {budget} {precision} {layout}: {entry}", flush=True)
                save()
    import os

    threads = {}
    for setting in ("false", "true"):
        os.environ["TOKENIZERS_PARALLELISM"] = setting
        choice_queries(examples, model.tokenizer, model.max_length)
        _, threads[setting] = clock.time(
            lambda: choice_queries(examples, model.tokenizer, model.max_length)
        )
    report["tokenize"]["parallel_warm_s"] = round(threads["true"], 4)
    report["tokenize"]["serial_warm_s"] = round(threads["false"], 4)
    save()
    print(markdown(report))
    return 0


def measure_budget(run: Callable[[], Any], clock: Clock, repeats: int) -> dict[str, Any]:
    """The fastest of ``repeats`` step runs (after one warm-up) and the run's metrics and scores."""
    from tango_fairscale.evaluation import metrics_from_predictions

    run()
    times = []
    for _ in range(repeats):
        predictions, seconds = clock.time(run)
        times.append(seconds)
    metrics = metrics_from_predictions(predictions)
    return {
        "step_s": round(min(times), 4),
        "acc": metrics["acc"],
        "acc_norm": metrics["acc_norm"],
        "scores": [ll for p in predictions for ll in p["loglikelihoods"]],
    }


def _choice(prediction: dict[str, Any]) -> int:
    a, b = prediction["loglikelihoods"]
    return 0 if a >= b else 1


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    rows = report.get("batch_sizes") or []
    if not rows:
        return {}
    best = max(rows, key=lambda r: r["step_queries_per_s"])
    summary: dict[str, Any] = {
        "best_step_queries_per_s": best["step_queries_per_s"],
        "best_step_batch_size": best["batch_size"],
        "best_score_only_queries_per_s": max(r["score_only_queries_per_s"] for r in rows),
        "best_forward_only_queries_per_s": max(r["forward_only_queries_per_s"] for r in rows),
        "tokenize_only_queries_per_s": report["tokenize"]["queries_per_s_warm"],
    }
    for variant in report.get("variants") or []:
        key = f"{variant['variant']}_step_queries_per_s"
        summary[key] = variant["step_queries_per_s"]
    fastest = max(
        [best["step_queries_per_s"]]
        + [v["step_queries_per_s"] for v in report.get("variants") or []]
        + [v["step_queries_per_s"] for v in report.get("token_budgets") or []]
    )
    summary["fastest_step_queries_per_s"] = fastest
    summary["target_met"] = fastest >= TARGET_QUERIES_PER_S
    summary["shortfall_factor"] = round(TARGET_QUERIES_PER_S / fastest, 2)
    if "one_at_a_time" in report:
        summary["speedup_vs_one_at_a_time"] = round(
            best["step_queries_per_s"] / report["one_at_a_time"]["queries_per_s"], 1
        )
    return summary


def one_line(entry: dict[str, Any]) -> str:
    return (
        f"step {entry['step_s']:.3f} s = {entry['step_queries_per_s']:,.0f} q/s; score only "
        f"{entry['score_only_queries_per_s']:,.0f} q/s; forward only "
        f"{entry['forward_only_queries_per_s']:,.0f} q/s; acc {entry['acc']:.4f}"
    )


def markdown(report: dict[str, Any]) -> str:
    env = report["environment"]
    data = report.get("data", {})
    model = report["model"]
    lines = [
        f"# PIQA validation scoring speed: {env.get('gpu_name') or 'CPU'}, commit "
        f"{str(env.get('commit'))[:12]}, torch {env.get('torch')}, transformers "
        f"{env.get('transformers')}",
        "",
        f"GPT-2 {model['shape']} shape ({model['parameters']:,} parameters, random init, fp32 "
        f"weights), device `{report['device']}`; {data.get('examples')} examples = "
        f"{data.get('queries')} queries, {data.get('tokens'):,} tokens (mean "
        f"{data.get('mean_tokens_per_query')}, max {data.get('max_tokens_per_query')}). Times: "
        f"fastest of {report['settings']['repeats']} after a warm-up pass, device synchronised.",
        "",
        f"Tokenization alone (`choice_queries`): {report['tokenize']['warm_s']:.3f} s warm "
        f"({report['tokenize']['queries_per_s_warm']:,.0f} q/s; first call "
        f"{report['tokenize']['first_s']:.3f} s).",
        "",
        "## `tango_fairscale::piqa_predictions` path, fp32",
        "",
        "`step`: `PiqaPredictionsStep().run(...)` (tokenize + score); `score only`: "
        "`score_queries` on pre-tokenized queries; `forward only`: the forwards on pre-collated "
        "batches already on the device.",
        "",
        "| batch | forwards | pad % | step s | step q/s | score only q/s | forward only q/s | "
        "acc | acc_norm | peak alloc GiB |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    pads = data.get("padding_fraction_by_batch_size", {})
    for r in report.get("batch_sizes") or []:
        pad = pads.get(str(r["batch_size"]))
        lines.append(
            f"| {r['batch_size']} | {r['num_forwards']} | "
            f"{'–' if pad is None else f'{100 * pad:.1f}'} | {r['step_s']:.3f} "
            f"| {r['step_queries_per_s']:,.0f} | {r['score_only_queries_per_s']:,.0f} "
            f"| {r['forward_only_queries_per_s']:,.0f} | {r['acc']:.4f} | {r['acc_norm']:.4f} "
            f"| {r.get('peak_allocated_gib', '–')} |"
        )
    single = report.get("one_at_a_time")
    if single:
        lines += [
            "",
            "## One query at a time (lm-eval with batch size 1: full-vocabulary logits)",
            "",
            f"{single['queries']} queries in {single['s']:.3f} s = "
            f"**{single['queries_per_s']:,.0f} q/s**; largest |log-likelihood difference| from "
            f"the batched path: {single['max_abs_diff_vs_batched']:.2e}.",
        ]
    variants = report.get("variants") or []
    if variants:
        lines += [
            "",
            f"## Precision variants, batch {variants[0]['batch_size']} (step path)",
            "",
            "| variant | step s | step q/s | score only q/s | max abs diff vs fp32 | acc | "
            "acc_norm | predictions changed |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for v in variants:
            lines.append(
                f"| {v['variant']} | {v['step_s']:.3f} | {v['step_queries_per_s']:,.0f} "
                f"| {v['score_only_queries_per_s']:,.0f} | {v['max_abs_diff_vs_fp32']:.3g} "
                f"| {v['acc']:.4f} | {v['acc_norm']:.4f} | {v['predictions_changed_vs_fp32']} |"
            )
    budgets = report.get("token_budgets") or []
    if budgets:
        tokenize = report["tokenize"]
        lines += [
            "",
            f"## Token budgets (step path, batch_size {report['settings']['budget_batch_size']}, "
            "`max_batch_tokens`)",
            "",
            "`padded`: right-padded rows (the step's default); `packed`: `pack_sequences` "
            "(queries end to end, a shared context once). `positions`: "
            "positions fed to the model over all forwards.",
            "",
            "| precision | max_batch_tokens | layout | forwards | positions | pad % | step s "
            "| step q/s | max abs diff vs fp32 | acc | acc_norm |",
            "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for b in budgets:
            lines.append(
                f"| {b['precision']} | {b['max_batch_tokens']} | {b.get('layout', 'padded')} "
                f"| {b['num_forwards']} | {b.get('positions_fed', 0):,} "
                f"| {100 * b['padding_fraction']:.1f} | {b['step_s']:.3f} "
                f"| {b['step_queries_per_s']:,.0f} | {b['max_abs_diff_vs_fp32']:.3g} "
                f"| {b['acc']:.4f} | {b['acc_norm']:.4f} |"
            )
        if "parallel_warm_s" in tokenize:
            lines += [
                "",
                f"Tokenization: {tokenize['serial_warm_s']:.3f} s with "
                f"`TOKENIZERS_PARALLELISM=false`, {tokenize['parallel_warm_s']:.3f} s with the "
                "tokenizer's thread pool.",
            ]
    summary = report.get("summary") or {}
    if summary:
        verdict = "met" if summary["target_met"] else "**not met**"
        lines += [
            "",
            "## Target",
            "",
            f"Issue target {TARGET_QUERIES_PER_S:,} q/s (earlier attempt ~"
            f"{EARLIER_QUERIES_PER_S} q/s): fastest step path "
            f"{summary['fastest_step_queries_per_s']:,.0f} q/s — {verdict} (factor "
            f"{summary['shortfall_factor']} to go). Best fp32 score-only "
            f"{summary['best_score_only_queries_per_s']:,.0f} q/s, forward-only "
            f"{summary['best_forward_only_queries_per_s']:,.0f} q/s, tokenization alone "
            f"{summary['tokenize_only_queries_per_s']:,.0f} q/s."
            + (
                f" Batched vs one at a time: {summary['speedup_vs_one_at_a_time']}x."
                if "speedup_vs_one_at_a_time" in summary
                else ""
            ),
        ]
    for note in report.get("notes") or []:
        lines.append(f"\nNote: {note}")
    lines.append(f"\nTotal wall time {report.get('total_wall_s')} s.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
