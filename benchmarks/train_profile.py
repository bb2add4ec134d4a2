"""Where one engine's PIQA training step spends its time: ``torch.profiler`` over a few steps.

One process (world size 1), a GPT-2-shaped model (random init), PIQA training batches built as the
training step builds them; ``--warmup`` untimed steps, then ``--steps`` under the profiler. Prints
the mean step wall time, the GPU's busy time (summed kernel time) and the top operators by CPU and
by CUDA time: whether a step waits on the GPU or the GPU on Python, and on which calls.
``--cprofile``: Python's ``cProfile`` over the steps instead, the functions by own and by
cumulative time: which Python code (the engine's, FairScale's, torch's hooks) takes a host-bound
step's time.

    python benchmarks/train_profile.py --piqa .gpudata/piqa --tokenizer .gpudata/gpt2-tokenizer \\
        --engine fairscale --precision bf16-mixed --batch-size 16
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _bench.add_data_arguments(parser)
    parser.add_argument("--engine", choices=["ddp", "fairscale", "fsdp2"], default="fairscale")
    parser.add_argument("--precision", default="bf16-mixed")
    parser.add_argument("--checkpointing", action="store_true")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rows", type=int, default=30, help="operators listed per table")
    parser.add_argument("--cprofile", action="store_true", help="cProfile instead of torch's")
    parser.add_argument("--packed", action="store_true", help="packed batches (pack_sequences)")
    parser.add_argument("--fused", action="store_true", help="fused AdamW")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/train_profile"))
    args = parser.parse_args()

    import torch
    from tango.common import Lazy, Params
    from tango.integrations.torch import Optimizer, TrainConfig
    from torch.profiler import ProfilerActivity, profile

    from tango_fairscale.batching import training_batch, training_queries
    from tango_fairscale.data import read_piqa
    from tango_fairscale.engines import DDPEngine, FairScaleEngine, FSDP2Engine
    from tango_fairscale.model import ModelWrapper
    from tango_fairscale.wrapping import ShardingConfig

    cuda = torch.cuda.is_available()
    config = TrainConfig(
        "train-profile",
        args.work_dir,
        step_name="train_profile",
        train_steps=args.warmup + args.steps,
        devices=[0] if cuda else [-1],
    )
    with torch.device("cuda" if cuda else "cpu"):
        model = ModelWrapper(config=_bench.gpt2_config(args.shape), tokenizer=str(args.tokenizer))
    fused = {"fused": True} if args.fused else {}
    kwargs: dict = {
        "train_config": config,
        "model": model,
        # Without --fused, torch's default (foreach on GPUs); an explicit fused=False would make
        # AdamW fall back to one parameter at a time.
        "optimizer": Lazy(Optimizer, Params({"type": "torch::AdamW", "lr": 1e-5} | fused)),
        "precision": args.precision,
        "max_grad_norm": 1.0,
    }
    if args.engine != "ddp":
        kwargs["sharding"] = ShardingConfig(activation_checkpointing=args.checkpointing)
    engine = {"ddp": DDPEngine, "fairscale": FairScaleEngine, "fsdp2": FSDP2Engine}[args.engine](
        **kwargs
    )
    examples = list(read_piqa(args.piqa)["train"])
    n = args.batch_size
    queries = training_queries(examples[: n * (args.warmup + args.steps)], model.tokenizer, 1024)
    batches = [
        training_batch(
            queries[i * n : (i + 1) * n], model.pad_token_id, model.max_length, args.packed
        )
        for i in range(args.warmup + args.steps)
    ]

    def step(batch: dict) -> None:
        loss, _ = engine.forward_train(batch, 0, 1)
        engine.backward(loss)
        engine.step()

    def sync() -> None:
        torch.cuda.synchronize()

    engine.model.train()
    for batch in batches[: args.warmup]:
        step(batch)
    if cuda:
        torch.cuda.synchronize()
    if args.cprofile:
        profile_python(step, batches[args.warmup :], args.rows, sync if cuda else None)
        return 0
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        begin = time.perf_counter()
        for batch in batches[args.warmup :]:
            step(batch)
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - begin
    events = prof.key_averages()
    busy = sum(e.self_device_time_total for e in events) / 1e6
    print(
        f"{args.engine} {args.precision} checkpointing={args.checkpointing} batch {n} "
        f"packed={args.packed} fused={args.fused}: "
        f"step wall {1000 * wall / args.steps:.1f} ms (profiled); "
        f"GPU kernel time {1000 * busy / args.steps:.1f} ms per step"
    )
    for key in ["self_cpu_time_total"] + (["self_cuda_time_total"] if cuda else []):
        print(events.table(sort_by=key, row_limit=args.rows, max_name_column_width=60))
    return 0


def profile_python(step: Any, batches: list, rows: int, sync: Any) -> None:
    """``cProfile`` over ``step`` on each batch: mean wall ms per step, then the top ``rows``
    functions by own time and by cumulative time."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    begin = time.perf_counter()
    profiler.enable()
    for batch in batches:
        step(batch)
    if sync is not None:
        sync()
    profiler.disable()
    wall = time.perf_counter() - begin
    print(f"cProfile: step wall {1000 * wall / len(batches):.1f} ms (profiled)")
    for key in ("tottime", "cumulative"):
        pstats.Stats(profiler).sort_stats(key).print_stats(rows)


if __name__ == "__main__":
    raise SystemExit(main())
