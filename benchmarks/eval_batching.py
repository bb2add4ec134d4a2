"""Eval speed: one query at a time (lm-eval style) vs the package's batched ``score_queries``.

Run by path (``benchmarks`` must not be imported as a package: FairScale installs a top-level
package of that name)::

    python benchmarks/eval_batching.py --out benchmarks/results/eval_batching_cpu.json

Both sides score the same queries (both choices of the first ``--examples`` PIQA validation
examples) with the same seeded, randomly initialised GPT-2-shaped model:

* **one at a time**: a plain Hugging Face forward of each unpadded query,
  ``log_softmax(model(input_ids).logits)`` and the sum at the continuation tokens — what
  lm-evaluation-harness does with batch size 1;
* **batched**: :func:`tango_fairscale.evaluation.score_queries` (length-sorted, right-padded
  batches of ``--batch-size``; the vocabulary projection only at scored positions).

The default model is 4 layers × 256 dims × 4 heads (GPT-2's vocabulary and 1,024 positions): the
124M shape is too slow on a 2-core CPU. The JSON records the machine, versions, model shape,
timings (the fastest of ``--repeats`` alternating runs), speedup and the largest absolute
difference between the two sides' log-likelihoods.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import transformers

from tango_fairscale.batching import Query, choice_queries
from tango_fairscale.data import read_piqa
from tango_fairscale.evaluation import score_queries
from tango_fairscale.model import ModelWrapper

REPO_ROOT = Path(__file__).resolve().parents[1]
TARGET_SPEEDUP = 5.0


def parse_args() -> argparse.Namespace:
    default_data = Path(
        os.environ.get("TANGO_FAIRSCALE_SHARED_DATA", REPO_ROOT.parent / "shared" / "data")
    )
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, help="write the JSON result here (else print only)")
    parser.add_argument("--examples", type=int, default=200, help="first N validation examples")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--positions", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--repeats", type=int, default=3, help="time each side this often; report the fastest"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument(
        "--data-dir", type=Path, default=default_data, help="holds piqa/ and gpt2-tokenizer/"
    )
    return parser.parse_args()


def one_at_a_time(model: ModelWrapper, queries: list[Query]) -> list[float]:
    """lm-eval's scoring with batch size 1: full logits, log_softmax, gather the continuation."""
    scores = []
    with torch.inference_mode():
        for query in queries:
            tokens = torch.tensor([query.tokens])
            logits = model.model(tokens[:, :-1]).logits[0]
            log_probs = torch.log_softmax(logits, dim=-1)
            n = query.continuation_length
            targets = tokens[0, -n:]
            scores.append(float(log_probs[-n:].gather(1, targets[:, None]).sum()))
    return scores


def batched(model: ModelWrapper, queries: list[Query], batch_size: int) -> list[float]:
    with torch.inference_mode():
        return score_queries(
            lambda batch: model(**batch),
            queries,
            batch_size=batch_size,
            pad_token_id=model.pad_token_id,
            device=torch.device("cpu"),
            progress=False,
        )


def timed(function: Any, *args: Any) -> tuple[list[float], float]:
    start = time.perf_counter()
    scores = function(*args)
    return scores, time.perf_counter() - start


def git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def cpu_model_name() -> str:
    """``model name`` from /proc/cpuinfo (``platform.processor()`` is empty on most Linux)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    shape = {
        "model_type": "gpt2",
        "n_layer": args.layers,
        "n_embd": args.dim,
        "n_head": args.heads,
        "n_positions": args.positions,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
    }
    model = ModelWrapper(
        config=shape, tokenizer=str(args.data_dir / "gpt2-tokenizer"), seed=args.seed
    ).eval()
    examples = list(read_piqa(args.data_dir / "piqa", limit=args.examples)["validation"])
    queries = choice_queries(examples, model.tokenizer, model.max_length)

    # Warm up both paths (allocator, kernels) on a few queries before timing.
    one_at_a_time(model, queries[:4])
    batched(model, queries[: 2 * args.batch_size], args.batch_size)

    # Alternate the two sides and keep each one's fastest run: other load on the machine only
    # ever slows a run down.
    single_times, batch_times, batch1_times = [], [], []
    for _ in range(args.repeats):
        single_scores, seconds = timed(one_at_a_time, model, queries)
        single_times.append(seconds)
        batch_scores, seconds = timed(batched, model, queries, args.batch_size)
        batch_times.append(seconds)
        _, seconds = timed(batched, model, queries, 1)
        batch1_times.append(seconds)
    single_s, batch_s, batch1_s = min(single_times), min(batch_times), min(batch1_times)
    max_abs_diff = max(abs(a - b) for a, b in zip(single_scores, batch_scores, strict=True))
    speedup = single_s / batch_s

    result = {
        "benchmark": "eval_batching",
        "git_commit": git("rev-parse", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu": {
            "processor": platform.processor(),
            "model_name": cpu_model_name(),
            "machine": platform.machine(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()],
        },
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
        "model": {
            "shape": {k: shape[k] for k in ("n_layer", "n_embd", "n_head", "n_positions")},
            "vocab_size": model.model.config.vocab_size,
            "parameters": sum(p.numel() for p in model.model.parameters()),
            "seed": args.seed,
            "dtype": "float32",
        },
        "data": {
            "split": "PIQA validation",
            "examples": len(examples),
            "queries": len(queries),
            "tokens": sum(len(q) for q in queries),
            "scored_tokens": sum(q.continuation_length for q in queries),
        },
        "batch_size": args.batch_size,
        "repeats": args.repeats,
        "one_at_a_time": {
            "seconds": single_s,
            "queries_per_s": len(queries) / single_s,
            "all_seconds": single_times,
        },
        "batched": {
            "seconds": batch_s,
            "queries_per_s": len(queries) / batch_s,
            "all_seconds": batch_times,
        },
        # The package's forward with batch size 1: separates the gain of projecting only the
        # scored positions onto the vocabulary from the gain of batching.
        "package_batch_size_1": {
            "seconds": batch1_s,
            "queries_per_s": len(queries) / batch1_s,
            "all_seconds": batch1_times,
        },
        "speedup": speedup,
        "target_speedup": TARGET_SPEEDUP,
        "target_met": speedup >= TARGET_SPEEDUP,
        "max_abs_diff_loglikelihood": max_abs_diff,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    if max_abs_diff > 1e-3:
        sys.exit(f"log-likelihoods differ by up to {max_abs_diff} between the two paths")


if __name__ == "__main__":
    main()
