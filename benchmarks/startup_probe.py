"""Where a training process's start-up goes, piece by piece, in one fresh process: imports, CUDA
and process-group initialisation, the first collective, the model's load and wrapping, the first
three training steps (forward, backward, optimizer step timed apart) and the compiled loss.

    python benchmarks/startup_probe.py --tokenizer TOK --piqa PIQA --out probe.json

Each piece is timed with the device synchronised before and after (``time.perf_counter``), so
the pieces add up to the whole. Run one engine per process (``--engine``): a second engine in the
same process would find the first one's initialisation done.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path
from typing import Any

started = time.perf_counter()
import _bench  # noqa: E402
import torch  # noqa: E402

_bench.setup_paths()
TORCH_IMPORT_S = time.perf_counter() - started


class Clock:
    """Seconds per named piece, the device synchronised at each boundary."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {"import torch": round(TORCH_IMPORT_S, 3)}
        self.last = time.perf_counter()

    def lap(self, name: str) -> None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        now = time.perf_counter()
        self.seconds[name] = round(now - self.last, 3)
        self.last = now


def probe(args: argparse.Namespace) -> dict[str, Any]:
    clock = Clock()
    import torch.distributed as dist
    from tango.common import Lazy, Params
    from tango.integrations.torch import Model, TrainConfig, TrainingEngine

    import tango_fairscale  # noqa: F401  (registers the components)
    from tango_fairscale.data.batches import training_batch
    from tango_fairscale.data.queries import encode_pairs
    from tango_fairscale.model.causal_lm import ModelWrapper

    clock.lap("import tango, transformers, tango_fairscale")
    import _piqa

    pairs = _piqa.training_pairs(_piqa.examples(Path(args.piqa), "train", limit=400))
    model_dir = Path(args.work_dir) / "model"
    config = {"model_type": "gpt2", **_bench.SHAPES[args.shape]}
    ModelWrapper(config=config, tokenizer=args.tokenizer, seed=1).save(model_dir)
    clock.lap("(probe: write a random model)")
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.init()
        torch.cuda.set_device(0)
        torch.empty(1, device="cuda")
    clock.lap("CUDA context")
    backend = "nccl" if cuda else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), world_size=1, rank=0)
    clock.lap("init_process_group (world size 1)")
    train_config = TrainConfig(
        "probe", Path(args.work_dir), devices=[0] if cuda else None, world_size=1
    )
    model = Lazy(Model, Params({"type": "tango_fairscale::causal_lm", "model": str(model_dir)}))
    engine_params = {
        "type": f"tango_fairscale::{args.engine}",
        "precision": args.precision,
        "optimizer": {"type": "torch::AdamW", "lr": 1e-5, "weight_decay": 0.0},
    }
    if args.engine in ("fairscale", "fsdp2"):
        engine_params["sharding"] = {}
    engine: Any = Lazy(TrainingEngine, Params(engine_params)).construct(
        train_config=train_config, model=model
    )
    clock.lap(f"load and wrap the model ({args.engine}, {args.precision})")
    wrapped = engine.wrapped_model
    queries = encode_pairs(wrapped.tokenizer, pairs, wrapped.max_length)
    pad, width = wrapped.pad_token_id, wrapped.max_length
    batches = [training_batch(queries[i * 16 : (i + 1) * 16], pad, width, True) for i in range(4)]
    clock.lap("tokenize 400 training pairs")
    first_forward = cProfile.Profile()
    for step, batch in enumerate(batches[:3]):
        with first_forward if step == 0 else contextlib.nullcontext():
            loss, _ = engine.forward_train(batch, 0, 1)
            clock.lap(f"step {step + 1}: forward")
        engine.backward(loss)
        clock.lap(f"step {step + 1}: backward")
        engine.step()
        clock.lap(f"step {step + 1}: optimizer step")
    flag = torch.ones(1, device=engine.device)
    dist.all_reduce(flag)
    clock.lap("first all_reduce")
    dist.all_reduce(flag)
    clock.lap("second all_reduce")
    dist.destroy_process_group()
    return {
        "engine": args.engine,
        "precision": args.precision,
        "seconds": clock.seconds,
        "compiler_imported": "torch._dynamo" in sys.modules,
        "first_forward_profile": top_functions(first_forward),
    }


def top_functions(profile: cProfile.Profile, rows: int = 25) -> list[str]:
    """The ``rows`` functions of most own time in ``profile``, then of most cumulative time."""
    lines = []
    for order in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats(order).print_stats(rows)
        lines += [line for line in out.getvalue().splitlines() if line.strip()]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--piqa", required=True)
    parser.add_argument("--shape", default="124m")
    parser.add_argument("--engine", default="fairscale")
    parser.add_argument("--precision", default="bf16-mixed")
    parser.add_argument("--work-dir", default="/tmp/startup-probe")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    result = probe(args)
    result["environment"] = _bench.environment(None)
    _bench.write_json(Path(args.out), result)
    print(result["seconds"])


if __name__ == "__main__":
    main()
