"""Static-shape PIQA training steps captured as CUDA graphs, against the eager steps (one GPU).

The main job's steps (random GPT-2 124M, PIQA batches of 16 packed end to end) are host-bound:
~31 ms of wall time for ~7 ms of GPU kernels. This probe measures whether a whole step
(forward, backward and the fused AdamW update) captured once per *bucket* of padded lengths and
replayed gets them below half of DDP fp32's step time. Every variant runs the bare model (no
engine wrapper: at world size 1 nothing is sharded), ``ModelWrapper``-built and seeded alike, on
the PIQA training pairs in the order of the main job's schedule (``BatchSchedule``, seed 42):

* ``eager-fp32``: the package's own packed step in fp32 (``ModelWrapper.forward`` on
  ``training_batch(..., packed=True)``, the package's chunked scored-position loss), fused
  AdamW: what DDP fp32 runs, without DDP;
* ``eager-bf16-autocast``: the same under bf16 autocast (the ``bf16-mixed`` step);
* ``eager-bf16-flat``: the packed rows' real tokens as ONE row (no padding), the same
  block-diagonal mask, and the *static loss*: cross-entropy over every position of the row,
  weighted per token so that it equals the package's loss (each query's mean over its scored
  tokens, averaged over queries; padding and context weigh 0);
* ``eager-bf16-static``: ``eager-bf16-flat`` padded to its bucket (``--bucket``, e.g. a multiple
  of 256 tokens: padding takes position 0, label -100, weight 0 and attends only itself);
* ``graph-bf16-static``: ``eager-bf16-static`` captured per bucket with ``torch.cuda.graph``
  (grads zeroed in place, forward, backward, fused ``capturable`` AdamW with a tensor learning
  rate, the loss copied out) and replayed after copying the step's inputs into the bucket's
  static tensors; if the update cannot be captured, the update runs eagerly after the replay
  (reported as ``optimizer_in_graph: false`` with the first attempt's error);
* ``graph-fp32-static``: the same in fp32.

The package's loss is not captured: it picks the scored positions with ``nonzero`` (a
data-dependent shape) and reads the number of queries on the host. The static loss computes the
logits of every position of the bucket instead (more GEMM work, no host reads).

Each variant's *timing run* (dropout as GPT-2's config: 0.1, as the main job trains) runs
``--warmup`` steps, then ``--steps`` timed steps (the device synchronised before and after the
window only), then ``--profile-steps`` under ``torch.profiler`` (GPU kernel ms by kind). Graph
variants capture every bucket their steps need before step 0 (capture seconds, graph memory pool
bytes per bucket) and restore the weights and optimizer state the capture's warm-up steps
changed. The *parity runs* (dropout 0, so that only arithmetic differs) train ``--parity-steps``
steps of ``eager-fp32``, ``eager-bf16-static`` and the graph variants on the same data from the
same weights; each pair's per-step |loss difference| is reported, and a graph run is called
broken when it strays from its eager peer by more than bf16 noise (see ``verdict``). The host
packs the main job's ``--schedule-steps`` (2,000) batches once to count the buckets they need.

Variants run one after another in one worker process (imports and CUDA start paid once); a
variant that raises is recorded with its error and the next one runs; one that crashes the
worker or hangs past ``--variant-timeout-s`` is recorded so, and a fresh worker runs the rest.

    python benchmarks/graph_probe.py --piqa .gpudata/piqa --tokenizer .gpudata/gpt2-tokenizer \
        --out /tmp/graph-probe
    python benchmarks/graph_probe.py --tiny --out /tmp/graph-probe  # CPU: no capture (emulated)

Writes ``OUT/graph_probe_<gpu>.json`` (rewritten after every variant) and ``.md`` (printed).
``--tiny`` (CPU smoke test): the tiny shape, a few steps; graph variants run their static
buffers, warm-up, restore and replay loop without capturing (``captured: false``).
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import gc
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402

_bench.setup_paths()

#: Variant name -> how it runs (see the module docstring), in the default order: the three
#: the main comparison and parity need first, should the time run out.
VARIANTS: dict[str, dict[str, Any]] = {
    "eager-fp32": {"path": "package", "bf16": False, "graph": False},
    "eager-bf16-static": {"path": "static", "bf16": True, "graph": False, "padded": True},
    "graph-bf16-static": {"path": "static", "bf16": True, "graph": True, "padded": True},
    "eager-bf16-autocast": {"path": "package", "bf16": True, "graph": False},
    "eager-bf16-flat": {"path": "static", "bf16": True, "graph": False, "padded": False},
    "graph-fp32-static": {"path": "static", "bf16": False, "graph": True, "padded": True},
}
#: Variants that also train the parity run.
PARITY_VARIANTS = ("eager-fp32", "eager-bf16-static", "graph-bf16-static", "graph-fp32-static")
#: (run, reference) pairs of parity runs compared.
PARITY_PAIRS = (
    ("graph-bf16-static", "eager-bf16-static"),
    ("graph-bf16-static", "eager-fp32"),
    ("eager-bf16-static", "eager-fp32"),
    ("graph-fp32-static", "eager-fp32"),
)
#: The eager peer a graph run must match.
PEERS = {"graph-bf16-static": "eager-bf16-static", "graph-fp32-static": "eager-fp32"}
#: Below this |loss difference| any two runs agree (float rounding at loss ~10).
PARITY_FLOOR = 0.02
IGNORE_INDEX = -100
#: Steps each graph's capture warm-up runs on the side stream before capturing.
CAPTURE_WARMUP_ITERS = 3


# --- buckets and static batches (host only) ----------------------------------------------------


def bucket_length(n: int, policy: str) -> int:
    """The padded length of a step of ``n`` tokens: ``multiple:N`` rounds up to a multiple of N,
    ``pow2[:MIN]`` to a power of two (at least MIN, default 64)."""
    kind, _, value = policy.partition(":")
    if n < 1:
        raise ValueError(f"a step needs at least one token, got {n}")
    if kind == "multiple":
        size = int(value or 256)
        return -(-n // size) * size
    if kind == "pow2":
        return max(int(value or 64), 1 << (n - 1).bit_length())
    raise ValueError(f"unknown bucket policy {policy!r}: use multiple:N or pow2[:MIN]")


def flat_batch(rows: dict[str, Any]) -> dict[str, Any]:
    """A packed batch's real tokens as one row ``(1, n)`` (rows are filled from the left), with
    ``token_weights``: each scored token weighs ``1 / (its query's scored tokens × queries)``,
    so ``sum(weights × token nll)`` is the package's loss (the mean over queries of each query's
    mean nll; the number of queries is ``max(query_ids) + 1``, as the package counts them)."""
    import torch

    keep = rows["attention_mask"].bool()
    flat = {k: rows[k][keep][None].clone() for k in ("input_ids", "labels", "position_ids")}
    flat["query_ids"] = rows["query_ids"][keep][None].clone()
    labels, owners = flat["labels"], flat["query_ids"]
    scored = labels != IGNORE_INDEX
    num_queries = int(rows["query_ids"].max()) + 1
    counts = torch.bincount(owners[scored], minlength=num_queries).clamp(min=1).float()
    weights = torch.zeros(labels.shape, dtype=torch.float32)
    weights[scored] = 1.0 / counts[owners[scored]] / num_queries
    flat["token_weights"] = weights
    return flat


def pad_batch(flat: dict[str, Any], length: int, pad_token_id: int) -> dict[str, Any]:
    """``flat`` padded on the right to ``length``: pad tokens at position 0 (each its own
    segment: it attends only itself), label -100, query -1, weight 0."""
    import torch

    extra = length - flat["input_ids"].shape[1]
    if extra < 0:
        raise ValueError(f"cannot pad {flat['input_ids'].shape[1]} tokens to {length}")
    fill = {
        "input_ids": pad_token_id,
        "labels": IGNORE_INDEX,
        "position_ids": 0,
        "query_ids": -1,
        "token_weights": 0.0,
    }
    return {
        k: torch.cat([v, torch.full((1, extra), fill[k], dtype=v.dtype)], dim=1)
        for k, v in flat.items()
    }


def prepare_data(args: argparse.Namespace, keep: int) -> dict[str, Any]:
    """Tokenize the PIQA training pairs, pack the main job's first ``--schedule-steps`` batches
    (the buckets they need, padding), keep the first ``keep`` steps' batches for the runs."""
    import _piqa
    from transformers import AutoConfig

    from tango_fairscale.data.batches import training_batch
    from tango_fairscale.data.queries import encode_pairs
    from tango_fairscale.data.schedules import BatchSchedule
    from tango_fairscale.model.loading import load_tokenizer, set_padding_token

    started = time.perf_counter()
    examples = _piqa.examples(Path(args.piqa), "train")
    tokenizer = load_tokenizer(str(args.tokenizer))
    set_padding_token(tokenizer, AutoConfig.for_model("gpt2"))  # as ModelWrapper pads
    pad = int(tokenizer.pad_token_id)
    queries = encode_pairs(tokenizer, _piqa.training_pairs(examples), args.max_length)
    tokenized_s = time.perf_counter() - started
    schedule = BatchSchedule(len(queries), args.batch_size, args.seed)
    kept: dict[str, list[Any]] = {"rows": [], "flat": [], "padded": []}
    buckets: Counter[int] = Counter()
    shapes: Counter[str] = Counter()
    real = padded_tokens = package_tokens = 0
    pack_s = static_s = 0.0
    for step in range(max(args.schedule_steps, keep)):
        members = schedule.micro_batches(step)[0]
        begin = time.perf_counter()
        rows = training_batch([queries[i] for i in members], pad, args.max_length, packed=True)
        middle = time.perf_counter()
        flat = flat_batch(rows)
        length = bucket_length(flat["input_ids"].shape[1], args.bucket)
        padded = pad_batch(flat, length, pad)
        pack_s += middle - begin
        static_s += time.perf_counter() - middle
        if step < args.schedule_steps:
            buckets[length] += 1
            shapes["x".join(map(str, rows["input_ids"].shape))] += 1
            real += flat["input_ids"].shape[1]
            padded_tokens += length
            package_tokens += rows["input_ids"].numel()
        if step < keep:
            kept["rows"].append(rows)
            kept["flat"].append(flat)
            kept["padded"].append(padded)
    counted = max(args.schedule_steps, keep)
    return {
        **kept,
        "pad_token_id": pad,
        "schedule": {
            "steps": args.schedule_steps,
            "batch_size": args.batch_size,
            "seed": args.seed,
            "training_examples": len(queries),
            "bucket_policy": args.bucket,
            "buckets": {str(k): buckets[k] for k in sorted(buckets)},
            "n_buckets": len(buckets),
            "real_tokens_per_step": round(real / max(1, args.schedule_steps), 1),
            "static_tokens_per_step": round(padded_tokens / max(1, args.schedule_steps), 1),
            "static_padding_fraction": round(1 - real / max(1, padded_tokens), 4),
            "package_layout_tokens_per_step": round(
                package_tokens / max(1, args.schedule_steps), 1
            ),
            "package_layout_shapes": dict(shapes.most_common()),
            "host_ms_packed_batch": round(1000 * pack_s / counted, 3),
            "host_ms_flatten_pad_weights": round(1000 * static_s / counted, 3),
            "tokenize_s": round(tokenized_s, 2),
        },
    }


