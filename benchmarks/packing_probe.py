"""Why packed batches are slower than padded ones on a GPU: time and profile both layouts.

GPT-2 124M shape (random init). Training: 30 PIQA micro-batches of 16 (fwd + bwd + AdamW step),
fp32 and bf16 autocast; scoring: the PIQA validation forwards at a 16,384-token budget, bf16.
Each under SDPA's default backend choice and with the memory-efficient kernel forced; then the
top CUDA kernels of a few packed bf16 training steps.

    python benchmarks/packing_probe.py --piqa .gpudata/piqa --tokenizer .gpudata/gpt2-tokenizer
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402

_bench.setup_paths()


def main() -> None:
    parser = argparse.ArgumentParser()
    _bench.add_data_arguments(parser)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--sections", default="train,score,profile")
    parser.add_argument("--profile-precision", default="bf16", choices=("fp32", "bf16"))
    parser.add_argument("--pack-sequences", default="both", choices=("both", "packed", "padded"))
    args = parser.parse_args()
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from tango_fairscale.batching import (
        BatchSchedule,
        choice_queries,
        collate,
        packed_batch,
        scoring_batches,
        training_batch,
        training_queries,
    )
    from tango_fairscale.data import read_piqa
    from tango_fairscale.model import ModelWrapper, move_batch

    device = torch.device("cuda")
    splits = read_piqa(args.piqa)
    with torch.device(device):
        model = ModelWrapper(
            config=_bench.gpt2_config("124m"), tokenizer=str(args.tokenizer), seed=0
        )
    tokenizer = model.tokenizer
    train = training_queries(list(splits["train"]), tokenizer, model.max_length)
    schedule = BatchSchedule(len(train), 16, 42)
    steps = [[train[i] for i in schedule.global_batch(s)] for s in range(args.steps)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def sync() -> None:
        torch.cuda.synchronize()

    backends: dict[str, Callable[[], contextlib.AbstractContextManager]] = {
        "default": contextlib.nullcontext,
        "efficient": lambda: sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]),
    }
    sections = args.sections.split(",")
    layouts = {"both": (False, True), "packed": (True,), "padded": (False,)}[args.pack_sequences]
    for precision in ("fp32", "bf16") if "train" in sections else ():
        for packed in layouts:
            for backend, context in backends.items():
                autocast = torch.autocast("cuda", torch.bfloat16, enabled=precision == "bf16")
                times = []
                try:
                    for index, queries in enumerate(steps):
                        sync()
                        begin = time.perf_counter()
                        batch = move_batch(training_batch(queries, 50256, 1024, packed), device)
                        with context(), autocast:
                            loss = model(**batch)["loss"]
                        loss.backward()
                        optimizer.step()
                        optimizer.zero_grad(set_to_none=True)
                        sync()
                        if index >= 5:
                            times.append(time.perf_counter() - begin)
                    result = f"{1000 * sum(times) / len(times):.1f} ms/step"
                except RuntimeError as error:
                    result = f"error {str(error)[:120]}"
                layout = "packed" if packed else "padded"
                print(f"train {precision} {layout} {backend}: {result}", flush=True)

    examples = list(splits["validation"])
    queries = choice_queries(examples, tokenizer, model.max_length)
    model.eval()
    for packed in layouts if "score" in sections else ():
        make = packed_batch if packed else collate
        batches = [
            move_batch(make([queries[i] for i in b], 50256), device)
            for b in scoring_batches(queries, 4096, 16384, packed)
        ]
        for backend, context in backends.items():
            with torch.no_grad(), context(), torch.autocast("cuda", torch.bfloat16):
                for batch in batches:
                    model(**batch)
                sync()
                begin = time.perf_counter()
                for _ in range(3):
                    for batch in batches:
                        model(**batch)
                sync()
            seconds = (time.perf_counter() - begin) / 3
            layout = "packed" if packed else "padded"
            print(f"score bf16 {layout} {backend}: {seconds * 1000:.1f} ms", flush=True)

    model.train()
    from torch.profiler import ProfilerActivity, profile

    bf16 = args.profile_precision == "bf16"
    for packed in layouts if "profile" in sections else ():
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for queries in steps[:5]:
                batch = move_batch(training_batch(queries, 50256, 1024, packed), device)
                with torch.autocast("cuda", torch.bfloat16, enabled=bf16):
                    loss = model(**batch)["loss"]
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            sync()
        layout = "packed" if packed else "padded"
        print(f"=== profile, {args.profile_precision} training, {layout}")
        table = prof.key_averages().table
        print(table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=70))
        print(table(sort_by="cpu_time_total", row_limit=10, max_name_column_width=70))


if __name__ == "__main__":
    main()
