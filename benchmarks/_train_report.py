"""train_speed.py's report: the Markdown beside the JSON, and one line per configuration.

The main table (step time, tokens/s per GPU, MFU, peak memory, ratios to the same-run baselines),
then the target check, the pipeline section (:mod:`_train_pipe`) and, for profiled runs, where
the GPU time and the host time of a step go.
"""

from __future__ import annotations

from typing import Any

import _bench
from _train_pipe import pipe_markdown

#: Timed steps of one fixed batch whose slowest is this much slower than the fastest: the run met
#: the GPU machine at two speeds (H200 machines were seen to switch every configuration, eager
#: ones too, mid-process), so a ratio to another run may compare the machine's states.
UNSTEADY_RATIO = 1.15
#: Functions per configuration in the Markdown's cProfile table (the JSON holds more).
HOST_PROFILE_ROWS = 12
#: What the result's numbers mean, recorded in every result's settings.
SETTINGS_NOTES = {
    "batch_size_meaning": "per GPU (each rank gets its own batch_size x seq_len tokens)",
    "timing": "cuda.synchronize before and after each step; median of the steps after "
    "warmup (rank 0); the step is forward_train + backward + step",
    "data_description": {
        "piqa": "PIQA training examples: BatchSchedule(seed) global batch of batch_size x "
        "world_size, rank r's slice; the correct answer's (context, continuation) pair, "
        "encode_pairs + training_batch (packed for -packed configs; built inside the timed step)",
        "synthetic": "fixed random token ids, labels = inputs (every position scored)",
    },
    "tokens_counted": "positions the model reads (a padded row's input_ids[:, :-1], a "
    "packed row whole); real = attention_mask 1, padded = rows x positions",
    "engine": "Lazy(TrainingEngine, Params(engine_params)) as a config file gives it: "
    "type tango_fairscale::ENGINE, precision, sharding / compile / pipe fields, optimizer",
    "pipe_description": "pipe-PRECISION[-cN][-ckpt-MODE][-bA_B]: the pipe engine in ONE "
    "process (world size 1) over pipe_devices_resolved, balance automatic (parameter "
    "count) or A_B blocks, chunks N (default 4), checkpoint MODE (default except_last); "
    "batch_size = rows of the whole pipe's batch; tokens/s per GPU = whole-pipe "
    "tokens/s / stages",
    "pipe_efficiency": "pipe tokens/s / (stages x single-GPU tokens/s), single GPU = "
    "DDP (bare model) at world size 1, same shape, batch and precision, in this run",
    "pipe_bubble_formula": "(S - 1) / (M + S - 1), S stages, M micro-batches",
}


def fmt(value: Any, spec: str = "") -> str:
    return "–" if value is None else format(value, spec)


def markdown(report: dict[str, Any]) -> str:
    lines = header(report)
    lines += main_table(report)
    lines += target_markdown(report.get("target_checks") or [])
    if report.get("pipe_analysis"):
        lines += pipe_markdown(report["pipe_analysis"])
    lines += gpu_time_markdown(report["results"])
    lines += top_kernels_markdown(report["results"])
    lines += host_time_markdown(report["results"])
    lines += memory_peak_markdown(report["results"])
    lines += timeline_markdown(report["results"])
    if any("root" in (r.get("modifiers") or []) for r in report["results"]):
        lines += [
            "",
            "`root`: `modules_to_wrap: []`, the whole model one FSDP unit (catwalk's setting).",
        ]
    return "\n".join(lines) + "\n"


