"""Training throughput and memory of the package's engines on GPT-2-shaped models.

Every configuration runs in its own freshly spawned process group (one process per GPU, NCCL; gloo
on CPU), so an out-of-memory error or a hang in one is recorded and the rest still run. Engines are
built the way the training step builds them: a Tango ``TrainConfig``, a ``Lazy`` ``ModelWrapper``
(random init from a GPT-2 config, dropout as in GPT-2), a ``Lazy`` ``torch::AdamW``, and the engine
class constructed directly; each step is ``forward_train`` -> ``backward`` -> ``step``.

Data (``--data``):

* ``synthetic`` (default): a fixed random batch of ``batch_size x seq_len`` tokens per GPU, every
  token scored.
* ``piqa``: real PIQA training examples, built as the training step builds them: the
  ``BatchSchedule`` of ``tango_fairscale.train`` (global batch ``batch_size x world_size``, rank
  ``r`` takes the ``r``-th slice), ``training_queries`` (correct answer only) tokenized before the
  timed loop and ``training_batch`` inside it: right-padded rows, or packed ones for
  ``packed`` configs (``pack_sequences``). Every configuration of one world size sees the
  same examples. Reported: real (non-pad) tokens/s, tokens/s of all positions fed to the model
  (``rows x positions``), padding fraction, and peak memory per GPU.

Configurations are ``ENGINE-PRECISION[-MODIFIER...]``:

* ENGINE: ``ddp`` (``DDPEngine``; a bare model at world size 1), ``fairscale``
  (``FairScaleEngine``), ``fsdp2`` (``FSDP2Engine``) or ``pipe`` (``PipeEngine``: ONE process,
  world size 1 only, its stages on ``--pipe-devices``, default every visible GPU / ``cpu,cpu``).
* PRECISION: ``fp32`` (``32-true``), ``bf16`` (``bf16-mixed``: autocast for ddp, FSDP mixed
  precision for fairscale), ``fp16`` / ``16-mixed`` (``16-mixed`` + grad scaler), ``bf16true``
  (``bf16-true``).
* MODIFIERS (sharded engines): ``root`` (no per-block units), ``ckpt`` (activation
  checkpointing of every unit), ``offload`` (CPU offload), ``noflat``, ``noreshard``; also for
  ddp: ``compile`` (torch.compile per block), ``fused`` (fused AdamW), ``packed`` (PIQA data:
  packed batches, the training step's ``pack_sequences``; not for pipe).
* MODIFIERS (pipe): ``cN`` (N chunks = micro-batches, default 4), ``ckpt-always`` /
  ``ckpt-never`` / ``ckpt-except_last`` (default), ``bA_B`` (A and B blocks per stage; default
  automatic by parameter count). A pipe's batch is the whole pipe's (B rows, cut into N
  micro-batches); its tokens/s per GPU are the pipe's divided by its stages, its peak memory is
  read on every stage's GPU. The Markdown's pipe section puts each pipe run against the DDP run
  at world size 1 with the same batch (the single GPU): efficiency = pipe tokens/s / (S x
  single-GPU tokens/s) next to the GPipe bubble (S - 1) / (M + S - 1) and a prediction from the
  bubble, the stages' FLOP balance and recomputation.

Run by path (``benchmarks/`` is not a package)::

    python benchmarks/train_speed.py --world-size 1,2 --shapes 124m \
        --configs ddp-fp32,ddp-bf16,fairscale-bf16,fairscale-bf16-ckpt \
        --tokenizer .gpudata/gpt2-tokenizer --out /tmp/speed.json
    python benchmarks/train_speed.py --data piqa --piqa .gpudata/piqa --world-size 2,1 \
        --configs ddp-fp32,fairscale-bf16-ckpt --compare-to ddp-fp32 --out /tmp/speed-piqa.json
    python benchmarks/train_speed.py --world-size 1 --batch-size 8 --steps 5 --warmup 2 \
        --plan 1.5b:ddp-bf16,pipe-bf16-c4,pipe-bf16-c8,pipe-bf16-c8-ckpt-always \
        --compare-to '' --target '' --out /tmp/speed-pipe.json  # pipe over every visible GPU
    python benchmarks/train_speed.py --tiny --world-size 1,2 --out /tmp/speed-cpu.json  # CPU smoke

Writes ``--out`` (JSON, rewritten after every configuration) and the same name with ``.md``: a table
with ratios against the DDP baseline of the same shape and world size measured in this run
(``x base``), ratios against ``--compare-to`` (default ``ddp-fp32``), and a check of ``--target``
(default ``fairscale-bf16-ckpt``) against it: peak memory at most 1/3, throughput at least 1x.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402

_bench.setup_paths()

#: ``modules_to_wrap: []``: no inner units, the whole model is one root unit (catwalk's setting).
ROOT_ONLY_PATTERNS: list[str] = []

ENGINES = ("ddp", "fairscale", "fsdp2", "pipe")
MODIFIERS = ("root", "ckpt", "offload", "noflat", "noreshard", "compile", "fused", "packed")
#: Modifiers that are not sharding options (the DDP engine takes them too).
ENGINE_MODIFIERS = ("compile", "fused", "packed")
PIPE_CHECKPOINT_MODES = ("never", "always", "except_last")
PIPE_DEFAULT_CHUNKS = 4
DEFAULT_BATCH = "124m=16,355m=16,774m=8,1.5b=8,tiny=2"
#: Forward share of a training step's compute (forward 1 unit, backward 2): what recomputing a
#: checkpointed micro-batch's forward adds, relative to its forward + backward.
RECOMPUTE_SHARE = 1 / 3

#: Imported once by the forkserver, so that each configuration's workers start with them loaded.
PRELOAD = [
    "torch",
    "torch.distributed",
    "transformers",
    "transformers.models.gpt2.modeling_gpt2",
    "tango",
    "tango.integrations.torch",
    "fairscale",
    "tango_fairscale.batching",
    "tango_fairscale.engines",
    "tango_fairscale.model",
]

#: The issue's must-show: the target config's peak memory at most this fraction of the
#: comparison config's, and its throughput at least this multiple, at the same batch.
TARGET_MEMORY_RATIO = 1 / 3
TARGET_THROUGHPUT_RATIO = 1.0
LIGHTNING_PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true")


# --- configurations ---------------------------------------------------------------------------


def parse_config(name: str) -> dict[str, Any]:
    """``fairscale-bf16-ckpt`` -> engine, precision, sharding (errors say what to change)."""
    engine, _, rest = name.partition("-")
    if engine not in ENGINES:
        raise SystemExit(f"config {name!r}: engine must be one of {', '.join(ENGINES)}")
    precision = next(
        (p for p in LIGHTNING_PRECISIONS if rest == p or rest.startswith(p + "-")), None
    )
    if precision is not None:
        rest = rest[len(precision) :].lstrip("-")
    else:
        token, _, rest = rest.partition("-")
        if token not in _bench.PRECISION_ALIASES:
            raise SystemExit(
                f"config {name!r}: precision {token!r} unknown; use one of "
                f"{', '.join(_bench.PRECISION_ALIASES)} or {', '.join(LIGHTNING_PRECISIONS)}"
            )
        precision = _bench.PRECISION_ALIASES[token]
    modifiers = [m for m in rest.split("-") if m]
    if engine == "pipe":
        return {
            "config": name,
            "engine": engine,
            "precision": precision,
            "sharding": None,
            **parse_pipe_modifiers(name, modifiers),
        }
    unknown = [m for m in modifiers if m not in MODIFIERS]
    if unknown:
        raise SystemExit(f"config {name!r}: unknown modifier(s) {unknown}; use {MODIFIERS}")
    sharding_only = [m for m in modifiers if m not in ENGINE_MODIFIERS]
    if engine == "ddp" and sharding_only:
        raise SystemExit(f"config {name!r}: {sharding_only} apply to sharded engines only")
    if "root" in modifiers and "ckpt" in modifiers:
        raise SystemExit(f"config {name!r}: 'ckpt' checkpoints the units, and 'root' has none")
    sharding: dict[str, Any] = {}
    if "root" in modifiers:
        sharding["modules_to_wrap"] = ROOT_ONLY_PATTERNS
    if "ckpt" in modifiers:
        sharding["activation_checkpointing"] = True
    if "offload" in modifiers:
        sharding["cpu_offload"] = True
    if "noflat" in modifiers:
        sharding["flatten_parameters"] = False
    if "noreshard" in modifiers:
        sharding["reshard_after_forward"] = False
    if "compile" in modifiers and engine in ("fairscale", "fsdp2"):
        sharding["compile"] = True
    return {
        "config": name,
        "engine": engine,
        "precision": precision,
        "modifiers": modifiers,
        "sharding": sharding if engine != "ddp" else None,
    }


def parse_pipe_modifiers(name: str, tokens: list[str]) -> dict[str, Any]:
    """``c8``, ``ckpt-always`` / ``ckpt-never`` / ``ckpt-except_last``, ``b8_4`` (blocks per
    stage; default automatic) -> the pipe's settings."""
    pipe: dict[str, Any] = {
        "chunks": PIPE_DEFAULT_CHUNKS,
        "checkpoint": "except_last",
        "balance": None,
    }
    modifiers: list[str] = []
    seen: set[str] = set()
    tokens = list(tokens)
    while tokens:
        token = tokens.pop(0)
        if re.fullmatch(r"c[1-9][0-9]*", token) and "c" not in seen:
            pipe["chunks"] = int(token[1:])
            modifiers.append(token)
            seen.add("c")
        elif re.fullmatch(r"b[1-9][0-9]*(_[1-9][0-9]*)+", token) and "b" not in seen:
            pipe["balance"] = [int(n) for n in token[1:].split("_")]
            modifiers.append(token)
            seen.add("b")
        elif (
            token == "ckpt" and tokens and tokens[0] in PIPE_CHECKPOINT_MODES and "ckpt" not in seen
        ):
            pipe["checkpoint"] = tokens.pop(0)
            modifiers.append(f"ckpt-{pipe['checkpoint']}")
            seen.add("ckpt")
        else:
            raise SystemExit(
                f"config {name!r}: pipe modifier {token!r} unknown or repeated; use cN "
                f"(chunks, default {PIPE_DEFAULT_CHUNKS}) and ckpt-MODE "
                f"(MODE: {', '.join(PIPE_CHECKPOINT_MODES)}; default except_last), bA_B "
                "(blocks per stage; default automatic), e.g. pipe-bf16-c8-ckpt-always"
            )
    return {"modifiers": modifiers, "pipe": pipe}


