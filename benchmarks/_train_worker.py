"""train_speed.py's measured loop: one process per device builds the engine and times its steps.

Each process builds what the training step builds: a Tango ``TrainConfig``, a
``tango_fairscale::causal_lm`` model (random init from a GPT-2 config, dropout as in GPT-2) and
the engine as a registered ``TrainingEngine`` from its ``Params`` (optimizer included). A step is
``forward_train`` -> ``backward`` -> ``step`` between two device synchronisations. The batches:

* synthetic: one fixed random ``batch_size x seq_len`` batch per rank, every token scored;
* piqa: the rank's slice of each global batch (``spec["piqa_batches"]``), tokenized before the
  timed loop and built inside it (right-padded, or packed for ``packed`` configurations).

After the timed steps, ``profile_steps`` / ``cprofile_steps`` more steps run under a profiler
(:mod:`_train_profile`). Rank ``r`` writes ``rank{r}.json`` into the launcher's result folder.
"""

from __future__ import annotations

import gc
import os
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _bench
import _memory_peak
import _piqa
import _train_configs
import _train_profile

Batch = dict[str, Any]


def worker(rank: int, spec: dict[str, Any], result_dir: str) -> None:
    """A process's entry point: measure, write ``rank{rank}.json``; exit 1 on an error."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    result: dict[str, Any] = {"rank": rank}
    path = Path(result_dir) / f"rank{rank}.json"
    try:
        result.update(measure(rank, spec, Path(result_dir)))
    except Exception as error:  # recorded, then this process exits non-zero
        result["error"] = "OOM" if _bench.is_oom(error) else "error"
        result["message"] = _bench.short_error(error)
        result["traceback"] = traceback.format_exc()[-3000:]
        _bench.write_json(path, result)
        print(f"[rank {rank}] {spec['config']} failed: {result['message']}", flush=True)
        raise SystemExit(1) from None
    _bench.write_json(path, result)


def measure(rank: int, spec: dict[str, Any], result_dir: Path) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    started = time.perf_counter()
    config = train_config(rank, spec, result_dir)
    device = config.worker_local_default_device
    if spec["cuda"]:
        torch.cuda.set_device(device)
    torch.manual_seed(spec["seed"])
    if spec["world_size"] > 1:  # the training step's worker joins the group before the engine
        dist.init_process_group(
            "nccl" if spec["cuda"] else "gloo",
            init_method=f"tcp://127.0.0.1:{spec['port']}",
            world_size=spec["world_size"],
            rank=rank,
        )
    engine, init_on_device = build_engine(spec, config, device)
    setup_s = time.perf_counter() - started
    # The devices this process computes on: one per pipe stage (two CPU stages count twice),
    # else its own; memory is read once per distinct GPU.
    devices = list(engine.strategy.stage_devices) if spec["engine"] == "pipe" else [device]
    cuda_devices = list(dict.fromkeys(d for d in devices if d.type == "cuda"))
    inject_fault(rank)

    def sync() -> None:
        for d in cuda_devices:
            torch.cuda.synchronize(d)

    if spec["data"] == "piqa":
        batch_for = piqa_batches(engine, spec, rank)
    else:
        batch_for = synthetic_batch(spec, rank)
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

    n_steps = spec["warmup"] + spec["steps"]
    recording = bool(spec.get("memory_peak")) and bool(cuda_devices)
    baseline = _memory_peak.start() if recording else 0
    with _memory_peak.recordable(recording):
        times, losses, tokens = timed_steps(engine, batch_for, n_steps, sync)
    peak_breakdown = _memory_peak.breakdown(baseline) if recording else None
    timeline = None
    if spec.get("timeline_steps") and len(devices) == 1:
        timeline = timeline_steps(engine, batch_for, spec["warmup"], spec["steps"], device)
    result: dict[str, Any] = {
        "step_times_s": [round(t, 5) for t in times],
        "timeline_step_times_s": timeline,
        "losses": losses,
        "tokens": tokens,
        "setup_s": round(setup_s, 2),
        "init_device": "cuda" if init_on_device else "cpu",
        "fsdp_units": fairscale_units(engine) if spec["engine"] == "fairscale" else None,
        # Step lengths replayed from CUDA graphs (none: eager steps).
        "graphed_lengths": sorted(engine.graphs.graphs) if engine.graphs is not None else [],
        "device": str(device),
        "devices": [str(d) for d in devices],
        "memory_at_peak": peak_breakdown,
    }
    profiled = _train_profile.profile(engine, batch_for, n_steps, sync, rank, spec)
    result.update(profiled)
    if spec["engine"] == "pipe":
        balance = list(engine.strategy.balance)
        result.update(balance=balance, stage_devices=[str(d) for d in devices])
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


def train_config(rank: int, spec: dict[str, Any], result_dir: Path) -> Any:
    from tango.integrations.torch import TrainConfig

    world_size = spec["world_size"]
    return TrainConfig(
        "train-speed",
        result_dir / "work",
        step_name="train_speed",
        worker_id=rank,
        seed=spec["seed"],
        train_steps=spec["warmup"] + spec["steps"],
        is_distributed=world_size > 1,
        devices=list(range(world_size)) if spec["cuda"] else [-1] * world_size,
        distributed_port=spec["port"],
        world_size=world_size,
    )


def build_engine(spec: dict[str, Any], config: Any, device: Any) -> tuple[Any, bool]:
    """The engine from its registered name and ``Params``, and whether the model was built on
    the GPU (CPU init of 1.5B parameters takes ~30 s; offload configurations init on the CPU,
    as the training step does)."""
    import torch
    from tango.common import Lazy, Params
    from tango.integrations.torch import TrainingEngine

    from tango_fairscale.model.causal_lm import ModelWrapper

    _bench.register_components()
    model_params = {"config": spec["model_config"], "tokenizer": spec["tokenizer"], "seed": 0}
    lazy_model = Lazy(ModelWrapper, Params(model_params))
    modifiers = spec.get("modifiers") or []
    init_on_device = spec["cuda"] and spec["init_device"] == "cuda" and "offload" not in modifiers
    model: Any = lazy_model
    if init_on_device:  # the same model; an engine takes a constructed Model as well as a Lazy
        with torch.device(device):
            model = lazy_model.construct()
    engine = Lazy(TrainingEngine, Params(_train_configs.engine_params(spec)))
    return engine.construct(train_config=config, model=model), init_on_device


def piqa_batches(engine: Any, spec: dict[str, Any], rank: int) -> Callable[[int], Batch]:
    """As the training step: tokenize before the loop, build each step's batch inside it."""
    from tango_fairscale.data.batches import training_batch
    from tango_fairscale.data.queries import encode_pairs

    wrapped = engine.wrapped_model
    step_queries = [
        encode_pairs(wrapped.tokenizer, _piqa.training_pairs(examples), wrapped.max_length)
        for examples in spec["piqa_batches"][rank]
    ]
    pad_token_id, max_length = wrapped.pad_token_id, wrapped.max_length
    packed = "packed" in (spec.get("modifiers") or [])

    def batch_for(step: int) -> Batch:
        return training_batch(step_queries[step], pad_token_id, max_length, packed)

    return batch_for


