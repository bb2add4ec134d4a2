"""Whether float8 matrix multiplications (torchao's dynamic scaling) would lift the large-batch
MFU of GPT-2 training: the synthetic benchmark's step (random tokens, every one scored through
the package's chunked loss, bf16 autocast over fp32 weights, each block compiled, fused AdamW),
with the blocks' projections in bf16 and with them in float8 (``tensorwise``: one scale per
tensor, cuBLAS; ``rowwise``: a scale per row, CUTLASS). The vocabulary projection stays bf16.

Per shape and recipe: the median step after warm-up, the MFU by the synthetic benchmark's
formula (against the bf16 peak, whatever the recipe: the same model flops in less time), peak
memory, and the losses of the same seeded steps, so that a recipe's numerics are visible next to
its speed::

    python benchmarks/float8_probe.py --shapes 124m,1.5b --out float8_probe.json
    python benchmarks/float8_probe.py --shapes tiny --batch tiny=2 --seq 64 --emulate  # CPU
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402

_bench.setup_paths()

from tango_fairscale.model.loss import scored_row_nll  # noqa: E402


class Float8Conv1D(torch.nn.Module):
    """GPT-2's ``Conv1D`` (``x @ weight + bias``, weight ``(in, out)``) with torchao's float8
    matmul; the weight is the linear layer's transposed one that the matmul takes as is."""

    def __init__(self, conv: torch.nn.Module, config: Any) -> None:
        super().__init__()
        from torchao.float8.float8_linear import Float8Linear

        self.weight, self.bias = conv.weight, conv.bias
        template = Float8Linear(1, 1, bias=False, config=config, device="meta")
        self.mm_config, self.config = template.linear_mm_config, config

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torchao.float8.float8_linear import matmul_with_hp_or_float8_args

        if torch.is_autocast_enabled(x.device.type):
            x = x.to(torch.get_autocast_dtype(x.device.type))
        out = matmul_with_hp_or_float8_args.apply(x, self.weight, self.mm_config, self.config)
        return out + self.bias.to(out.dtype)


def to_float8(model: torch.nn.Module, recipe: str, emulate: bool) -> None:
    """``recipe``: torchao's recipe name; with ``-auto``, only the projections whose shapes its
    own filter for that recipe converts (measured on H100s, each layer alone)."""
    from torchao.float8 import Float8LinearConfig
    from torchao.float8._inductor_patch import _patch_inductor_min_max_codegen
    from torchao.float8.float8_linear_utils import _auto_filter_for_recipe
    from transformers.pytorch_utils import Conv1D

    _patch_inductor_min_max_codegen()
    recipe, _, auto = recipe.partition("-")
    config = Float8LinearConfig.from_recipe_name(recipe)
    if emulate:
        config = Float8LinearConfig(**{**config.__dict__, "emulate": True})
    keep = _auto_filter_for_recipe(recipe, filter_fqns=[]) if auto else None
    blocks: Any = model.transformer.h  # type: ignore[union-attr]
    for block in blocks:
        for name, module in list(block.named_modules()):
            if not isinstance(module, Conv1D):
                continue
            # Conv1D's weight is (in, out): the linear layer it equals.
            fan_in, fan_out = module.weight.shape
            if keep is None or keep(torch.nn.Linear(fan_in, fan_out, device="meta"), name):
                parent, _, child = name.rpartition(".")
                setattr(block.get_submodule(parent), child, Float8Conv1D(module, config))


def run(shape: str, batch: int, seq: int, recipe: str, args: argparse.Namespace) -> dict:
    from transformers import AutoConfig, AutoModelForCausalLM

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    hf_config = AutoConfig.for_model(**_bench.gpt2_config(shape, n_positions=seq))
    model = AutoModelForCausalLM.from_config(hf_config).to(device)
    params = sum(p.numel() for p in model.parameters())
    if recipe != "bf16":
        to_float8(model, recipe, args.emulate)
    for block in model.transformer.h:  # type: ignore[union-attr]
        block.compile()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, hf_config.vocab_size, (batch, seq), generator=generator).to(device)
    targets = torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], -100)], dim=1)
    losses, seconds = [], []
    for step in range(args.warmup + args.steps):
        started = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            hidden = model.transformer(input_ids=ids).last_hidden_state
            row_mean = scored_row_nll(model.lm_head, hidden, targets)[0]
        loss = row_mean.mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())  # a synchronisation: the step's whole time
        if step >= args.warmup:
            seconds.append(time.perf_counter() - started)
    step_s, on_gpu = _bench.median(seconds), device.type == "cuda"
    flops = 6 * params + 12 * hf_config.n_layer * hf_config.n_embd * seq
    row = {
        "shape": shape,
        "recipe": recipe,
        "batch": batch,
        "seq": seq,
        "step_ms": round(step_s * 1e3, 2),
        "mfu": round(flops * batch * seq / step_s / _bench.PEAK_FLOPS, 4),
        "peak_gib": _bench.gib(torch.cuda.max_memory_allocated() if on_gpu else None),
        "losses": [round(v, 4) for v in losses],
    }
    del model, optimizer
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="124m,1.5b")
    parser.add_argument("--batch", default="124m=64,1.5b=16,tiny=2")
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--recipes", default="bf16,tensorwise,tensorwise-auto,rowwise")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--emulate", action="store_true", help="float8 emulated (CPU smoke)")
    parser.add_argument("--commit")
    parser.add_argument("--out", type=Path, default=Path("float8_probe.json"))
    args = parser.parse_args()
    result: dict[str, Any] = {
        "benchmark": "float8_probe",
        "environment": _bench.environment(args.commit),
        "mfu_formula": _bench.MFU_FORMULA,
        "rows": [],
    }
    for shape in args.shapes.split(","):
        batch = _bench.per_shape(args.batch, shape)
        for recipe in args.recipes.split(","):
            try:
                row = run(shape, batch, args.seq, recipe, args)
            except Exception as error:  # one recipe failing must not lose the others
                row = {"shape": shape, "recipe": recipe, "error": _bench.short_error(error)}
            print({k: v for k, v in row.items() if k != "losses"}, flush=True)
            result["rows"].append(row)
            _bench.write_json(args.out, result)


if __name__ == "__main__":
    main()
