"""SDPA's attention backends on the GPT-2 training shapes: forward + backward time and TFLOP/s.

Causal self-attention in bf16 at the shapes a training step runs (batch x heads x 1024 x 64 for
GPT-2 124M and 1.5B), with GPT-2's attention dropout (0.1) and without, under each backend
SDPA offers (``flash``, ``efficient``, ``cudnn``) and under its default choice: which kernel the
default picks and what the others would give. FLOPs of causal attention: forward
4·B·H·T²·D / 2, backward 2.5 x forward.

    python benchmarks/attention_probe.py --out /tmp/attention_probe.json
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402

#: (shape, rows per step) as the training benchmarks run them.
DEFAULT_CASES = "124m=32,1.5b=16"
BACKENDS = ("default", "flash", "efficient", "cudnn")


def time_attention(
    rows: int, heads: int, width: int, dropout: float, backend: str, repeats: int
) -> dict[str, Any]:
    """Median forward + backward ms of one causal SDPA call, or the error that refused it."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    seq, head_dim = 1024, width // heads
    q, k, v = (
        torch.randn(
            rows, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16
        ).requires_grad_()
        for _ in range(3)
    )
    grad = torch.randn_like(q)
    contexts: dict[str, contextlib.AbstractContextManager] = {
        "default": contextlib.nullcontext(),
        "flash": sdpa_kernel(SDPBackend.FLASH_ATTENTION),
        "efficient": sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION),
        "cudnn": sdpa_kernel(SDPBackend.CUDNN_ATTENTION),
    }
    chosen = contexts[backend]
    times = []
    try:
        with chosen:
            for _ in range(repeats + 3):
                torch.cuda.synchronize()
                begin = time.perf_counter()
                out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
                out.backward(grad)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - begin)
    except RuntimeError as error:
        return {"error": _bench.short_error(error, 200)}
    ms = 1000 * _bench.median(times[3:])
    forward_flops = 4 * rows * heads * seq * seq * head_dim / 2
    return {"ms": round(ms, 3), "tflops": round(3.5 * forward_flops / (ms / 1000) / 1e12, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=DEFAULT_CASES, help="SHAPE=ROWS,...")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--commit", default=None)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("attention_probe.py needs a GPU (SDPA's fused backends are CUDA-only)")
    results: list[dict[str, Any]] = []
    for case in args.cases.split(","):
        shape, _, rows = case.partition("=")
        dims = _bench.SHAPES[shape]
        for dropout in (0.0, 0.1):
            for backend in BACKENDS:
                timing = time_attention(
                    int(rows), dims["n_head"], dims["n_embd"], dropout, backend, args.repeats
                )
                results.append(
                    {"shape": shape, "rows": int(rows), "dropout": dropout, "backend": backend}
                    | timing
                )
                print(results[-1], flush=True)
    report: dict[str, Any] = {
        "benchmark": "attention_probe",
        "environment": _bench.environment(args.commit),
        "settings": vars(args) | {"out": str(args.out), "seq_len": 1024, "dtype": "bfloat16"},
        "results": results,
    }
    _bench.write_json(args.out, report)
    env = report["environment"]
    lines = [
        f"# SDPA backends, causal bf16 forward + backward: {env.get('gpu_name')}, "
        f"commit {str(env['commit'])[:12]}, torch {env['torch']}",
        "",
        "Median of the repeats after 3 warm-up calls; TFLOP/s = 3.5 x 4·B·H·T²·D / 2 / time.",
        "",
        "| shape | rows | dropout | backend | ms | TFLOP/s | note |",
        "|---|---:|---:|---|---:|---:|---|",
    ]
    for r in results:
        ms, tflops = r.get("ms"), r.get("tflops")
        lines.append(
            f"| {r['shape']} | {r['rows']} | {r['dropout']} | {r['backend']} "
            f"| {'–' if ms is None else ms} | {'–' if tflops is None else tflops} "
            f"| {r.get('error', '')} |"
        )
    _bench.write_text(args.out.with_suffix(".md"), "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
