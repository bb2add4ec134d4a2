"""What one chunk of the training loss costs on a GPU, by the way it is computed.

The scored-position loss (``tango_fairscale.model.loss``) projects a chunk of hidden states to
the vocabulary, computes each position's cross-entropy and its gradient from the logits at once
(``model.cross_entropy.chunk_cross_entropy``), then adds the chunk's weight gradient to the
total. For GPT-2's padded vocabulary (50,304) and the chunk sizes the package uses (4,096 rows:
compiled, steps of 4,096 scored tokens or more; 256 rows: the graphed PIQA steps, eager), the
median GPU milliseconds of:

* the cross-entropy and gradient: eager (in place, a scatter at the targets), compiled in place
  and compiled out of place (the package's compiled form, every size dynamic), and out of place
  with fixed sizes, with only the rows dynamic, and each of those with Inductor's
  coordinate-descent tuning, with the largest difference of each form's outputs from the
  compiled in-place form's;
* the weight gradient's accumulation: ``total += left @ right`` against
  ``model.loss.add_product`` (the GEMM adds in its epilogue), with each one's largest error
  against a float64 sum.

    python benchmarks/cross_entropy_probe.py [--out cross_entropy_probe.json]
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402

_bench.setup_paths()

from tango_fairscale.model.cross_entropy import chunk_cross_entropy, rows_dynamic  # noqa: E402
from tango_fairscale.model.loss import add_product  # noqa: E402

VOCAB, WIDTH = 50304, 768
ROWS = (4096, 256)
REPEATS = 20


def gpu_ms(run: Callable[[], Any], repeats: int = REPEATS) -> float:
    """Median GPU milliseconds of ``run()`` over ``repeats`` calls after three warm-up calls."""
    for _ in range(3):
        run()
    times = []
    for _ in range(repeats):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        run()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end))
    return round(_bench.median(times), 4)


def cross_entropy_rows(rows: int, generator: torch.Generator) -> list[dict[str, Any]]:
    logits = torch.randn(rows, VOCAB, generator=generator).mul_(3).to("cuda", torch.bfloat16)
    targets = torch.randint(0, VOCAB, (rows,), generator=generator).cuda()
    weights = torch.rand(rows, generator=generator).cuda()
    arguments = (targets, weights, torch.bfloat16, False)
    out_of_place = functools.partial(chunk_cross_entropy, out_of_place=True)
    tuned: dict[str, Any] = {"coordinate_descent_tuning": True}
    forms: dict[str, Callable[..., Any]] = {
        "eager in place": chunk_cross_entropy,
        "compiled in place": torch.compile(chunk_cross_entropy, dynamic=True),
        "compiled out of place": torch.compile(out_of_place, dynamic=True),
        # Every size symbolic (above, the package's form) against the vocabulary's fixed, and
        # Inductor's search over a reduction's block sizes and warps on top.
        "compiled out of place, static": torch.compile(out_of_place, dynamic=False),
        "compiled out of place, rows dynamic": rows_dynamic(torch.compile(out_of_place)),
        "compiled out of place, static, tuned": torch.compile(
            out_of_place, dynamic=False, options=tuned
        ),
        "compiled out of place, rows dynamic, tuned": rows_dynamic(
            torch.compile(out_of_place, options=tuned)
        ),
    }

    def call(form: Callable[..., Any]) -> Any:
        return form(logits.clone(), *arguments)

    outputs = {name: call(form) for name, form in forms.items()}
    clone_ms = gpu_ms(logits.clone)  # inside each form's time: every call takes fresh logits
    results = []
    for name, form in forms.items():
        difference = [
            float((ours.float() - theirs.float()).abs().max())
            for ours, theirs in zip(outputs[name][:2], outputs["compiled in place"][:2])
        ]
        results.append(
            {
                "rows": rows,
                "form": name,
                "ms": gpu_ms(functools.partial(call, form)),
                "clone_ms": clone_ms,
                "max_difference_nll_grad_vs_compiled_in_place": difference,
            }
        )
    return results


def accumulation_rows(rows: int, generator: torch.Generator) -> list[dict[str, Any]]:
    left = torch.randn(VOCAB, rows, generator=generator).div_(rows).to("cuda", torch.bfloat16)
    right = torch.randn(rows, WIDTH, generator=generator).to("cuda", torch.bfloat16)
    start = torch.randn(VOCAB, WIDTH, generator=generator).cuda()
    exact = start.double() + left.double() @ right.double()
    forms: dict[str, Callable[[torch.Tensor], Any]] = {
        "+= product": lambda total: total.add_(left @ right),
        "add_product": lambda total: add_product(total, left, right),
    }
    results = []
    for name, form in forms.items():
        total = start.clone()
        form(total)
        error = float((total.double() - exact).abs().max())
        results.append(
            {
                "rows": rows,
                "form": name,
                "ms": gpu_ms(functools.partial(form, total)),
                "max_error": error,
            }
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("cross_entropy_probe.json"))
    parser.add_argument("--commit", default=None)
    args = parser.parse_args()
    generator = torch.Generator().manual_seed(0)
    # Every compiled form compiles the same function, whose code object holds one cache entry
    # per form and row count: more than Dynamo's default limit (8), past which it runs eagerly.
    torch._dynamo.config.recompile_limit = 64
    report: dict[str, Any] = {
        "benchmark": "cross_entropy_probe",
        "environment": _bench.environment(args.commit),
    }
    report["cross_entropy"] = [r for rows in ROWS for r in cross_entropy_rows(rows, generator)]
    report["accumulation"] = [r for rows in ROWS for r in accumulation_rows(rows, generator)]
    for row in report["cross_entropy"] + report["accumulation"]:
        print(row, flush=True)
    _bench.write_json(args.out, report)


if __name__ == "__main__":
    main()