# --- the model and the steps (worker) ----------------------------------------------------------


def static_loss(wrapper: Any, batch: dict[str, Any]) -> Any:
    """The static loss of a flat (padded) batch: the package's graphed steps' own."""
    from tango_fairscale.parallel.graphs import static_loss as package_static_loss

    return package_static_loss(wrapper, batch)


def autocast(device: Any, bf16: bool) -> Any:
    import torch

    if not bf16:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=False)


def make_optimizer(params: list[Any], device: Any, lr: float, capturable: bool) -> Any:
    """AdamW without weight decay (the main job's); fused on a GPU (the engines' default), with a
    tensor learning rate and ``capturable`` when the update is captured."""
    import torch

    if device.type != "cuda":
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    if capturable:
        rate = torch.tensor(lr, dtype=torch.float32, device=device)
        return torch.optim.AdamW(params, lr=rate, weight_decay=0.0, fused=True, capturable=True)
    return torch.optim.AdamW(params, lr=lr, weight_decay=0.0, fused=True)


class EagerSteps:
    """``package`` (rows through ``ModelWrapper.forward``) or ``static`` (flat, padded or not)."""

    def __init__(self, wrapper: Any, device: Any, spec: dict[str, Any], data: dict[str, Any]):
        self.wrapper, self.device, self.spec = wrapper, device, spec
        self.optimizer = make_optimizer(list(wrapper.parameters()), device, data["lr"], False)
        key = "rows" if spec["path"] == "package" else "padded" if spec["padded"] else "flat"
        self.batches = data[key]

    def prepare(self, steps: int) -> dict[str, Any]:
        return {}

    def step(self, index: int, losses: Any) -> None:
        from tango_fairscale.runtime.devices import move_batch

        batch = self.batches[index]
        if self.spec["path"] == "package":  # labels and query_ids stay on the host
            with autocast(self.device, self.spec["bf16"]):
                loss = self.wrapper(**move_batch(batch, self.device))["loss"]
        else:
            moved = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
            with autocast(self.device, self.spec["bf16"]):
                loss = static_loss(self.wrapper, moved)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        losses[index].copy_(loss.detach())