def header(report: dict[str, Any]) -> list[str]:
    env = report["environment"]
    settings = report["settings"]
    piqa = settings.get("data") == "piqa"
    compare_to = settings.get("compare_to")
    if piqa:
        data = (
            "PIQA training examples (correct answer only, tokenized as the training step does, "
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
    if settings.get("dropout") is not None:
        data += f"; every dropout of the model {settings['dropout']} (GPT-2's own: 0.1)"
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
    return lines + [""]


def main_table(report: dict[str, Any]) -> list[str]:
    piqa = report["settings"].get("data") == "piqa"
    compare_to = report["settings"].get("compare_to")
    head = ["world", "shape", "config", "batch", "step ms", "tokens/s/GPU"]
    align = ["---:", "---", "---", "---:", "---:", "---:"]
    if piqa:
        head += ["median step ms", "padded tok/s/GPU", "pad %"]
        align += ["---:", "---:", "---:"]
    head += ["x base"] + ([f"x {compare_to}"] if compare_to else [])
    head += ["MFU %", "peak alloc GiB", "x base"] + ([f"x {compare_to}"] if compare_to else [])
    align += ["---:"] * (4 + 2 * bool(compare_to))
    head += ["per GPU", "peak reserved GiB", "units", "base", "note"]
    align += ["---", "---:", "---:", "---", "---"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    for r in report["results"]:
        cells = [str(r["world_size"]), r["shape"], r["config"], str(r["batch_size"])]
        if "error" in r:
            note = r["error"] + (f": {r['message'][:80]}" if r.get("message") else "")
            cells += ["–"] * (len(head) - len(cells) - 2) + [r.get("baseline") or "–", note]
            lines.append("| " + " | ".join(cells) + " |")
            continue
        lines.append("| " + " | ".join(cells + row_cells(r, piqa, compare_to)) + " |")
    if piqa:
        lines += [
            "",
            "`step ms`: mean over the timed steps (batches differ in length; a step with a new "
            "batch shape can take 0.2-6 s of kernel selection or recompilation, so the mean "
            "depends on how many shapes the run met); `median step ms`: the typical step.",
        ]
    return lines


def row_cells(r: dict[str, Any], piqa: bool, compare_to: str | None) -> list[str]:
    """A measured row's cells after world, shape, config and batch."""
    note = "; ".join(
        text for text in ("" if r["losses_finite"] else "non-finite loss", unsteady_note(r)) if text
    )
    mfu = None if r.get("mfu") is None else 100 * r["mfu"]
    step = r["step_time_s_mean"] if piqa else r["step_time_s_median"]
    cells = [f"{1000 * step:.1f}", f"{r['tokens_per_s_per_gpu']:,.0f}"]
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
    return cells + [
        "/".join(f"{x:.2f}" for x in per_gpu) if per_gpu else "–",
        fmt(r.get("peak_reserved_gib"), ".2f"),
        fmt(r.get("fsdp_units")),
        r.get("baseline") or "–",
        note,
    ]


def target_markdown(checks: list[dict[str, Any]]) -> list[str]:
    """Each ``--target`` against ``--compare-to``: memory and throughput, met or not."""
    lines: list[str] = []
    for target in dict.fromkeys(c["target"] for c in checks):
        mine = [c for c in checks if c["target"] == target]
        other = mine[0]["compare_to"]
        memory_target, throughput_target = mine[0]["memory_target"], mine[0]["throughput_target"]
        lines += [
            "",
            f"## Target: `{target}` vs `{other}` at the same batch",
            "",
            f"Peak memory allocated per GPU (max over ranks) at most {memory_target:.3f}x, "
            f"tokens/s per GPU at least {throughput_target:.2f}x.",
            "",
            f"| world | shape | batch | peak alloc GiB ({target} / {other}) | memory ratio | "
            f"reserved ratio | tokens/s/GPU ({target} / {other}) | throughput ratio | memory | "
            "throughput |",
            "|---:|---|---:|---|---:|---:|---|---:|---|---|",
        ]
        lines += [_target_row(c) for c in mine]
    return lines


def _target_row(c: dict[str, Any]) -> str:
    def verdict(met: Any) -> str:
        return "–" if met is None else ("**met**" if met else "**not met**")

    head = f"| {c['world_size']} | {c['shape']} | {c['batch_size']} "
    if c["status"] != "measured":
        return head + f"| – | – | – | – | – | {c['status']} | – |"
    return (
        head + f"| {fmt(c['peak_allocated_gib'], '.2f')} / "
        f"{fmt(c['compare_peak_allocated_gib'], '.2f')} "
        f"| {fmt(c['peak_allocated_ratio'], '.3f')} "
        f"| {fmt(c['peak_reserved_ratio'], '.3f')} "
        f"| {c['tokens_per_s_per_gpu']:,.0f} / {c['compare_tokens_per_s_per_gpu']:,.0f} "
        f"| {fmt(c['tokens_per_s_ratio'], '.3f')} | {verdict(c['memory_met'])} "
        f"| {verdict(c['throughput_met'])} |"
    )


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


def top_kernels_markdown(rows: list[dict[str, Any]]) -> list[str]:
    """The ``--profile-steps`` section's second part: each profiled run's costliest kernels."""
    profiled = [r for r in rows if r.get("top_kernels")]
    if not profiled:
        return []
    lines = ["", "## The kernels that take the most GPU time (profiled steps)"]
    for r in profiled:
        lines += [
            "",
            f"**{r['shape']} `{r['config']}`, batch {r['batch_size']}, world {r['world_size']}**",
            "",
            "| kernel | kind | ms per step | launches per step |",
            "|---|---|---:|---:|",
        ]
        lines += [
            f"| `{k['name']}` | {k['kind']} | {k['ms']:.2f} | {k['calls']:g} |"
            for k in r["top_kernels"]
        ]
    return lines


def host_time_markdown(rows: list[dict[str, Any]]) -> list[str]:
    """The ``--cprofile-steps`` section: which Python functions take each profiled step."""
    profiled = [r for r in rows if r.get("host_profile")]
    if not profiled:
        return []
    lines = [
        "",
        "## Where the host time goes (cProfile)",
        "",
        "Steps run after the timed ones under Python's `cProfile` (rank 0; profiling slows "
        "Python, so the wall time is an upper bound). Functions by cumulative ms per step "
        "(their callees included, so rows nest); the JSON also lists them by own time.",
    ]
    for r in profiled:
        host = r["host_profile"]
        lines += [
            "",
            f"**{r['shape']} `{r['config']}`, batch {r['batch_size']}, world {r['world_size']}**: "
            f"{host['wall_ms']:.1f} ms per step under cProfile",
            "",
            "| function | calls per step | cumulative ms | own ms |",
            "|---|---:|---:|---:|",
        ]
        for f in host["by_cumulative_time"][:HOST_PROFILE_ROWS]:
            lines.append(
                f"| `{f['function']}` | {f['calls']:g} | {f['cumulative_ms']:.2f} "
                f"| {f['own_ms']:.2f} |"
            )
    return lines


def timeline_markdown(rows: list[dict[str, Any]]) -> list[str]:
    """The ``--timeline-steps`` section: the same batches timed with and without a
    synchronisation at each step's start and end."""
    timed = [r for r in rows if r.get("mfu_timeline") is not None]
    if not timed:
        return []
    lines = [
        "",
        "## Steps as the training loop runs them (`--timeline-steps`)",
        "",
        "The timed steps' batches again, without synchronising between steps (the host runs "
        "ahead of the GPU, as in the training loop): each step's mean time on the GPU's "
        "timeline (CUDA events), against the synchronised steps' mean above. Synchronising "
        "each step adds the host's work before the step's first kernel to every step.",
        "",
        "| world | shape | config | batch | synchronised ms | timeline ms | MFU % synchronised "
        "| MFU % timeline |",
        "|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in timed:
        synced_s, timeline_s = r["step_time_s_mean"], r["timeline_step_time_s_mean"]
        lines.append(
            f"| {r['world_size']} | {r['shape']} | {r['config']} | {r['batch_size']} | "
            f"{1000 * synced_s:.1f} | {1000 * timeline_s:.1f} | "
            f"{100 * r['mfu_synchronised_mean']:.1f} | "
            f"{100 * r['mfu_timeline']:.1f} |"
        )
    return lines


def memory_peak_markdown(rows: list[dict[str, Any]]) -> list[str]:
    """The ``--memory-peak`` section: what each run's steps held at their peak."""
    recorded = [r for r in rows if r.get("memory_at_peak")]
    if not recorded:
        return []
    lines = [
        "",
        "## What the steps hold at their peak (`--memory-peak`)",
        "",
        "The allocator's history over the timed steps, replayed to the moment the most was "
        "allocated: the baseline (weights, optimizer state, what the steps keep between them), "
        "then what was alive on top of it, by the package line that allocated it.",
    ]
    for r in recorded:
        peak = r["memory_at_peak"]
        lines += [
            "",
            f"### {r['config']} (world {r['world_size']}): peak {fmt(peak['peak_gib'])} GiB = "
            f"baseline {fmt(peak['baseline_gib'])} + {fmt(peak['added_at_peak_gib'])} GiB; "
            f"the peak's allocation: `{peak['peak_made_by']}`",
            "",
            "| allocated by | MiB | tensors |",
            "|---|---|---|",
        ]
        lines += [
            f"| `{g['where']}` | {fmt(g['mib'])} | {g['tensors']} |" for g in peak["alive_at_peak"]
        ]
        if peak.get("around_peak"):
            lines += ["", "Around the peak (`>`: the peak's allocation):", "", "```"]
            lines += [*peak["around_peak"], "```"]
    return lines


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