def pipe_devices(spec_devices: str, cuda: bool, gpus: int) -> list[str]:
    """``--pipe-devices``: ``all`` = every visible GPU (two CPU stages without GPUs)."""
    if spec_devices != "all":
        return [d.strip() for d in spec_devices.split(",") if d.strip()]
    if cuda:
        return [f"cuda:{i}" for i in range(gpus)]
    return ["cpu", "cpu"]


def count_parameters(model_config: dict[str, Any]) -> int:
    """Unique parameters of the Hugging Face model (meta device: no memory, no init)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = dict(model_config)
    hf_config = AutoConfig.for_model(config.pop("model_type"), **config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    return sum(p.numel() for p in model.parameters())


# --- one configuration, one process per device ------------------------------------------------


def _worker(rank: int, spec: dict[str, Any], result_dir: str) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    result: dict[str, Any] = {"rank": rank}
    path = Path(result_dir) / f"rank{rank}.json"
    try:
        result.update(_measure(rank, spec, Path(result_dir)))
    except Exception as error:  # recorded, then this process exits non-zero
        result["error"] = "OOM" if _bench.is_oom(error) else "error"
        result["message"] = _bench.short_error(error)
        result["traceback"] = traceback.format_exc()[-3000:]
        _bench.write_json(path, result)
        print(f"[rank {rank}] {spec['config']} failed: {result['message']}", flush=True)
        raise SystemExit(1) from None
    _bench.write_json(path, result)


def _measure(rank: int, spec: dict[str, Any], result_dir: Path) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from tango.common import Lazy, Params
    from tango.integrations.torch import Optimizer, TrainConfig

    from tango_fairscale.engines import DDPEngine, FairScaleEngine, FSDP2Engine, PipeEngine
    from tango_fairscale.model import ModelWrapper
    from tango_fairscale.wrapping import ShardingConfig

    started = time.perf_counter()
    world_size = spec["world_size"]
    cuda = spec["cuda"]
    config = TrainConfig(
        "train-speed",
        result_dir / "work",
        step_name="train_speed",
        worker_id=rank,
        seed=spec["seed"],
        train_steps=spec["warmup"] + spec["steps"],
        is_distributed=world_size > 1,
        devices=list(range(world_size)) if cuda else [-1] * world_size,
        distributed_port=spec["port"],
        world_size=world_size,
    )
    device = config.worker_local_default_device
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(spec["seed"])

    model_params = {"config": spec["model_config"], "tokenizer": spec["tokenizer"], "seed": 0}
    lazy_model = Lazy(ModelWrapper, Params(model_params))
    init_on_device = cuda and spec["init_device"] == "cuda" and "offload" not in spec["modifiers"]
    model: Any = lazy_model
    if init_on_device:
        # Same model, built directly on the GPU (CPU init of 1.5B parameters takes ~30 s);
        # the engine accepts a constructed Model as well as a Lazy one.
        with torch.device(device):
            model = lazy_model.construct()
    modifiers = spec.get("modifiers") or []
    adamw = {"type": "torch::AdamW", "lr": spec["lr"], "weight_decay": 0.0}
    if "fused" in modifiers:
        adamw["fused"] = True
    optimizer = Lazy(Optimizer, Params(adamw))
    kwargs: dict[str, Any] = {
        "train_config": config,
        "model": model,
        "optimizer": optimizer,
        "precision": spec["precision"],
        "max_grad_norm": spec["max_grad_norm"],
    }
    engine_class: Any = {
        "ddp": DDPEngine,
        "fairscale": FairScaleEngine,
        "fsdp2": FSDP2Engine,
        "pipe": PipeEngine,
    }[spec["engine"]]
    if spec["engine"] == "pipe":
        # One process drives every stage; balance automatic (parameter count per stage)
        # unless the config names one (bA_B).
        kwargs.update(
            devices=spec["pipe_devices"],
            chunks=spec["pipe"]["chunks"],
            checkpoint=spec["pipe"]["checkpoint"],
            balance=spec["pipe"]["balance"],
        )
    elif spec["engine"] != "ddp":
        kwargs["sharding"] = ShardingConfig(**spec["sharding"])
    elif "compile" in modifiers:
        kwargs["compile"] = True
    engine = engine_class(**kwargs)
    setup_s = time.perf_counter() - started
    # The devices this process computes on: one per pipe stage (two CPU stages count twice),
    # else its own; memory is read once per distinct GPU.
    devices = list(engine.stage_devices) if spec["engine"] == "pipe" else [device]
    cuda_devices = list(dict.fromkeys(d for d in devices if d.type == "cuda"))
    _inject_fault(rank)

    fsdp_units = None
    if spec["engine"] == "fairscale":
        from fairscale.nn.data_parallel import FullyShardedDataParallel

        fsdp_units = sum(isinstance(m, FullyShardedDataParallel) for m in engine.model.modules())

    n_steps = spec["warmup"] + spec["steps"]
    if spec["data"] == "piqa":
        from tango_fairscale.batching import training_batch, training_queries

        wrapped = engine.wrapped_model
        # As the training step: tokenize before the loop, build batches inside it.
        step_queries = [
            training_queries(examples, wrapped.tokenizer, wrapped.max_length)
            for examples in spec["piqa_batches"][rank]
        ]
        pad_token_id, max_length = wrapped.pad_token_id, wrapped.max_length
        packed = "packed" in modifiers

        def batch_for(step: int) -> dict[str, Any]:
            return training_batch(step_queries[step], pad_token_id, max_length, packed)

    else:
        generator = torch.Generator().manual_seed(spec["seed"] * 1000 + rank)
        vocab = spec["model_config"]["vocab_size"]
        input_ids = torch.randint(
            0, vocab, (spec["batch_size"], spec["seq_len"] + 1), generator=generator
        )
        # Every position is scored: ModelWrapper projects all of them through the LM head.
        fixed = {
            "input_ids": input_ids,
            "attention_mask": torch.ones_like(input_ids),
            "labels": input_ids.clone(),
        }

        def batch_for(step: int) -> dict[str, Any]:
            return fixed

    def sync() -> None:
        for d in cuda_devices:
            torch.cuda.synchronize(d)

    memory_after_setup = None
    if cuda_devices:
        gc.collect()
        sync()
        torch.cuda.empty_cache()
        memory_after_setup = [torch.cuda.memory_allocated(d) for d in cuda_devices]
        for d in cuda_devices:
            torch.cuda.reset_peak_memory_stats(d)
    if dist.is_initialized():
        dist.barrier()

    engine.model.train()
    times: list[float] = []
    losses = []
    tokens: dict[str, list[int]] = {"real": [], "padded": [], "scored": [], "width": []}
    for step in range(n_steps):
        sync()
        begin = time.perf_counter()
        batch = batch_for(step)
        loss, _outputs = engine.forward_train(batch, 0, 1)
        engine.backward(loss)
        engine.step()
        sync()
        times.append(time.perf_counter() - begin)
        losses.append(loss.detach())
        # Positions the model reads (a padded row's last token is only a target; packed rows
        # are shifted already); real = not padding.
        shifted = "position_ids" in batch
        fed = {k: batch[k] if shifted else batch[k][:, :-1] for k in ("attention_mask", "labels")}
        rows, width = fed["labels"].shape
        tokens["real"].append(int(fed["attention_mask"].sum()))
        tokens["padded"].append(rows * width)
        tokens["scored"].append(int((fed["labels"] != -100).sum()))
        tokens["width"].append(width)
    gpu_ms = None
    if spec["profile_steps"]:
        gpu_ms = _profile_steps(spec["profile_steps"], n_steps, batch_for, engine, sync, rank)
    del _outputs, loss

    result: dict[str, Any] = {
        "step_times_s": [round(t, 5) for t in times],
        "losses": [float(x) for x in losses],
        "tokens": tokens,
        "setup_s": round(setup_s, 2),
        "init_device": "cuda" if init_on_device else "cpu",
        "fsdp_units": fsdp_units,
        "gpu_ms_per_step": gpu_ms,
        "device": str(device),
        "devices": [str(d) for d in devices],
    }
    if spec["engine"] == "pipe":
        result.update(balance=list(engine.balance), stage_devices=[str(d) for d in devices])
    if cuda_devices:
        allocated = [torch.cuda.max_memory_allocated(d) for d in cuda_devices]
        reserved = [torch.cuda.max_memory_reserved(d) for d in cuda_devices]
        result.update(
            peak_allocated=max(allocated),
            peak_reserved=max(reserved),
            peak_allocated_per_device=allocated,
            peak_reserved_per_device=reserved,
            allocated_after_setup_per_device=memory_after_setup,
            device_name=torch.cuda.get_device_name(device),
            device_count=torch.cuda.device_count(),
        )
        if rank == 0:
            result["gpu_info"] = _bench.gpu_info()
    if engine.grad_scaler is not None:
        result["grad_scale_final"] = float(engine.grad_scaler.get_scale())
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    return result


def _profile_steps(
    count: int, n_steps: int, batch_for: Any, engine: Any, sync: Any, rank: int
) -> dict[str, float] | None:
    """``count`` more steps after the timed ones (not counted in them; the run's batches again,
    from the first), rank 0 under ``torch.profiler``: wall ms per step and GPU kernel ms per
    step by kind (``_bench.gpu_ms_by_kind``)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    def run() -> None:
        for step in range(count):
            loss, _ = engine.forward_train(batch_for(step % n_steps), 0, 1)
            engine.backward(loss)
            engine.step()

    if rank != 0 or not torch.cuda.is_available():
        run()  # the other ranks join every collective
        return None
    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        begin = time.perf_counter()
        run()
        sync()
        wall = time.perf_counter() - begin
    return {"wall": round(1000 * wall / count, 3), **_bench.gpu_ms_by_kind(prof.events(), count)}


