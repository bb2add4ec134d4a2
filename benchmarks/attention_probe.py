"""What the first call of ``scaled_dot_product_attention`` costs for each new shape, per kernel.

Packed batches (training rows, scoring batches) change length from batch to batch, and each new
length meets every attention kernel for the first time. For eight lengths (200-1,000 tokens; 4
rows, 12 heads of 64, bf16, a boolean block-diagonal causal mask as packing makes), the summed
time of the first call at each length, then of a second call, forward only and forward plus
backward, with torch's default choice and with each kernel alone. Then the fixed-length causal
attention of the synthetic training benchmark (no mask, GPT-2's attention dropout of 0.1; the
124M model's batch of 64 and the 1.5B model's of 16, 1,024 tokens): forward plus backward per
kernel, the first call and the median of ten after it, to see whether a kernel beyond the ones
forwards take today would lift the large-batch MFU:

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


#: (name, rows, heads) of the synthetic training benchmark's attention (heads of 64, 1,024 tokens).
TRAINING_SHAPES = (("124m-b64", 64, 12), ("1.5b-b16", 16, 25))
TRAINING_KERNELS = {
    "flash": [SDPBackend.FLASH_ATTENTION],
    "efficient": [SDPBackend.EFFICIENT_ATTENTION],
    "cudnn": [SDPBackend.CUDNN_ATTENTION],
}


def training_call_ms(rows: int, heads: int, kernels: list) -> list[float]:
    """Milliseconds of eleven causal forward-plus-backward calls at a fixed shape (dropout 0.1)."""
    q = torch.randn(rows, heads, 1024, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn_like(q, requires_grad=True)
    v = torch.randn_like(q, requires_grad=True)
    grad = torch.randn_like(q)
    times = []
    with sdpa_kernel(kernels):
        for _ in range(11):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=True)
            out.backward(grad)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    return times


def training_rows() -> list[dict]:
    """Each kernel at each training shape: first call and median steady call, or why it can't."""
    rows = []
    for shape, batch, heads in TRAINING_SHAPES:
        for name, kernels in TRAINING_KERNELS.items():
            row: dict = {"shape": shape, "kernels": name}
            try:
                times = training_call_ms(batch, heads, kernels)
                row["first_call_ms"] = round(times[0], 2)
                row["median_call_ms"] = round(sorted(times[1:])[5], 3)
            except RuntimeError as error:  # a kernel that does not take this call
                row["error"] = str(error).splitlines()[0][:200]
            rows.append(row)
            print(json.dumps(row))
    return rows


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
    result = {"environment": _bench.environment(None), "lengths": LENGTHS, "rows": rows}
    result["training_rows"] = training_rows()
    _bench.write_json(Path(args.out), result)


if __name__ == "__main__":
    main()
