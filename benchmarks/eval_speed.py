"""PIQA validation scoring speed of the package's evaluation path (GPU, GPT-2 124M shape).

Scores all of PIQA validation (1,838 examples = 3,676 queries) with a randomly initialised
GPT-2-shaped model (no pretrained weights offline: speed does not depend on the weights) and
measures, after a warm-up pass (sections in ``_eval_sections.py``, the measured calls in
``_eval_paths.py``, the Markdown in ``_eval_report.py``):

* **the scoring path** (``step`` in the JSON) as the package's evaluation runs it, at each
  ``--batch-sizes``: both choices of every example encoded as lm-eval encodes them, then scored
  by ``score_queries`` (length-sorted right-padded batches, one forward each); wall time and
  queries/s (the fastest of ``--repeats``); and its parts: tokenization alone, scoring
  pre-tokenized queries (collate + copy + forward + ``.cpu()``), and the forwards alone on
  pre-collated batches already on the device (an upper bound for this model);
* **one query at a time** (lm-evaluation-harness with batch size 1: full-vocabulary logits,
  ``log_softmax``, sum at the continuation) on the first ``--single-queries`` queries;
* **precision variants** at the largest batch size: fp32 (the default), TF32 matmuls
  (GPU only) and ``torch.autocast(bfloat16)`` around the path; each with its largest absolute
  log-likelihood difference from fp32, its ``acc`` / ``acc_norm`` and how many predictions change;
* **token budgets**: the path with ``batch_size`` ``--budget-batch-size`` and each
  ``--token-budgets`` value as ``max_batch_tokens``, at ``32-true`` and ``bf16-mixed`` (the
  evaluation's ``precision``), for each ``--layouts``: ``padded`` (right-padded rows) and
  ``packed`` (``pack_sequences``: queries end to end, a shared context once);
* ``--profile``: one more bf16 run under ``torch.profiler`` (GPU kernel time by kind);
* tokenization with the tokenizer's thread pool on (``TOKENIZERS_PARALLELISM=true``) and off.

The target is 20,000 queries/s for 124M on one H200; the report states the gap.

Run by path (``benchmarks/`` is not a package)::

    python benchmarks/eval_speed.py --piqa .gpudata/piqa --tokenizer .gpudata/gpt2-tokenizer \
        --out /tmp/eval_speed.json
    python benchmarks/eval_speed.py --tiny --out /tmp/eval_speed_cpu.json   # CPU smoke test

Writes ``--out`` (JSON, rewritten after every section) and the same name with ``.md``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402

_bench.setup_paths()

import _eval_paths  # noqa: E402
import _eval_report  # noqa: E402
import _eval_sections as sections  # noqa: E402
import _piqa  # noqa: E402


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
    parser.add_argument(
        "--profile",
        action="store_true",
        help="one more run (bf16-mixed, the first token budget and layout) under "
        "torch.profiler: GPU kernel time by kind against wall time (GPU only)",
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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from tango_fairscale.model.causal_lm import ModelWrapper

    started = time.perf_counter()
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    clock = _eval_paths.Clock(device)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b]
    variants = [v for v in args.variants.split(",") if v]
    if device.type != "cuda":
        variants = [v for v in variants if v != "tf32"]
    budgets = [int(b) for b in args.token_budgets.split(",") if b]

    examples = _piqa.examples(args.piqa, "validation", args.examples)
    model_config = _bench.gpt2_config(args.shape)
    with torch.device(device):
        model, build_s = clock.time(
            lambda: ModelWrapper(config=model_config, tokenizer=str(args.tokenizer), seed=args.seed)
        )
    model = model.eval()
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
        "target_queries_per_s": _eval_report.TARGET_QUERIES_PER_S,
        "earlier_queries_per_s": _eval_report.EARLIER_QUERIES_PER_S,
        "notes": [],
    }
    # Tokenization: the first call fills the tokenizer's word cache.
    queries, first_s = clock.time(lambda: _eval_paths.encode_choices(model, examples))
    _, warm_s = clock.time(lambda: _eval_paths.encode_choices(model, examples))
    lengths = [len(q) for q in queries]
    report["data"] = {
        "split": "PIQA validation",
        "examples": len(examples),
        "queries": len(queries),
        "tokens": sum(lengths),
        "scored_tokens": sum(q.continuation_length for q in queries),
        "mean_tokens_per_query": round(sum(lengths) / len(queries), 1),
        "max_tokens_per_query": max(lengths),
        # Sections (a)-(c) score right-padded rows, the default; (d) compares layouts.
        "packed": False,
        "padding_fraction_by_batch_size": {
            str(bs): _eval_paths.batch_layout(queries, bs, None, False, model.pad_token_id)[
                "padding_fraction"
            ]
            for bs in batch_sizes
        },
    }
    report["tokenize"] = {
        "first_s": round(first_s, 4),
        "warm_s": round(warm_s, 4),
        "queries_per_s_warm": round(len(queries) / warm_s, 1),
    }
    run = sections.Run(args, model, examples, queries, device, clock, report, started)

    def save() -> None:
        report["total_wall_s"] = round(time.perf_counter() - started, 1)
        report["summary"] = _eval_report.summarize(report)
        _bench.write_json(args.out, report)
        _bench.write_text(args.out.with_suffix(".md"), _eval_report.markdown(report))

    # Warm-up: kernels, allocator, autotuning for every batch size.
    _, warmup_s = clock.time(
        lambda: [_eval_paths.score(model, queries, bs, device) for bs in batch_sizes]
    )
    report["warmup_s"] = round(warmup_s, 2)
    sections.batch_sizes(run, batch_sizes)
    save()
    sections.single_queries(run)
    save()
    sections.variants(run, variants, max(batch_sizes))
    save()
    sections.token_budgets(run, budgets, args.layouts, args.budget_batch_size)
    save()
    if args.profile and budgets:
        sections.profile(run, budgets[0], args.layouts[0], args.budget_batch_size)
    sections.tokenizer_threads(run)
    save()
    print(_eval_report.markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