class GraphSteps:
    """The static step captured once per bucket and replayed (module docstring).

    Gradients are allocated once, outside any graph, and zeroed in place at the start of each
    step; the optimizer's state is created by the first warm-up step (outside the graphs'
    memory pools). Each graph's pool holds only what lives within one step, so a replay never
    needs anything another graph left behind. Without CUDA (``--tiny``) nothing is captured: the
    same buffers, warm-up, restore and step order run eagerly.
    """

    def __init__(
        self,
        wrapper: Any,
        device: Any,
        spec: dict[str, Any],
        data: dict[str, Any],
        optimizer_in_graph: bool,
    ):
        import torch

        self.wrapper, self.device, self.spec = wrapper, device, spec
        self.capture = device.type == "cuda"
        self.in_graph = optimizer_in_graph
        self.params = [p for p in wrapper.parameters() if p.requires_grad]
        for param in self.params:
            param.grad = torch.zeros_like(param)
        self.optimizer = make_optimizer(
            self.params, device, data["lr"], capturable=self.capture and optimizer_in_graph
        )
        self.batches = data["padded"]
        self.loss_out = torch.zeros((), dtype=torch.float32, device=device)
        self.entries: dict[int, dict[str, Any]] = {}
        self.stream = torch.cuda.Stream(device) if self.capture else None

    def body(self, static: dict[str, Any], with_optimizer: bool) -> None:
        self.optimizer.zero_grad(set_to_none=False)
        with autocast(self.device, self.spec["bf16"]):
            loss = static_loss(self.wrapper, static)
        loss.backward()
        if with_optimizer:
            self.optimizer.step()
        self.loss_out.copy_(loss.detach())

    def prepare(self, steps: int) -> dict[str, Any]:
        """Capture each bucket the first ``steps`` steps use (its first batch as the example),
        then restore the weights and a fresh optimizer state (the warm-ups stepped them)."""
        import torch

        first: dict[int, int] = {}
        for index in range(steps):
            first.setdefault(self.batches[index]["input_ids"].shape[1], index)
        saved = [p.detach().clone() for p in self.params]
        records = []
        try:
            for length, index in sorted(first.items()):
                records.append(self.capture_bucket(length, self.batches[index]))
        finally:
            with torch.no_grad():
                for param, value in zip(self.params, saved):
                    param.copy_(value)
                    assert param.grad is not None
                    param.grad.zero_()
                for state in self.optimizer.state.values():
                    for value in state.values():
                        if isinstance(value, torch.Tensor):
                            value.zero_()
            if self.capture:
                torch.cuda.synchronize()
        return {
            "captured": self.capture,
            "optimizer_in_graph": self.in_graph,
            "buckets_captured": len(records),
            "captures": records,
            "capture_s_total": round(sum(r["warmup_s"] + r["capture_s"] for r in records), 3),
            "graph_pool_bytes_total": sum(r["graph_pool_bytes"] or 0 for r in records),
        }

    def capture_bucket(self, length: int, example: dict[str, Any]) -> dict[str, Any]:
        import torch

        static = {k: v.to(self.device).clone() for k, v in example.items()}
        entry: dict[str, Any] = {"static": static, "graph": None}
        record: dict[str, Any] = {"length": length, "graph_pool_bytes": None}
        begin = time.perf_counter()
        if not self.capture:
            for _ in range(CAPTURE_WARMUP_ITERS):
                self.body(static, self.in_graph)
            record.update(warmup_s=round(time.perf_counter() - begin, 3), capture_s=0.0)
            self.entries[length] = entry
            return record
        assert self.stream is not None
        torch.cuda.synchronize()
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            for _ in range(CAPTURE_WARMUP_ITERS):
                self.body(static, self.in_graph)
        torch.cuda.current_stream().wait_stream(self.stream)
        torch.cuda.synchronize()
        warmed = time.perf_counter()
        reserved = torch.cuda.memory_reserved()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=self.stream):
            self.body(static, self.in_graph)
        torch.cuda.synchronize()
        record.update(
            warmup_s=round(warmed - begin, 3),
            capture_s=round(time.perf_counter() - warmed, 3),
            graph_pool_bytes=torch.cuda.memory_reserved() - reserved,
        )
        entry["graph"] = graph
        self.entries[length] = entry
        return record

    def step(self, index: int, losses: Any) -> None:
        batch = self.batches[index]
        entry = self.entries.get(batch["input_ids"].shape[1])
        if entry is None:
            raise RuntimeError(
                f"step {index}: no graph captured for length {batch['input_ids'].shape[1]}"
            )
        static = entry["static"]
        for key, value in batch.items():
            static[key].copy_(value, non_blocking=True)
        if entry["graph"] is not None:
            entry["graph"].replay()
        else:
            self.body(static, self.in_graph)
        if not self.in_graph:
            self.optimizer.step()
        losses[index].copy_(self.loss_out)


