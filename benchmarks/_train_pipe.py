"""train_speed.py's pipeline section: every ``pipe`` run against one GPU, and what explains it.

A pipe run (one process, S stages, each batch of B rows cut into M micro-batches) is set against
the DDP run at world size 1 with the same shape, batch and precision (the bare model on one GPU):
efficiency = pipe tokens/s / (S x one-GPU tokens/s), next to the GPipe bubble (S - 1) / (M + S - 1)
and a prediction from the bubble, the stages' FLOP balance and recomputation.
"""

from __future__ import annotations

from typing import Any

import _bench
from _train_compare import ratio

#: Forward share of a training step's compute (forward 1 unit, backward 2): what recomputing a
#: checkpointed micro-batch's forward adds, relative to its forward + backward.
RECOMPUTE_SHARE = 1 / 3


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
            max_device_peak_allocated_vs_single=ratio(row, base, "peak_allocated_gib"),
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
