"""What the first call of ``scaled_dot_product_attention`` costs for each new shape, per kernel.

Packed batches (training rows, scoring batches) change length from batch to batch, and each new
length meets every attention kernel for the first time. For eight lengths (200-1,000 tokens; 4
rows, 12 heads of 64, bf16, a boolean block-diagonal causal mask as packing makes), the summed
time of the first call at each length, then of a second call, forward only and forward plus
backward, with torch's default choice and with each kernel alone:

    python benchmarks/attention_probe.py [--out attention_probe.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402

LENGTHS = (200, 264, 333, 411, 512, 640, 768, 1000)
KERNELS = {
    "default": None,
    "efficient": [SDPBackend.EFFICIENT_ATTENTION],
    "cudnn": [SDPBackend.CUDNN_ATTENTION],
    "math": [SDPBackend.MATH],
}


def packed_mask(length: int) -> torch.Tensor:
    """Causal attention within segments of 97 tokens, as packed queries attend."""
    segment = torch.arange(length, device="cuda") // 97
    causal = torch.ones(length, length, dtype=torch.bool, device="cuda").tril()
    return (causal & (segment[:, None] == segment[None, :]))[None, None]


def call_seconds(length: int, kernels: list | None, backward: bool) -> float:
    q = torch.randn(4, 12, length, 64, device="cuda", dtype=torch.bfloat16, requires_grad=backward)
    k, v, mask = torch.randn_like(q), torch.randn_like(q), packed_mask(length)
    torch.cuda.synchronize()
    started = time.perf_counter()
    with sdpa_kernel(kernels) if kernels else contextlib.nullcontext():
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        if backward:
            out.sum().backward()
    torch.cuda.synchronize()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="attention_probe.json")
    args = parser.parse_args()
    call_seconds(128, None, False)  # the CUDA context and the first kernels, apart
    rows = []
    # The default runs first: a kernel measured after it finds the plans it built.
    for name, kernels in KERNELS.items():
        for backward in (False, True):
            first = [call_seconds(n, kernels, backward) for n in LENGTHS]
            again = [call_seconds(n, kernels, backward) for n in LENGTHS]
            rows.append(
                {
                    "kernels": name,
                    "backward": backward,
                    "first_calls_ms": round(sum(first) * 1e3, 1),
                    "slowest_first_call_ms": round(max(first) * 1e3, 1),
                    "second_calls_ms": round(sum(again) * 1e3, 1),
                }
            )
            print(json.dumps(rows[-1]))
    _bench.write_json(
        Path(args.out),
        {"environment": _bench.environment(None), "lengths": LENGTHS, "rows": rows},
    )


if __name__ == "__main__":
    main()