def build_model(args: argparse.Namespace, dropout: bool, device: Any) -> Any:
    """A random GPT-2 (``ModelWrapper``: the package's fused GELU and checks), seeded."""
    from tango_fairscale.model.causal_lm import ModelWrapper

    config = _bench.gpt2_config(args.shape, n_positions=args.max_length)
    if not dropout:
        config.update(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    wrapper = ModelWrapper(config=config, tokenizer=str(args.tokenizer), seed=args.model_seed)
    wrapper.to(device)
    wrapper.train()
    return wrapper


def make_steps(
    name: str,
    args: argparse.Namespace,
    data: dict[str, Any],
    device: Any,
    dropout: bool,
    steps: int,
) -> tuple[Any, Any, dict[str, Any]]:
    """The model, its stepper (prepared for ``steps`` steps) and what preparing it recorded; a
    graph variant whose captured update fails falls back to the update outside the graph."""
    import torch

    spec = VARIANTS[name]

    def attempt(optimizer_in_graph: bool) -> tuple[Any, Any, dict[str, Any]]:
        wrapper = build_model(args, dropout, device)
        if not spec["graph"]:
            return wrapper, EagerSteps(wrapper, device, spec, data), {}
        stepper = GraphSteps(wrapper, device, spec, data, optimizer_in_graph)
        return wrapper, stepper, stepper.prepare(steps)

    try:
        return attempt(True)
    except Exception as error:  # noqa: BLE001 - the update outside the graph, both reported
        if not spec["graph"]:
            raise
        first = _bench.short_error(error, 1500)
        traceback.print_exc()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    try:
        wrapper, stepper, prepared = attempt(False)
    except Exception as error:
        raise RuntimeError(
            f"capture failed with the optimizer in the graph ({first}) and without it "
            f"({_bench.short_error(error, 1500)})"
        ) from error
    prepared["optimizer_in_graph_error"] = first
    return wrapper, stepper, prepared


def sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def timing_run(name: str, args: argparse.Namespace, data: dict[str, Any], device: Any) -> dict:
    """Warm-up, timed and profiled steps of ``name`` (dropout as configured)."""
    import torch

    cuda = device.type == "cuda"
    total = args.warmup + args.steps + args.profile_steps
    torch.manual_seed(args.seed)
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    built = time.perf_counter()
    wrapper, stepper, prepared = make_steps(name, args, data, device, True, total)
    prepare_s = time.perf_counter() - built
    losses = torch.zeros(total, dtype=torch.float32, device=device)
    for index in range(args.warmup):
        stepper.step(index, losses)
    sync(device)
    begin = time.perf_counter()
    for index in range(args.warmup, args.warmup + args.steps):
        stepper.step(index, losses)
    sync(device)
    wall_ms = 1000 * (time.perf_counter() - begin) / args.steps
    first = args.warmup + args.steps
    gpu = None
    if cuda and args.profile_steps:
        from _train_profile import kernel_time

        def run() -> None:
            for index in range(first, total):
                stepper.step(index, losses)

        gpu, _ = kernel_time(run, args.profile_steps, lambda: sync(device))
    else:
        for index in range(first, total):
            stepper.step(index, losses)
    sync(device)
    result: dict[str, Any] = {
        "step_ms": round(wall_ms, 3),
        "timed_steps": args.steps,
        "warmup_steps": args.warmup,
        "gpu_ms_per_step": gpu,
        "build_and_prepare_s": round(prepare_s, 2),
        "losses": [round(x, 5) for x in losses.tolist()],
        **prepared,
    }
    if cuda:
        result["peak_allocated_gib"] = _bench.gib(torch.cuda.max_memory_allocated())
        result["peak_reserved_gib"] = _bench.gib(torch.cuda.max_memory_reserved())
        if gpu and VARIANTS[name]["graph"] and gpu.get("busy", 0) < 0.2 * wall_ms:
            result["gpu_note"] = "the profiler saw few kernels: it may miss graph replays' kernels"
    return result


def parity_run(name: str, args: argparse.Namespace, data: dict[str, Any], device: Any) -> dict:
    """``--parity-steps`` steps of ``name`` without dropout: every step's loss."""
    import torch

    torch.manual_seed(args.seed)
    begin = time.perf_counter()
    wrapper, stepper, prepared = make_steps(name, args, data, device, False, args.parity_steps)
    losses = torch.zeros(args.parity_steps, dtype=torch.float32, device=device)
    for index in range(args.parity_steps):
        stepper.step(index, losses)
    sync(device)
    values = losses.tolist()
    result = {
        "steps": args.parity_steps,
        "seconds": round(time.perf_counter() - begin, 2),
        "losses": [round(x, 5) for x in values],
        "final_loss": round(values[-1], 5),
        "finite": all(math.isfinite(x) for x in values),
        "optimizer_in_graph": prepared.get("optimizer_in_graph"),
    }
    return result


def loss_check(args: argparse.Namespace, data: dict[str, Any], device: Any) -> dict[str, Any]:
    """The first batch's loss in fp32 without dropout or gradients: the package's forward on the
    packed rows against the static loss on the flat and on the padded batch."""
    import torch

    from tango_fairscale.runtime.devices import move_batch

    wrapper = build_model(args, False, device)
    wrapper.eval()
    with torch.no_grad():
        package = float(wrapper(**move_batch(data["rows"][0], device))["loss"])
        values = {}
        for key in ("flat", "padded"):
            moved = {k: v.to(device) for k, v in data[key][0].items()}
            values[key] = float(static_loss(wrapper, moved))
    del wrapper
    return {
        "package_loss": round(package, 6),
        "static_flat_loss": round(values["flat"], 6),
        "static_padded_loss": round(values["padded"], 6),
        "max_abs_diff": max(abs(package - v) for v in values.values()),
    }


def worker(spec_path: Path) -> int:
    """Run the variants in ``spec.json`` one after another, a result file each."""
    import torch

    spec = json.loads(spec_path.read_text())
    args = argparse.Namespace(**spec["args"])
    data = torch.load(spec["data"], weights_only=False)
    data["lr"] = args.lr
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        for key in ("flat", "padded"):  # pinned: the copies to the device are asynchronous
            data[key] = [{k: v.pin_memory() for k, v in b.items()} for b in data[key]]
    out = Path(spec["results"])
    if spec.get("loss_check"):
        try:
            check: dict[str, Any] = loss_check(args, data, device)
        except Exception as error:  # noqa: BLE001
            traceback.print_exc()
            check = {"error": _bench.short_error(error, 1500)}
        _bench.write_json(out / "loss_check.json", check)
    for name in spec["variants"]:
        path = out / f"{name}.json"
        result: dict[str, Any] = {"variant": name, "status": "started"}
        _bench.write_json(path, result)
        faulthandler.dump_traceback_later(args.variant_timeout_s, exit=True)
        print(f"== {name}", flush=True)
        began = time.perf_counter()
        for phase, run in (("timing", timing_run), ("parity", parity_run)):
            if phase == "parity" and name not in PARITY_VARIANTS:
                continue
            if phase == "parity" and not args.parity_steps:
                continue
            try:
                result[phase] = run(name, args, data, device)
            except Exception as error:  # noqa: BLE001 - record it, run the rest
                traceback.print_exc()
                result[phase] = {"error": _bench.short_error(error, 1500)}
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
            _bench.write_json(path, result)
        faulthandler.cancel_dump_traceback_later()
        result["status"] = "done"
        result["seconds"] = round(time.perf_counter() - began, 1)
        _bench.write_json(path, result)
        if cuda and not healthy():
            print(f"== the CUDA context is unusable after {name}: a fresh worker runs the rest")
            return 3
    return 0


def healthy() -> bool:
    import torch

    try:
        value = torch.ones(4, device="cuda").sum()
        torch.cuda.synchronize()
        return float(value) == 4.0
    except Exception:  # noqa: BLE001
        return False


# --- the parent: data, workers, comparison, report ---------------------------------------------


def compare(run: list[float], reference: list[float]) -> dict[str, Any]:
    n = min(len(run), len(reference))
    deltas = [abs(a - b) for a, b in zip(run[:n], reference[:n])]
    worst = max(range(n), key=deltas.__getitem__)
    window = min(50, n)
    return {
        "steps": n,
        "max_abs_delta": round(deltas[worst], 5),
        "max_at_step": worst,
        "mean_abs_delta": round(sum(deltas) / n, 5),
        "step0_abs_delta": round(deltas[0], 6),
        "final_losses": [round(run[n - 1], 5), round(reference[n - 1], 5)],
        "last50_mean_losses": [
            round(sum(run[n - window : n]) / window, 5),
            round(sum(reference[n - window : n]) / window, 5),
        ],
    }


def parity_summary(variants: dict[str, Any]) -> dict[str, Any]:
    curves = {
        name: result["parity"]["losses"]
        for name, result in variants.items()
        if "losses" in result.get("parity", {})
    }
    pairs = {
        f"{run} vs {ref}": compare(curves[run], curves[ref])
        for run, ref in PARITY_PAIRS
        if run in curves and ref in curves
    }
    noise = pairs.get("eager-bf16-static vs eager-fp32", {}).get("max_abs_delta")
    tolerance = max(PARITY_FLOOR, 2 * noise) if noise is not None else None
    verdicts = {}
    for run, peer in PEERS.items():
        pair = pairs.get(f"{run} vs {peer}")
        if run not in variants:
            continue
        if pair is None:
            verdicts[run] = f"not compared: no parity losses of {run} or of {peer}"
        elif tolerance is None:
            verdicts[run] = f"max |dloss| {pair['max_abs_delta']} (no bf16 noise reference)"
        elif pair["max_abs_delta"] <= tolerance:
            verdicts[run] = f"consistent: max |dloss| {pair['max_abs_delta']} <= {tolerance:.4f}"
        else:
            verdicts[run] = (
                f"BROKEN: max |dloss| {pair['max_abs_delta']} (step {pair['max_at_step']}) "
                f"> {tolerance:.4f} against {peer}"
            )
    return {
        "pairs": pairs,
        "bf16_noise_max_abs_delta": noise,
        "tolerance": tolerance,
        "rule": "a graph run is consistent when its max per-step |loss difference| to its eager "
        f"peer is <= max({PARITY_FLOOR}, 2 x that of eager-bf16-static to eager-fp32)",
        "verdict": verdicts,
    }


def gpu_tag(info: dict[str, Any]) -> str:
    name = info.get("gpu_name")
    if not name:
        return "cpu"
    return re.sub(r"[^a-z0-9]+", "_", name.lower().removeprefix("nvidia ")).strip("_")


def run_workers(args: argparse.Namespace, work: Path, deadline: float, report: Any) -> None:
    """Workers until every variant has a result, the time is spent, or none is left."""
    remaining = list(args.variant_list)
    first = True
    while remaining:
        left = deadline - time.time()
        if left < 20:
            for name in remaining:
                report(name, {"variant": name, "status": "skipped", "error": "budget spent"})
            return
        spec = {
            "args": vars(args) | {"piqa": str(args.piqa), "tokenizer": str(args.tokenizer)},
            "data": str(work / "data.pt"),
            "results": str(work),
            "variants": remaining,
            "loss_check": first,
        }
        spec_path = work / "spec.json"
        spec_path.write_text(json.dumps(spec, default=str))
        log = args.out / "graph_probe_worker.log"  # kept: the workers' tracebacks
        with log.open("a") as stream:
            try:
                code = subprocess.run(
                    [sys.executable, str(Path(__file__).resolve()), "--worker", str(spec_path)],
                    stdout=stream,
                    stderr=subprocess.STDOUT,
                    timeout=left,
                ).returncode
            except subprocess.TimeoutExpired:
                code = None
        first = False
        text = log.read_text()
        tail = text[-3000:]
        hung = "Timeout (" in text[-20000:]  # faulthandler's stack dump of a hung variant
        print(tail[-1500:], flush=True)
        progress = False
        for name in list(remaining):
            path = work / f"{name}.json"
            if not path.is_file():
                break
            result = json.loads(path.read_text())
            if result.get("status") != "done":  # this one crashed, hung or ran out of time
                result["status"] = "failed"
                if code is None:
                    cause = "the time budget ran out during this variant"
                elif hung:
                    cause = f"ran past --variant-timeout-s {args.variant_timeout_s:g} s"
                else:
                    cause = f"the worker exited with {code} during this variant"
                result["error"] = (
                    f"{cause} (stacks in graph_probe_worker.log); log tail: "
                    + " ".join(tail[-800:].split())
                )
            report(name, result)
            remaining.remove(name)
            progress = True
            if result["status"] == "failed":
                break
        if not progress:
            error = f"worker exited with {code} before any variant; log tail: "
            error += " ".join(tail[-800:].split())
            for name in remaining:
                report(name, {"variant": name, "status": "failed", "error": error})
            return


def summary_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    variants = result["variants"]
    base = (variants.get("eager-fp32") or {}).get("timing", {}).get("step_ms")
    rows = []
    for name, entry in variants.items():
        timing = entry.get("timing") or {}
        parity = entry.get("parity") or {}
        gpu = timing.get("gpu_ms_per_step") or {}
        step = timing.get("step_ms")
        rows.append(
            {
                "variant": name,
                "step_ms": step,
                "gpu_ms": gpu.get("busy"),
                "speedup_vs_eager_fp32": round(base / step, 2) if base and step else None,
                "peak_allocated_gib": timing.get("peak_allocated_gib"),
                "buckets_captured": timing.get("buckets_captured"),
                "capture_s": timing.get("capture_s_total"),
                "graph_pool_gib": _bench.gib(timing.get("graph_pool_bytes_total"))
                if timing.get("captured")
                else None,
                "optimizer_in_graph": timing.get("optimizer_in_graph"),
                "parity_final_loss": parity.get("final_loss"),
                "error": entry.get("error") or timing.get("error") or parity.get("error"),
            }
        )
    return rows


def markdown(result: dict[str, Any]) -> str:
    env = result["environment"]
    sched = result["schedule"]
    lines = [
        f"# CUDA-graph probe: GPT-2 {result['settings']['shape']}, PIQA batch "
        f"{sched['batch_size']} packed, one GPU",
        "",
        f"Commit {env.get('commit')}, {env.get('gpu_name') or 'CPU'}, torch {env.get('torch')}, "
        f"{(env.get('timestamp_utc') or '')[:10]}"
        + (
            " — `--tiny` CPU smoke test: no capture, figures check the plumbing only"
            if result["settings"]["tiny"]
            else ""
        ),
        "",
        "| variant | step ms | GPU kernel ms | x eager-fp32 | peak GiB | buckets | capture s | "
        "graph pool GiB | opt. in graph | parity final loss | error |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|",
    ]
    for row in summary_rows(result):
        cells = [
            f"`{row['variant']}`",
            *(
                "–" if row[k] is None else str(row[k])
                for k in (
                    "step_ms",
                    "gpu_ms",
                    "speedup_vs_eager_fp32",
                    "peak_allocated_gib",
                    "buckets_captured",
                    "capture_s",
                    "graph_pool_gib",
                    "optimizer_in_graph",
                    "parity_final_loss",
                )
            ),
            (row["error"] or "")[:300].replace("|", "/"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    parity = result.get("parity") or {}
    lines += [
        "",
        f"Parity ({result['settings']['parity_steps']} steps, dropout 0): "
        + parity.get("rule", ""),
    ]
    for pair, figures in (parity.get("pairs") or {}).items():
        lines.append(
            f"- {pair}: max |dloss| {figures['max_abs_delta']} (step {figures['max_at_step']}), "
            f"mean {figures['mean_abs_delta']}, step 0 {figures['step0_abs_delta']}, final "
            f"{figures['final_losses'][0]} vs {figures['final_losses'][1]}"
        )
    for run, verdict in (parity.get("verdict") or {}).items():
        lines.append(f"- **{run}**: {verdict}")
    check = result.get("loss_check") or {}
    lines += [
        "",
        f"Static loss check (first batch, fp32, eval): package {check.get('package_loss')}, "
        f"flat {check.get('static_flat_loss')}, padded {check.get('static_padded_loss')} "
        f"(max diff {check.get('max_abs_diff')}){' ' + check['error'] if 'error' in check else ''}",
        "",
        f"Schedule ({sched['steps']} steps, `{sched['bucket_policy']}`): {sched['n_buckets']} "
        f"buckets {sched['buckets']}; real tokens/step {sched['real_tokens_per_step']}, static "
        f"{sched['static_tokens_per_step']} (padding {100 * sched['static_padding_fraction']:.1f} "
        f"%), package layout {sched['package_layout_tokens_per_step']}; host ms per batch: "
        f"packing {sched['host_ms_packed_batch']}, flatten + pad + weights "
        f"{sched['host_ms_flatten_pad_weights']}",
    ]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--piqa", type=Path, default=os.environ.get("PIQA_DIR"))
    parser.add_argument("--tokenizer", type=Path, default=os.environ.get("TOKENIZER_DIR"))
    parser.add_argument("--shape", default="124m", choices=sorted(_bench.SHAPES))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=42, help="data order (the main job's)")
    parser.add_argument("--model-seed", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--max-length", type=int, default=1024)
    parser.add_argument("--bucket", default="multiple:256", help="multiple:N or pow2[:MIN]")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--steps", type=int, default=150, help="timed steps")
    parser.add_argument("--profile-steps", type=int, default=10)
    parser.add_argument("--parity-steps", type=int, default=300)
    parser.add_argument("--schedule-steps", type=int, default=2000)
    parser.add_argument("--variant-timeout-s", type=float, default=150)
    parser.add_argument(
        "--budget-s", type=float, help="seconds for the whole probe (default 225; --tiny 900)"
    )
    parser.add_argument("--commit")
    parser.add_argument("--out", type=Path, default=Path("/tmp/graph-probe"))
    parser.add_argument("--tiny", action="store_true", help="CPU smoke test (module docstring)")
    args = parser.parse_args(argv)
    if args.worker:
        return args
    shared = _bench.REPO_ROOT.parent / "shared" / "data"
    defaults = {"piqa": ".gpudata/piqa", "tokenizer": ".gpudata/gpt2-tokenizer"}
    for key, name in (("piqa", "piqa"), ("tokenizer", "gpt2-tokenizer")):
        if getattr(args, key) is None:
            setattr(args, key, _bench.REPO_ROOT / defaults[key])
        if args.tiny and not getattr(args, key).is_dir() and (shared / name).is_dir():
            setattr(args, key, shared / name)
    if args.tiny:  # CPU: a step of 16 examples computes 16 x 50k logits per token
        args.shape, args.batch_size = "tiny", 4
        args.warmup, args.steps, args.profile_steps = 2, 4, 0
        args.parity_steps = min(args.parity_steps, 12)
    if args.budget_s is None:
        args.budget_s = 900 if args.tiny else 225
    if not (Path(args.piqa) / "train.jsonl").is_file():
        raise SystemExit(f"--piqa {args.piqa} holds no train.jsonl (official PIQA files)")
    if not Path(args.tokenizer).is_dir():
        raise SystemExit(f"--tokenizer {args.tokenizer} is not a directory")
    args.variant_list = [v for v in args.variants.split(",") if v]
    unknown = [v for v in args.variant_list if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    bucket_length(1, args.bucket)  # refuses a bad policy now
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker(args.worker)
    import torch

    started = time.time()
    deadline = started + args.budget_s
    keep = max(args.warmup + args.steps + args.profile_steps, args.parity_steps)
    data = prepare_data(args, keep)
    settings = {
        k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "worker"
    }
    result: dict[str, Any] = {
        "benchmark": "graph_probe",
        "settings": settings,
        "schedule": data.pop("schedule"),
        "variants": {},
        "descriptions": {name: describe(name) for name in args.variant_list},
        "notes": NOTES,
        "environment": _bench.environment(args.commit, query_gpu=False),
    }
    if not torch.cuda.is_available():
        result["notes"] = NOTES + ["no CUDA device: graph variants ran without capture"]
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "graph_probe_pending"

    def report(name: str, variant: dict[str, Any]) -> None:
        result["variants"][name] = variant
        result["parity"] = parity_summary(result["variants"])
        _bench.write_json(args.out / f"{stem}.json", result)

    (args.out / "graph_probe_worker.log").unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="graph-probe-") as folder:
        work = Path(folder)
        torch.save(data, work / "data.pt")
        run_workers(args, work, deadline, report)
        check = work / "loss_check.json"
        result["loss_check"] = json.loads(check.read_text()) if check.is_file() else None
    result["environment"].update(_bench.gpu_info())
    result["parity"] = parity_summary(result["variants"])
    result["summary"] = summary_rows(result)
    result["wall_s"] = round(time.time() - started, 1)
    final = f"graph_probe_{gpu_tag(result['environment'])}"
    _bench.write_json(args.out / f"{final}.json", result)
    (args.out / f"{stem}.json").unlink(missing_ok=True)
    text = markdown(result)
    _bench.write_text(args.out / f"{final}.md", text)
    print(text)
    return 0


def describe(name: str) -> str:
    spec = VARIANTS[name]
    precision = "bf16 autocast" if spec["bf16"] else "fp32"
    if spec["path"] == "package":
        return f"ModelWrapper.forward on the packed rows, the package's loss, {precision}"
    layout = "one row padded to its bucket" if spec["padded"] else "one row, unpadded"
    how = "captured per bucket, replayed" if spec["graph"] else "eager"
    return f"{layout}, block-diagonal mask, static weighted cross-entropy, {precision}, {how}"


NOTES = [
    "bare model, world size 1, no engine wrapper; AdamW lr 1e-5, no weight decay, fused on GPUs",
    "the package's loss is not captured (nonzero: data-dependent shape; host read of the "
    "query count); the static variants use a weighted cross-entropy over every position that "
    "equals it (loss_check), eager and captured alike",
    "batches are built on the host before the runs (not timed); the static ones are pinned",
    "timing runs keep GPT-2's dropout (0.1); parity runs set it to 0",
]


if __name__ == "__main__":
    sys.exit(main())