def _inject_fault(rank: int) -> None:
    """Smoke-test hook: ``TRAIN_SPEED_FAULT=oom|hang|exit:RANK`` (never set in real runs)."""
    fault = os.environ.get("TRAIN_SPEED_FAULT", "")
    kind, _, fault_rank = fault.partition(":")
    if not fault or int(fault_rank) != rank:
        return
    if kind == "oom":
        import torch

        raise torch.OutOfMemoryError(f"injected by TRAIN_SPEED_FAULT={fault}")
    if kind == "hang":
        time.sleep(10**6)
    if kind == "exit":  # dies without a word, as a worker that cannot start would
        os._exit(3)


# --- the launcher -----------------------------------------------------------------------------


def run_config(spec: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Start ``world_size`` processes for one configuration; collect what they report.

    With ``start_method`` ``forkserver`` the workers fork from a server that imported
    :data:`PRELOAD` once (saves the imports per configuration); if no rank of the first such run
    reports anything, the launcher falls back to ``spawn`` (see :func:`main`).
    """
    import torch.multiprocessing as mp

    result_dir = Path(tempfile.mkdtemp(prefix="train-speed-"))
    started = time.perf_counter()
    failure = None
    try:
        context = mp.start_processes(
            _worker,
            args=(spec, str(result_dir)),
            nprocs=spec["world_size"],
            join=False,
            start_method=spec["start_method"],
        )
        deadline = started + timeout_s
        while True:
            try:
                if context.join(timeout=2, grace_period=5):
                    break
            except Exception as error:  # a rank exited non-zero; the others were stopped
                failure = _bench.short_error(error)
                break
            if time.perf_counter() > deadline:
                failure = f"timeout: no result within {timeout_s:.0f} s"
                for process in context.processes:
                    if process.is_alive():
                        process.terminate()
                for process in context.processes:
                    process.join(10)
                    if process.is_alive():
                        process.kill()
                        process.join()
                break
        ranks = []
        for rank in range(spec["world_size"]):
            path = result_dir / f"rank{rank}.json"
            ranks.append(json.loads(path.read_text()) if path.is_file() else {"rank": rank})
    finally:
        shutil.rmtree(result_dir, ignore_errors=True)
    wall_s = round(time.perf_counter() - started, 1)
    row = summarize(spec, ranks, failure, wall_s)
    row["start_method"] = spec["start_method"]
    row["no_rank_reported"] = all(len(r) == 1 for r in ranks)
    return row


def summarize(
    spec: dict[str, Any], ranks: list[dict[str, Any]], failure: str | None, wall_s: float
) -> dict[str, Any]:
    row: dict[str, Any] = {
        key: spec[key]
        for key in (
            "world_size",
            "data",
            "shape",
            "config",
            "engine",
            "precision",
            "modifiers",
            "sharding",
            "pipe",
            "batch_size",
            "seq_len",
            "warmup",
            "steps",
            "n_params",
        )
    }
    row["wall_s"] = wall_s
    errors = [r for r in ranks if "error" in r]
    if errors or failure:
        first = next((r for r in errors if r["error"] == "OOM"), errors[0] if errors else None)
        row["error"] = first["error"] if first else (failure or "crash").split(":")[0]
        if row["error"] not in ("timeout", "OOM", "error"):
            row["error"] = "crash"
        row["message"] = first["message"] if first else failure
        if first:
            row["traceback"] = first.get("traceback")
        return row
    main = ranks[0]
    warmup = spec["warmup"]
    times = main["step_times_s"][warmup:]
    step_s = _bench.median(times)
    # GPUs (devices) doing the work: one per rank, or every stage of a pipe's one process.
    gpus = sum(len(r.get("devices") or [None]) for r in ranks)
    shape = spec["model_config"]
    # Tokens of the timed steps, summed over ranks (ranks' batches differ in length under piqa);
    # the steps of all ranks take the same time (gradients are reduced in every step).
    real = sum(sum(r["tokens"]["real"][warmup:]) for r in ranks)
    padded = sum(sum(r["tokens"]["padded"][warmup:]) for r in ranks)
    widths = [w for r in ranks for w in r["tokens"]["width"][warmup:]]
    if spec["data"] == "piqa":
        # Batches differ from step to step: throughput over the whole timed span.
        span_s = sum(times)
    else:
        span_s = step_s * len(times)  # one fixed batch: the median step is the step
    tokens_per_s = real / span_s / gpus
    padded_per_s = padded / span_s / gpus
    mean_width = sum(widths) / len(widths)  # positions the model reads per row
    seq_for_flops = spec["seq_len"] or mean_width
    flops_per_token = 6 * spec["n_params"] + 12 * shape["n_layer"] * shape["n_embd"] * seq_for_flops
    losses = main["losses"]
    row.update(
        step_time_s_median=round(step_s, 5),
        step_time_s_mean=round(sum(times) / len(times), 5),
        step_time_s_min=min(times),
        step_time_s_max=max(times),
        step_times_s=main["step_times_s"],
        gpus=gpus,
        tokens_per_step_per_gpu=round(real / len(times) / gpus, 1),
        tokens_per_s_per_gpu=round(tokens_per_s, 1),
        tokens_per_s_total=round(tokens_per_s * gpus, 1),
        padded_tokens_per_s_per_gpu=round(padded_per_s, 1),
        padding_fraction=round(1 - real / padded, 4),
        mean_positions_per_row=round(mean_width, 1),
        scored_tokens_timed=sum(sum(r["tokens"]["scored"][warmup:]) for r in ranks),
        real_tokens_timed=real,
        padded_tokens_timed=padded,
        mfu=round(flops_per_token * tokens_per_s / _bench.PEAK_FLOPS, 6),
        loss_first=losses[0],
        loss_last=losses[-1],
        losses_finite=all(x == x and abs(x) != float("inf") for x in losses),
        setup_s=main["setup_s"],
        init_device=main["init_device"],
        fsdp_units=main["fsdp_units"],
        grad_scale_final=main.get("grad_scale_final"),
        devices=[d for r in ranks for d in r.get("devices") or []],
    )
    if spec["engine"] == "pipe":
        row.update(stage_devices=main.get("stage_devices"), balance=main.get("balance"))
    gpu_ms = main.get("gpu_ms_per_step")
    if gpu_ms:
        row["gpu_ms_per_step"] = gpu_ms
        if spec["data"] == "synthetic" and spec["engine"] != "pipe":
            row["kernel_tflops"] = kernel_tflops(spec, gpu_ms)
    if "peak_allocated" in main:
        # Per device: every rank's device(s) in rank order (a pipe: its stages in order).
        row.update(
            device_name=main.get("device_name"),
            peak_allocated_gib=_bench.gib(max(r["peak_allocated"] for r in ranks)),
            peak_reserved_gib=_bench.gib(max(r["peak_reserved"] for r in ranks)),
            peak_allocated_gib_per_rank=[_bench.gib(r["peak_allocated"]) for r in ranks],
            peak_reserved_gib_per_rank=[_bench.gib(r["peak_reserved"]) for r in ranks],
            peak_allocated_gib_per_device=[
                _bench.gib(x) for r in ranks for x in r["peak_allocated_per_device"]
            ],
            peak_reserved_gib_per_device=[
                _bench.gib(x) for r in ranks for x in r["peak_reserved_per_device"]
            ],
            allocated_after_setup_gib_per_device=[
                _bench.gib(x) for r in ranks for x in r["allocated_after_setup_per_device"]
            ],
        )
    if "gpu_info" in main:
        row["gpu_info"] = main["gpu_info"]
    return row


def kernel_tflops(spec: dict[str, Any], gpu_ms: dict[str, float]) -> dict[str, float | None]:
    """Achieved TFLOP/s inside the GEMM and the attention kernels of one synthetic step.

    GEMM FLOPs per token 6 x (12 n_layer n_embd^2 + vocab n_embd) (the blocks' four
    projections and the LM head, forward and backward), attention 12 n_layer n_embd seq_len
    (the MFU formula's term, as if not causal); x 4/3 with activation checkpointing (the
    forward again).
    """
    shape = spec["model_config"]
    layers, width = shape["n_layer"], shape["n_embd"]
    recompute = 4 / 3 if "ckpt" in spec.get("modifiers", []) else 1.0
    tokens = spec["batch_size"] * spec["seq_len"] * recompute
    flops = {
        "gemm": 6 * (12 * layers * width**2 + shape["vocab_size"] * width) * tokens,
        "attention": 12 * layers * width * spec["seq_len"] * tokens,
    }
    return {
        kind: round(flops[kind] / (gpu_ms[kind] / 1000) / 1e12, 1) if gpu_ms.get(kind) else None
        for kind in flops
    }


# --- baselines and the markdown table ---------------------------------------------------------


def baseline_for(row: dict[str, Any], rows: list[dict[str, Any]], preference: list[str]) -> Any:
    """DDP of the same precision, shape and world size if measured, else per ``preference``."""
    group = [
        r
        for r in rows
        if r["engine"] == "ddp"
        and "error" not in r
        and r["shape"] == row["shape"]
        and r["world_size"] == row["world_size"]
    ]
    same = [r for r in group if r["precision"] == row["precision"]]
    if same:
        return same[0]
    for name in preference:
        for r in group:
            if r["config"] == name:
                return r
    return group[0] if group else None


def add_ratios(
    rows: list[dict[str, Any]], preference: list[str], compare_to: str | None = None
) -> None:
    """``*_vs_baseline`` (same-precision DDP) and ``*_vs_compare`` (``compare_to``) ratios."""
    for row in rows:
        base = baseline_for(row, rows, preference)
        row["baseline"] = base["config"] if base else None
        if base is not None and "error" not in row:
            row["tokens_per_s_vs_baseline"] = _ratio(row, base, "tokens_per_s_per_gpu")
            row["peak_allocated_vs_baseline"] = _ratio(row, base, "peak_allocated_gib")
        other = _same_group(row, rows, compare_to) if compare_to else None
        row["compare_to"] = compare_to if other else None
        if other is not None and "error" not in row:
            row["tokens_per_s_vs_compare"] = _ratio(row, other, "tokens_per_s_per_gpu")
            row["peak_allocated_vs_compare"] = _ratio(row, other, "peak_allocated_gib")
            row["peak_reserved_vs_compare"] = _ratio(row, other, "peak_reserved_gib")


def _same_group(row: dict[str, Any], rows: list[dict[str, Any]], config: str) -> Any:
    """The error-free run of ``config`` with the same shape, world size and batch size."""
    for other in rows:
        if (
            other["config"] == config
            and "error" not in other
            and other["shape"] == row["shape"]
            and other["world_size"] == row["world_size"]
            and other["batch_size"] == row["batch_size"]
        ):
            return other
    return None


def _ratio(row: dict[str, Any], base: dict[str, Any], key: str) -> float | None:
    if not row.get(key) or not base.get(key):
        return None
    return round(row[key] / base[key], 3)


def target_checks(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's must-show: ``--target`` vs ``--compare-to`` per shape and world size."""
    settings = report["settings"]
    target, compare_to = settings.get("target"), settings.get("compare_to")
    if not target or not compare_to:
        return []
    checks = []
    for row in report["results"]:
        if row["config"] != target:
            continue
        base = _same_group(row, report["results"], compare_to)
        check: dict[str, Any] = {
            "world_size": row["world_size"],
            "shape": row["shape"],
            "batch_size": row["batch_size"],
            "target": target,
            "compare_to": compare_to,
        }
        if "error" in row or base is None:
            check["status"] = (
                f"{target}: {row['error']}" if "error" in row else f"{compare_to} not measured"
            )
            checks.append(check)
            continue
        memory = row.get("peak_allocated_vs_compare")
        throughput = row.get("tokens_per_s_vs_compare")
        check.update(
            peak_allocated_gib=row.get("peak_allocated_gib"),
            compare_peak_allocated_gib=base.get("peak_allocated_gib"),
            peak_allocated_ratio=memory,
            peak_reserved_ratio=row.get("peak_reserved_vs_compare"),
            tokens_per_s_per_gpu=row["tokens_per_s_per_gpu"],
            compare_tokens_per_s_per_gpu=base["tokens_per_s_per_gpu"],
            tokens_per_s_ratio=throughput,
            memory_target=round(TARGET_MEMORY_RATIO, 4),
            throughput_target=TARGET_THROUGHPUT_RATIO,
            memory_met=None if memory is None else memory <= TARGET_MEMORY_RATIO,
            throughput_met=throughput >= TARGET_THROUGHPUT_RATIO,
        )
        check["status"] = "measured"
        checks.append(check)
    return checks


# --- the pipe against one GPU -------------------------------------------------------------


def micro_batches(rows: int, chunks: int) -> list[int]:
    """Rows of each micro-batch as ``Pipe`` cuts a batch (``torch.chunk``: ceil-sized pieces,
    so e.g. 6 rows in 4 chunks give 3 micro-batches of 2)."""
    if rows < 1 or chunks < 1:
        return []
    size = -(-rows // chunks)
    return [min(size, rows - start) for start in range(0, rows, size)]


def bubble_fraction(stages: int, chunks: int) -> float:
    """GPipe's idle share of each stage: ``(S - 1) / (M + S - 1)``."""
    return (stages - 1) / (chunks + stages - 1)


def block_and_head_flops(model_config: dict[str, Any], seq_len: float) -> tuple[float, float]:
    """Training FLOPs per token (forward + backward) of one transformer block and of the LM
    head, by the MFU formula's rules: 6 x parameters (a block: 12 d^2 + 13 d) plus 12 d x seq
    for a block's attention scores; the head 6 V d; embedding lookups cost nothing."""
    d = model_config["n_embd"]
    return 6 * (12 * d * d + 13 * d) + 12 * d * seq_len, 6 * model_config["vocab_size"] * d


def stage_flops_per_token(
    model_config: dict[str, Any], balance: list[int], seq_len: float
) -> list[float]:
    """Each stage's training FLOPs per token: its blocks, plus the LM head on the last."""
    block, head = block_and_head_flops(model_config, seq_len)
    flops = [n * block for n in balance]
    flops[-1] += head
    return flops


def checkpointed_share(checkpoint: str, chunks: int) -> float:
    """Share of the micro-batches whose forward runs twice (FairScale's checkpoint modes)."""
    if chunks < 1:
        return 0.0
    return {"never": 0.0, "always": 1.0, "except_last": (chunks - 1) / chunks}[checkpoint]


def single_gpu_baseline(row: dict[str, Any], rows: list[dict[str, Any]]) -> Any:
    """DDP at world size 1 (the bare model on one GPU), same shape, batch and data; the same
    precision if measured, else any."""
    group = [
        r
        for r in rows
        if r["engine"] == "ddp"
        and "error" not in r
        and r["world_size"] == 1
        and r["shape"] == row["shape"]
        and r["batch_size"] == row["batch_size"]
        and r["data"] == row["data"]
    ]
    same = [r for r in group if r["precision"] == row["precision"]]
    candidates = same or group
    return candidates[0] if candidates else None


def pipe_analysis(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Every pipe run against the single-GPU run: throughput, efficiency, the GPipe bubble and
    a prediction of the efficiency from the bubble, the stage balance and recomputation."""
    rows = report["results"]
    entries = []
    for row in rows:
        if row["engine"] != "pipe":
            continue
        pipe = row.get("pipe") or {}
        entry: dict[str, Any] = {
            "shape": row["shape"],
            "config": row["config"],
            "batch_size": row["batch_size"],
            "world_size": row["world_size"],
            "chunks_requested": pipe.get("chunks"),
            "checkpoint": pipe.get("checkpoint"),
        }
        if "error" in row:
            entry["status"] = f"{row['error']}: {(row.get('message') or '')[:160]}"
            entries.append(entry)
            continue
        stages = len(row.get("stage_devices") or row.get("devices") or [])
        pieces = micro_batches(row["batch_size"], pipe["chunks"])
        m = len(pieces)
        bubble = bubble_fraction(stages, m)
        model_config = _bench.gpt2_config(row["shape"])
        seq = row.get("seq_len") or row.get("mean_positions_per_row") or 0
        flops = stage_flops_per_token(model_config, row.get("balance") or [1] * stages, seq)
        balance_eff = sum(flops) / len(flops) / max(flops)
        recompute = 1 + RECOMPUTE_SHARE * checkpointed_share(pipe["checkpoint"], m)
        predicted = (1 - bubble) * balance_eff / recompute
        block, head = block_and_head_flops(model_config, seq)
        entry.update(
            status="measured",
            stages=stages,
            stage_devices=row.get("stage_devices"),
            balance=row.get("balance"),
            micro_batches=m,
            rows_per_micro_batch=pieces,
            bubble_fraction=round(bubble, 4),
            bubble_free_share=round(1 - bubble, 4),
            stage_flops_per_token=[round(f) for f in flops],
            stage_flop_balance=round(balance_eff, 4),
            lm_head_in_blocks=round(head / block, 2),
            recompute_factor=round(recompute, 4),
            predicted_efficiency=round(predicted, 4),
            step_time_s=row["step_time_s_median"],
            tokens_per_s_pipe=row["tokens_per_s_total"],
            tokens_per_s_per_device=row["tokens_per_s_per_gpu"],
            peak_allocated_gib_per_device=row.get("peak_allocated_gib_per_device"),
            peak_reserved_gib_per_device=row.get("peak_reserved_gib_per_device"),
        )
        base = single_gpu_baseline(row, rows)
        if base is None:
            entry["single_gpu"] = None
            entries.append(entry)
            continue
        measured = row["tokens_per_s_total"] / (stages * base["tokens_per_s_total"])
        entry.update(
            single_gpu=base["config"],
            single_gpu_step_time_s=base["step_time_s_median"],
            single_gpu_tokens_per_s=base["tokens_per_s_total"],
            speedup_vs_single_gpu=round(row["tokens_per_s_total"] / base["tokens_per_s_total"], 4),
            measured_efficiency=round(measured, 4),
            measured_over_predicted=round(measured / predicted, 4) if predicted else None,
            single_gpu_peak_allocated_gib=base.get("peak_allocated_gib"),
            single_gpu_peak_reserved_gib=base.get("peak_reserved_gib"),
            max_device_peak_allocated_vs_single=_ratio(row, base, "peak_allocated_gib"),
        )
        entries.append(entry)
    return entries


def pipe_markdown(entries: list[dict[str, Any]]) -> list[str]:
    """The pipe section: throughput and efficiency, memory per device, the bubble explained."""

    def fmt(value: Any, spec: str = "") -> str:
        return "–" if value is None else format(value, spec)

    def per_device(values: Any) -> str:
        return " / ".join(f"{x:.2f}" for x in values) if values else "–"

    lines = [
        "",
        "## Pipeline (`pipe`, GPipe) against one GPU",
        "",
        "One process drives S stages, one per device (`balance` = transformer blocks per stage, "
        "automatic: parameter count balanced, embeddings on the first stage, final norm + LM "
        "head + loss on the last); each batch of B rows is cut into M micro-batches. One GPU = "
        "the DDP engine at world size 1 (the bare model) with the same batch B and precision, "
        "in this run. Efficiency = pipe tokens/s ÷ (S × one-GPU tokens/s): 1.00 would be "
        "perfect scaling over S GPUs. Bubble = (S−1)/(M+S−1). Predicted efficiency = "
        "(1 − bubble) × stage FLOP balance ÷ recompute factor (explained below the tables).",
        "",
        "| shape | config | B | S | M (rows each) | balance | ckpt | step ms pipe / 1 GPU "
        "| tok/s pipe | tok/s per device | tok/s 1 GPU | speedup | efficiency | bubble "
        "| 1 − bubble | FLOP balance | recompute × | predicted | measured / predicted |",
        "|---|---|---:|---:|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for e in entries:
        head = f"| {e['shape']} | {e['config']} | {e['batch_size']} "
        if e["status"] != "measured":
            lines.append(head + "| – " * 15 + f"| {e['status']} |")
            continue
        rows_each = "/".join(str(n) for n in sorted(set(e["rows_per_micro_batch"]), reverse=True))
        single_ms = e.get("single_gpu_step_time_s")
        lines.append(
            head
            + f"| {e['stages']} | {e['micro_batches']} ({rows_each}) "
            + f"| {'/'.join(map(str, e['balance'] or []))} | {e['checkpoint']} "
            + f"| {1000 * e['step_time_s']:.1f} / "
            + (f"{1000 * single_ms:.1f}" if single_ms else "–")
            + f" | {e['tokens_per_s_pipe']:,.0f} | {e['tokens_per_s_per_device']:,.0f} "
            + f"| {fmt(e.get('single_gpu_tokens_per_s'), ',.0f')} "
            + f"| {fmt(e.get('speedup_vs_single_gpu'), '.2f')} "
            + f"| **{fmt(e.get('measured_efficiency'), '.3f')}** "
            + f"| {e['bubble_fraction']:.3f} | {e['bubble_free_share']:.3f} "
            + f"| {e['stage_flop_balance']:.3f} | {e['recompute_factor']:.3f} "
            + f"| {e['predicted_efficiency']:.3f} "
            + f"| {fmt(e.get('measured_over_predicted'), '.3f')} |"
        )
    lines += [
        "",
        "Peak memory per device (GiB, `torch.cuda.max_memory_allocated` / `_reserved` of each "
        "stage's GPU over the timed steps), against the one-GPU run:",
        "",
        "| shape | config | B | devices | peak alloc per device | 1 GPU peak alloc "
        "| largest device / 1 GPU | peak reserved per device | 1 GPU peak reserved |",
        "|---|---|---:|---|---|---:|---:|---|---:|",
    ]
    for e in entries:
        if e["status"] != "measured":
            continue
        lines.append(
            f"| {e['shape']} | {e['config']} | {e['batch_size']} "
            f"| {', '.join(e.get('stage_devices') or [])} "
            f"| {per_device(e.get('peak_allocated_gib_per_device'))} "
            f"| {fmt(e.get('single_gpu_peak_allocated_gib'), '.2f')} "
            f"| {fmt(e.get('max_device_peak_allocated_vs_single'), '.3f')} "
            f"| {per_device(e.get('peak_reserved_gib_per_device'))} "
            f"| {fmt(e.get('single_gpu_peak_reserved_gib'), '.2f')} |"
        )
    heads = {
        (e["shape"], tuple(e["balance"])): e
        for e in entries
        if e["status"] == "measured" and e.get("balance") and e["stages"] > 1
    }
    lines += [
        "",
        "**The bubble.** GPipe sends all M micro-batches forward through stages 1…S, then all "
        "backward through S…1. Stage s gets its first micro-batch only after the s−1 stages "
        "before it have handled one, and the last stage's first backward waits for the forward "
        "to drain: of the M+S−1 micro-batch slots of each forward (and each backward) sweep, "
        "every stage is busy in M and idle in S−1. With S = 2 the idle share (S−1)/(M+S−1) "
        "is 1/3 at M = 2, 1/5 at M = 4, 1/9 at M = 8 and 1/17 at M = 16; more micro-batches "
        "shrink it, but each micro-batch has B/M rows, so its matrix multiplications are "
        "smaller and use the GPU less well.",
        "",
        "**The other predicted losses.** *Stage FLOP balance* = mean ÷ largest of the stages' "
        "training FLOPs per token (the pipe runs at the pace of its slowest stage): `balance` "
        "evens out parameters, and the embedding (first stage) and the LM head (last stage) "
        "hold about as many, but the embedding is a lookup while the head is a V × d matrix "
        "multiplication, so the last stage has more work. *Recompute factor* = 1 + ⅓ × the "
        "share of checkpointed micro-batches: a checkpointed micro-batch runs its forward "
        "again during backward (forward ≈ ⅓ of forward + backward); `except_last` "
        "checkpoints M−1 of M, `always` all, `never` none. The one-GPU run recomputes nothing.",
        "",
        "**What the prediction leaves out** (`measured / predicted` below 1): the smaller "
        "matrix multiplications of B/M-row micro-batches, the activation copies between the "
        "GPUs (FairScale's copy streams), the Python worker threads that schedule each "
        "micro-batch on each stage, the tied LM head's gradient merge and weight copy every "
        "step, and the optimizer step (per stage, after the pipe has drained).",
        "",
        "**Memory.** Each device holds only its stage's parameters, gradients and AdamW state "
        "(fp32: 16 bytes per parameter, about 1/S of the model's), plus the activations of "
        "its stage: every micro-batch's full activations with `never` (all M live at once, "
        "as one whole batch on one GPU, but only this stage's layers), only each "
        "micro-batch's stage input with checkpointing (the last micro-batch in full under "
        "`except_last`). The last stage also keeps a copy of the tied embedding "
        "(V × d, fp32) and its gradient for the LM head.",
    ]
    for (shape, _), e in heads.items():
        lines += [
            "",
            f"{shape}: balance {e['balance']} blocks; the LM head costs about "
            f"{e['lm_head_in_blocks']:.1f} blocks' FLOPs, so the stages' FLOPs per token are "
            + " / ".join(f"{f / 1e9:.3g} G" for f in e["stage_flops_per_token"])
            + f" (balance {e['stage_flop_balance']:.3f}).",
        ]
    return lines


def markdown(report: dict[str, Any]) -> str:
    env = report["environment"]
    settings = report["settings"]
    piqa = settings.get("data") == "piqa"
    compare_to = settings.get("compare_to")
    if piqa:
        data = (
            "PIQA training examples (correct answer only, `training_queries` + `training_batch`: "
            "right-padded rows, packed ones for `-packed` configs), a different slice per "
            "rank, new batches every step; tokens/s counts "
            "real (non-pad) positions, `padded tok/s` all `rows x positions`; throughput = tokens "
            "of the timed steps / their summed time"
        )
    else:
        data = (
            f"Fixed random batch of {settings['seq_len']} positions per row (every token "
            "scored); throughput from the median step after warmup"
        )
    lines = [
        f"# Training speed: {env.get('gpu_name') or 'CPU'} x{env.get('gpu_count')}, "
        f"commit {str(env.get('commit'))[:12]}, torch {env.get('torch')}",
        "",
        f"{data}. Batch = rows per GPU; AdamW; tokens/s per GPU; MFU = "
        + _bench.MFU_FORMULA
        + (" (seq_len = mean positions per row)" if piqa else "")
        + ". `x base`: ratio to the DDP run of the same shape, world size and (if measured) "
        "precision, in this run"
        + (
            f"; `x {compare_to}`: ratio to `{compare_to}` at the same shape, world size and batch."
            if compare_to
            else "."
        ),
        "Peak memory: the largest over the GPUs (each GPU's in the `per GPU` column).",
    ]
    if not piqa:
        lines.append(
            f"`unsteady` (note): the slowest timed step took over {UNSTEADY_RATIO:.2f}x the "
            "fastest — the machine ran this configuration at two speeds, so its ratios may "
            "compare the machine's states rather than the configurations."
        )
    if any(r["engine"] == "pipe" for r in report["results"]):
        lines.append(
            "`pipe-*` rows: one process (world size 1) over "
            f"{', '.join(settings.get('pipe_devices_resolved') or [])}; batch = rows of the "
            "whole pipe's batch; tokens/s/GPU = the pipe's tokens/s ÷ its stages, and MFU "
            "per GPU from it; `cN` = N chunks (micro-batches), `ckpt-MODE` = checkpoint mode "
            "(default `except_last`), `bA_B` = A and B blocks per stage (default automatic)."
        )
    lines.append("")
    head = ["world", "shape", "config", "batch", "step ms", "tokens/s/GPU"]
    align = ["---:", "---", "---", "---:", "---:", "---:"]
    if piqa:
        head += ["median step ms", "padded tok/s/GPU", "pad %"]
        align += ["---:", "---:", "---:"]
    head += ["x base"]
    align += ["---:"]
    if compare_to:
        head += [f"x {compare_to}"]
        align += ["---:"]
    head += ["MFU %", "peak alloc GiB", "x base"]
    align += ["---:", "---:", "---:"]
    if compare_to:
        head += [f"x {compare_to}"]
        align += ["---:"]
    head += ["per GPU", "peak reserved GiB", "units", "base", "note"]
    align += ["---", "---:", "---:", "---", "---"]
    lines += ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]

    def fmt(value: Any, spec: str = "") -> str:
        return "–" if value is None else format(value, spec)

    for r in report["results"]:
        cells = [str(r["world_size"]), r["shape"], r["config"], str(r["batch_size"])]
        if "error" in r:
            note = r["error"] + (f": {r['message'][:80]}" if r.get("message") else "")
            cells += ["–"] * (len(head) - len(cells) - 2) + [r.get("baseline") or "–", note]
            lines.append("| " + " | ".join(cells) + " |")
            continue
        note = "; ".join(
            text
            for text in ("" if r["losses_finite"] else "non-finite loss", unsteady_note(r))
            if text
        )
        mfu = None if r.get("mfu") is None else 100 * r["mfu"]
        step = (
            f"{1000 * r['step_time_s_median']:.1f}"
            if not piqa
            else f"{1000 * r['step_time_s_mean']:.1f}"
        )
        cells += [step, f"{r['tokens_per_s_per_gpu']:,.0f}"]
        if piqa:
            cells += [
                f"{1000 * r['step_time_s_median']:.1f}",
                f"{r['padded_tokens_per_s_per_gpu']:,.0f}",
                f"{100 * r['padding_fraction']:.1f}",
            ]
        cells += [fmt(r.get("tokens_per_s_vs_baseline"), ".2f")]
        if compare_to:
            cells += [fmt(r.get("tokens_per_s_vs_compare"), ".2f")]
        cells += [
            fmt(mfu, ".1f"),
            fmt(r.get("peak_allocated_gib"), ".2f"),
            fmt(r.get("peak_allocated_vs_baseline"), ".2f"),
        ]
        if compare_to:
            cells += [fmt(r.get("peak_allocated_vs_compare"), ".3f")]
        per_gpu = r.get("peak_allocated_gib_per_device") or r.get("peak_allocated_gib_per_rank")
        cells += [
            "/".join(f"{x:.2f}" for x in per_gpu) if per_gpu else "–",
            fmt(r.get("peak_reserved_gib"), ".2f"),
            fmt(r.get("fsdp_units")),
            r.get("baseline") or "–",
            note,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if piqa:
        lines += [
            "",
            "`step ms`: mean over the timed steps (batches differ in length; a step with a new "
            "batch shape can take 0.2-6 s of kernel selection or recompilation, so the mean "
            "depends on how many shapes the run met); `median step ms`: the typical step.",
        ]
    checks = report.get("target_checks") or []
    if checks:
        target, other = checks[0]["target"], checks[0]["compare_to"]
        lines += [
            "",
            f"## Target: `{target}` vs `{other}` at the same batch",
            "",
            f"Peak memory allocated per GPU (max over ranks) at most "
            f"{TARGET_MEMORY_RATIO:.3f}x, tokens/s per GPU at least "
            f"{TARGET_THROUGHPUT_RATIO:.2f}x.",
            "",
            f"| world | shape | batch | peak alloc GiB ({target} / {other}) | memory ratio | "
            f"reserved ratio | tokens/s/GPU ({target} / {other}) | throughput ratio | memory | "
            "throughput |",
            "|---:|---|---:|---|---:|---:|---|---:|---|---|",
        ]
        for c in checks:
            if c["status"] != "measured":
                lines.append(
                    f"| {c['world_size']} | {c['shape']} | {c['batch_size']} | – | – | – | – "
                    f"| – | {c['status']} | – |"
                )
                continue

            def verdict(met: Any) -> str:
                return "–" if met is None else ("**met**" if met else "**not met**")

            lines.append(
                f"| {c['world_size']} | {c['shape']} | {c['batch_size']} "
                f"| {fmt(c['peak_allocated_gib'], '.2f')} / "
                f"{fmt(c['compare_peak_allocated_gib'], '.2f')} "
                f"| {fmt(c['peak_allocated_ratio'], '.3f')} "
                f"| {fmt(c['peak_reserved_ratio'], '.3f')} "
                f"| {c['tokens_per_s_per_gpu']:,.0f} / {c['compare_tokens_per_s_per_gpu']:,.0f} "
                f"| {fmt(c['tokens_per_s_ratio'], '.3f')} | {verdict(c['memory_met'])} "
                f"| {verdict(c['throughput_met'])} |"
            )
    if report.get("pipe_analysis"):
        lines += pipe_markdown(report["pipe_analysis"])
    lines += gpu_time_markdown(report["results"])
    if any("root" in r["modifiers"] for r in report["results"]):
        lines += [
            "",
            "`root`: `modules_to_wrap: []`, the whole model one FSDP unit (catwalk's setting).",
        ]
    return "\n".join(lines) + "\n"


#: Timed steps of one fixed batch whose slowest is this much slower than the fastest: the run
#: met the GPU machine in two speeds (runs 25-28 saw every configuration, eager ones too,
#: switch mid-process), so a ratio to another run may compare the machine's states.
UNSTEADY_RATIO = 1.15


def unsteady_note(row: dict[str, Any]) -> str:
    """``"unsteady: steps 142-198 ms"`` for a synthetic run whose timed steps spread more than
    :data:`UNSTEADY_RATIO` (PIQA steps differ in shape, so they spread by design), else ``""``."""
    if row.get("data") != "synthetic" or "step_time_s_min" not in row:
        return ""
    fastest, slowest = row["step_time_s_min"], row["step_time_s_max"]
    if slowest <= UNSTEADY_RATIO * fastest:
        return ""
    return f"unsteady: steps {1000 * fastest:.0f}-{1000 * slowest:.0f} ms"


def gpu_time_markdown(rows: list[dict[str, Any]]) -> list[str]:
    """The ``--profile-steps`` section: where each profiled run's GPU time goes."""
    profiled = [r for r in rows if r.get("gpu_ms_per_step")]
    if not profiled:
        return []
    kinds = _bench.KERNEL_KIND_NAMES
    lines = [
        "",
        "## Where the GPU time goes (profiled steps)",
        "",
        "Steps run after the timed ones under `torch.profiler` (rank 0): wall ms per step, GPU "
        "kernel ms per step by kind (`gemm`: cuBLAS/CUTLASS matrix products; `attention`: "
        "SDPA's kernels; `compiled`: Inductor's Triton kernels; `optimizer`: multi-tensor "
        "kernels of AdamW and gradient clipping; `other`: PyTorch's eager elementwise and "
        "reduction kernels), `idle` = wall − busy (the GPU waiting on the host; busy can exceed "
        "wall where kernels on several streams overlap). Synthetic data: "
        "achieved TFLOP/s inside the GEMMs (6 × (12·L·d² + V·d) per token) and the attention "
        "kernels (12·L·d·T per token, as if not causal); × 4/3 with checkpointing.",
        "",
        "| world | shape | config | batch | wall ms | busy ms | idle ms | "
        + " | ".join(f"{k} ms" for k in kinds)
        + " | GEMM TFLOP/s | attention TFLOP/s |",
        "|---:|---|---|---:|" + "---:|" * (3 + len(kinds) + 2),
    ]
    for r in profiled:
        ms = r["gpu_ms_per_step"]
        rates = r.get("kernel_tflops") or {}
        cells = [str(r["world_size"]), r["shape"], r["config"], str(r["batch_size"])]
        cells += [f"{ms['wall']:.1f}", f"{ms['busy']:.1f}", f"{ms['wall'] - ms['busy']:.1f}"]
        cells += [f"{ms.get(k, 0.0):.1f}" for k in kinds]
        cells += ["–" if rates.get(k) is None else f"{rates[k]:.0f}" for k in ("gemm", "attention")]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


# --- main -------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-size", default="1", help="comma list, e.g. 1,2")
    parser.add_argument(
        "--shapes", default="124m", help=f"comma list of {', '.join(_bench.SHAPES)}"
    )
    parser.add_argument("--configs", default="ddp-fp32,ddp-bf16,fairscale-fp32,fairscale-bf16")
    parser.add_argument(
        "--plan",
        action="append",
        default=[],
        metavar="SHAPE:CONFIG,CONFIG",
        help="instead of --shapes x --configs: one shape with its configs (repeatable)",
    )
    parser.add_argument(
        "--batch-size",
        default=None,
        help="per GPU (pipe: the whole pipe's batch): N for all shapes or SHAPE=N,... "
        f"(default {DEFAULT_BATCH}; --tiny: 2 unless given)",
    )
    parser.add_argument("--steps", default="10", help="timed steps: N or SHAPE=N,...")
    parser.add_argument("--warmup", default="3", help="untimed steps first: N or SHAPE=N,...")
    parser.add_argument(
        "--data",
        choices=("synthetic", "piqa"),
        default="synthetic",
        help="synthetic: fixed random seq-len rows; piqa: real PIQA training batches",
    )
    parser.add_argument(
        "--piqa",
        type=Path,
        default=_bench.REPO_ROOT / ".gpudata" / "piqa",
        help="official PIQA files (with --data piqa)",
    )
    parser.add_argument("--seq-len", type=int, default=1024, help="synthetic data only")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--max-grad-norm", type=float, default=None)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--tokenizer", default=str(_bench.REPO_ROOT / ".gpudata" / "gpt2-tokenizer")
    )
    parser.add_argument(
        "--init-device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="where the random init runs on a GPU machine (cpu = exactly the "
        "training step's path; offload configs always init on CPU)",
    )
    parser.add_argument(
        "--baseline",
        default="ddp-bf16,ddp-fp32",
        help="fallback baseline order when no DDP run has the same precision",
    )
    parser.add_argument(
        "--compare-to",
        default="ddp-fp32",
        help="also give every run's ratios to this config (same shape, world size, batch); "
        "'' for none",
    )
    parser.add_argument(
        "--target",
        default="fairscale-bf16-ckpt",
        help="check this config against --compare-to: memory <= 1/3, throughput >= 1x",
    )
    parser.add_argument(
        "--start-method",
        choices=("forkserver", "spawn"),
        default="forkserver",
        help="forkserver: workers fork from a process that imported torch/transformers/tango "
        "once (falls back to spawn if the first run's workers never report)",
    )
    parser.add_argument(
        "--pipe-devices",
        default="all",
        help="the pipe configs' stage devices, comma list (e.g. cuda:0,cuda:1); 'all': every "
        "visible GPU, or cpu,cpu without GPUs",
    )
    parser.add_argument(
        "--profile-steps",
        type=int,
        default=0,
        help="after the timed steps, this many more under torch.profiler (rank 0, GPU): GPU "
        "kernel time per step by kind (GEMM, attention, ...) in the JSON and a Markdown section",
    )
    parser.add_argument("--config-timeout", type=float, default=240.0, help="seconds per config")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="skip configs that would start after this many seconds",
    )
    parser.add_argument("--commit", default=None, help="code commit (default BENCH_COMMIT / git)")
    parser.add_argument("--out", type=Path, required=True, help="result JSON (and .md beside it)")
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="CPU smoke test: shape tiny, seq 64, batch 2, 3 steps, 1 warmup "
        "(PIQA from ../shared/data/piqa when --piqa is not a directory)",
    )
    args = parser.parse_args(argv)
    if args.tiny:
        args.shapes, args.seq_len = "tiny", 64
        args.batch_size = args.batch_size or "2"
        args.steps, args.warmup = "3", "1"
        args.plan = [p.replace(p.split(":")[0], "tiny", 1) for p in args.plan]
        shared = _bench.REPO_ROOT.parent / "shared" / "data" / "piqa"
        if not args.piqa.is_dir() and shared.is_dir():
            args.piqa = shared
    args.batch_size = args.batch_size or DEFAULT_BATCH
    if args.data == "piqa" and not (args.piqa / "train.jsonl").is_file():
        raise SystemExit(f"--piqa {args.piqa} holds no train.jsonl (official PIQA files)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    started = time.perf_counter()
    world_sizes = [int(w) for w in args.world_size.split(",")]
    if args.plan:
        plan = []
        for entry in args.plan:
            shape, _, configs = entry.partition(":")
            plan.append((shape, [c for c in configs.split(",") if c]))
    else:
        plan = [(s, [c for c in args.configs.split(",") if c]) for s in args.shapes.split(",")]
    parsed = {c: parse_config(c) for _, configs in plan for c in configs}  # fail fast
    tokenizer = str(Path(args.tokenizer).resolve())
    if not Path(tokenizer).is_dir():
        raise SystemExit(f"--tokenizer {tokenizer} is not a directory (GPT-2 tokenizer files)")
    train_examples = None
    if args.data == "piqa":
        from tango_fairscale.data import read_piqa

        train_examples = list(read_piqa(args.piqa)["train"])
    cuda = torch.cuda.is_available()
    gpus = torch.cuda.device_count() if cuda else 0
    stage_devices = pipe_devices(args.pipe_devices, cuda, gpus)
    start_method = args.start_method
    if start_method == "forkserver":
        import multiprocessing

        # Fork-safe CUDA availability checks, should an import in the server make one.
        os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
        multiprocessing.set_forkserver_preload(PRELOAD)

    environment = _bench.environment(args.commit, query_gpu=False)
    report: dict[str, Any] = {
        "benchmark": "train_speed",
        "environment": environment,
        "settings": {
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "plan": plan,
            "device": "cuda" if cuda else "cpu",
            "optimizer": {"type": "torch::AdamW", "lr": args.lr, "weight_decay": 0.0},
            "batch_size_meaning": "per GPU (each rank gets its own batch_size x seq_len tokens)",
            "timing": "cuda.synchronize before and after each step; median of the steps after "
            "warmup (rank 0); the step is forward_train + backward + step",
            "data_description": (
                "PIQA training examples: BatchSchedule(seed) global batch of batch_size x "
                "world_size, rank r's slice; training_queries (correct answer) + training_batch "
                "(packed for -packed configs; built inside the timed step)"
                if args.data == "piqa"
                else "fixed random token ids, labels = inputs (every position scored)"
            ),
            "tokens_counted": "positions the model reads (a padded row's input_ids[:, :-1], a "
            "packed row whole); real = attention_mask 1, padded = rows x positions",
            "mfu_formula": _bench.MFU_FORMULA,
            "peak_flops": _bench.PEAK_FLOPS,
            "root_only_patterns": ROOT_ONLY_PATTERNS,
            "pipe_devices_resolved": stage_devices,
            "pipe_description": "pipe-PRECISION[-cN][-ckpt-MODE][-bA_B]: PipeEngine in ONE "
            "process (world size 1) over pipe_devices_resolved, balance automatic (parameter "
            "count) or A_B blocks, chunks N (default 4), checkpoint MODE (default except_last); "
            "batch_size = rows of the whole pipe's batch; tokens/s per GPU = whole-pipe "
            "tokens/s / stages",
            "pipe_efficiency": "pipe tokens/s / (stages x single-GPU tokens/s), single GPU = "
            "DDP (bare model) at world size 1, same shape, batch and precision, in this run",
            "pipe_bubble_formula": "(S - 1) / (M + S - 1), S stages, M micro-batches",
        },
        "results": [],
        "start_method_checked": False,
    }
    md_path = args.out.with_suffix(".md")
    n_params_cache: dict[str, int] = {}
    for world_size in world_sizes:
        for shape, configs in plan:
            model_config = _bench.gpt2_config(shape)
            if shape not in n_params_cache:
                n_params_cache[shape] = count_parameters(model_config)
            batch_size = _bench.per_shape(args.batch_size, shape)
            steps = _bench.per_shape(args.steps, shape)
            warmup = _bench.per_shape(args.warmup, shape)
            piqa_batches = None
            if train_examples is not None:
                piqa_batches = piqa_rank_batches(
                    train_examples, batch_size, world_size, warmup + steps, args.seed
                )
            for name in configs:
                spec = {
                    **parsed[name],
                    "data": args.data,
                    "piqa_batches": piqa_batches,
                    "start_method": start_method,
                    "world_size": world_size,
                    "shape": shape,
                    "model_config": model_config,
                    "n_params": n_params_cache[shape],
                    "batch_size": batch_size,
                    "steps": steps,
                    "warmup": warmup,
                    "seq_len": None if args.data == "piqa" else args.seq_len,
                    "lr": args.lr,
                    "max_grad_norm": args.max_grad_norm,
                    "seed": args.seed,
                    "profile_steps": args.profile_steps,
                    "tokenizer": tokenizer,
                    "init_device": args.init_device,
                    "cuda": cuda,
                    "port": _bench.free_port(),
                    "pipe": parsed[name].get("pipe"),
                    "pipe_devices": stage_devices if parsed[name]["engine"] == "pipe" else None,
                }
                elapsed = time.perf_counter() - started
                remaining = None if args.budget_s is None else args.budget_s - elapsed
                label = f"world {world_size} {shape} {name}"
                if spec["engine"] == "pipe" and world_size != 1:
                    # One process drives every stage: a pipe is not data parallel here.
                    row = summarize(spec, [], "pipe runs as one process: world size 1 only", 0.0)
                    row["error"] = "skipped"
                elif cuda and world_size > gpus:
                    row = summarize(spec, [], f"needs {world_size} GPUs, {gpus} visible", 0.0)
                    row["error"] = "skipped"
                elif remaining is not None and remaining < 20:
                    row = summarize(spec, [], "budget spent", 0.0)
                    row["error"] = "skipped"
                else:
                    timeout = (
                        args.config_timeout
                        if remaining is None
                        else min(args.config_timeout, remaining)
                    )
                    print(f"=== {label}: start (timeout {timeout:.0f} s)", flush=True)
                    row = run_config(spec, timeout)
                    if (
                        start_method == "forkserver"
                        and not report["start_method_checked"]
                        and forkserver_failed(row)
                    ):
                        print(
                            f"=== {label}: failed under forkserver ({row.get('message')}); "
                            "falling back to spawn",
                            flush=True,
                        )
                        report["forkserver_failure"] = row.get("message")
                        start_method = spec["start_method"] = "spawn"
                        row = run_config(spec, timeout)
                    report["start_method_checked"] = report["start_method_checked"] or (
                        "error" not in row
                    )
                row.pop("no_rank_reported", None)
                report["results"].append(row)
                if "gpu_info" in row:
                    environment.update(row.pop("gpu_info"))
                add_ratios(report["results"], args.baseline.split(","), args.compare_to or None)
                report["target_checks"] = target_checks(report)
                report["pipe_analysis"] = pipe_analysis(report)
                report["total_wall_s"] = round(time.perf_counter() - started, 1)
                _bench.write_json(args.out, report)
                _bench.write_text(md_path, markdown(report))
                print(f"=== {label}: {one_line(row)}", flush=True)
    print(markdown(report))
    return 0


def forkserver_failed(row: dict[str, Any]) -> bool:
    """Did a run fail in a way that ``spawn`` might not (no worker reported, or CUDA and fork)?"""
    if "error" not in row or row["error"] in ("timeout", "skipped"):
        return False
    message = str(row.get("message") or "")
    return bool(row.get("no_rank_reported")) or any(
        text in message for text in ("fork", "initialization error", "Cannot re-initialize")
    )


def piqa_rank_batches(
    examples: list[dict[str, Any]], batch_size: int, world_size: int, n_steps: int, seed: int
) -> list[list[list[dict[str, Any]]]]:
    """``[rank][step]`` -> that rank's PIQA examples, as the training step's schedule picks them.

    ``batch_size`` is per GPU: the global batch is ``batch_size x world_size`` (no gradient
    accumulation), so every configuration of one world size trains on the same examples.
    """
    from tango_fairscale.batching import BatchSchedule

    batches = []
    for rank in range(world_size):
        schedule = BatchSchedule(len(examples), batch_size * world_size, seed, world_size, rank)
        batches.append(
            [[examples[i] for i in schedule.micro_batches(step)[0]] for step in range(n_steps)]
        )
    return batches


def one_line(row: dict[str, Any]) -> str:
    if "error" in row:
        return f"{row['error']} {row.get('message') or ''} ({row['wall_s']} s)"
    memory = row.get("peak_allocated_gib_per_device") or row.get("peak_allocated_gib")
    padding = f" ({100 * row['padding_fraction']:.0f}% padding)" if row["data"] == "piqa" else ""
    pipe = ""
    if row["engine"] == "pipe":
        pipe = (
            f", pipe {row['tokens_per_s_total']:,.0f} tokens/s over "
            f"{len(row.get('stage_devices') or [])} stages, balance {row.get('balance')}"
        )
    return (
        f"{1000 * row['step_time_s_median']:.1f} ms/step, {row['tokens_per_s_per_gpu']:,.0f} "
        f"tokens/s/GPU{padding}{pipe}, MFU {100 * row['mfu']:.1f}%, peak {memory} GiB, "
        f"loss {row['loss_first']:.3f}->{row['loss_last']:.3f} ({row['wall_s']} s)"
    )


if __name__ == "__main__":
    sys.exit(main())