def synthetic_batch(spec: dict[str, Any], rank: int) -> Callable[[int], Batch]:
    """One fixed random batch; every position scored (the model projects all of them)."""
    import torch

    generator = torch.Generator().manual_seed(spec["seed"] * 1000 + rank)
    vocab = spec["model_config"]["vocab_size"]
    input_ids = torch.randint(
        0, vocab, (spec["batch_size"], spec["seq_len"] + 1), generator=generator
    )
    fixed = {
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "labels": input_ids.clone(),
    }
    return lambda step: fixed


def timed_steps(
    engine: Any, batch_for: Callable[[int], Batch], n_steps: int, sync: Callable[[], None]
) -> tuple[list[float], list[float], dict[str, list[int]]]:
    """Wall time, loss and token counts of each step (building the batch is part of the step),
    each step's passes as the training loop runs them (``train.loop.forward_backward``: replayed
    from CUDA graphs where the engine has them, packed batches on one GPU)."""
    from tango_fairscale.train.loop import forward_backward

    engine.model.train()
    times: list[float] = []
    losses = []
    tokens: dict[str, list[int]] = {"real": [], "padded": [], "scored": [], "width": []}
    for step in range(n_steps):
        sync()
        begin = time.perf_counter()
        batch = batch_for(step)
        loss, _ = forward_backward(engine, [batch])
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
    return times, [float(x) for x in losses], tokens


def timeline_steps(
    engine: Any, batch_for: Callable[[int], Batch], first: int, count: int, device: Any
) -> list[float]:
    """The timed steps' batches (``first`` on) again, ``count`` of them, as the training loop
    runs them: no synchronisation between steps, the host running ahead of a GPU. Each step's
    seconds between CUDA events on the GPU's timeline (on a CPU, whose steps end on return, by
    the clock); one more step first fills the queue."""
    import torch

    from tango_fairscale.train.loop import forward_backward

    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    marks: list[Any] = []
    for index in range(count + 1):
        forward_backward(engine, [batch_for(first + max(index - 1, 0))])
        engine.step()
        if cuda:
            marks.append(torch.cuda.Event(enable_timing=True))
            marks[-1].record()
        else:
            marks.append(time.perf_counter())
    if not cuda:
        return [round(end - begin, 5) for begin, end in zip(marks, marks[1:])]
    marks[-1].synchronize()
    return [round(begin.elapsed_time(end) / 1000, 5) for begin, end in zip(marks, marks[1:])]


def fairscale_units(engine: Any) -> int:
    from fairscale.nn.data_parallel import FullyShardedDataParallel

    return sum(isinstance(m, FullyShardedDataParallel) for m in engine.model.modules())


def inject_fault(rank: int) -> None:
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
