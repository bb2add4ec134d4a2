"""index.py's key figures: one line per result, from the JSON of the script that wrote it."""

from __future__ import annotations

import re
from typing import Any


def train_speed_figure(data: dict[str, Any]) -> str:
    rows = [r for r in data.get("results", []) if "error" not in r]
    checks = [c for c in data.get("target_checks") or [] if c.get("status") == "measured"]
    if checks:
        return "; ".join(
            f"`{c['target']}` vs `{c['compare_to']}`, {c['world_size']} GPU(s): memory "
            f"{times(c['peak_allocated_ratio'])}, throughput {times(c['tokens_per_s_ratio'])}"
            for c in checks
        )
    peaks = [r for r in rows if r.get("memory_at_peak")]
    if peaks:  # --memory-peak: what each run held at its peak
        return "; ".join(
            f"`{r['config']}` peak {r['memory_at_peak']['peak_gib']:.2f} GiB "
            f"({r['memory_at_peak']['baseline_gib']:.2f} before the steps), made by "
            f"`{r['memory_at_peak']['peak_made_by']}`"
            for r in peaks
        )
    pipes = [e for e in data.get("pipe_analysis") or [] if e.get("measured_efficiency")]
    if pipes:
        best = max(pipes, key=lambda e: e["measured_efficiency"])
        return (
            f"{best['shape']} `{best['config']}`: efficiency {best['measured_efficiency']:.2f} "
            f"of {best['stages']} GPUs, largest device "
            f"{times(best.get('max_device_peak_allocated_vs_single'))} one GPU's memory"
        )
    parts = []
    for shape in dict.fromkeys(r["shape"] for r in rows):
        group = [r for r in rows if r["shape"] == shape]
        if data.get("settings", {}).get("data") == "piqa":
            best = max(group, key=lambda r: r.get("tokens_per_s_vs_compare") or 0)
            parts.append(
                f"{shape}: `{best['config']}` {best.get('tokens_per_s_vs_compare') or 0:.2f}x "
                f"`{best.get('compare_to')}` tokens/s"
            )
            continue
        best = max(group, key=lambda r: r.get("mfu") or 0)
        text = f"{shape}: `{best['config']}` {100 * best['mfu']:.1f} % MFU"
        if best.get("tokens_per_s_vs_baseline") and best.get("baseline") != best["config"]:
            text += f" ({best['tokens_per_s_vs_baseline']:.2f}x `{best['baseline']}`)"
        parts.append(text + fairscale_vs_fsdp2(group))
    return "; ".join(parts) or "no configuration measured"


def times(ratio: float | None) -> str:
    return "–" if ratio is None else f"{ratio:.2f}x"


def fairscale_vs_fsdp2(rows: list[dict[str, Any]]) -> str:
    """``, FairScale/FSDP2 1.02x`` when both engines ran the same settings."""
    by_config = {r["config"]: r for r in rows}
    for config, row in by_config.items():
        if config.startswith("fairscale-"):
            other = by_config.get("fsdp2-" + config[len("fairscale-") :])
            if other and other.get("tokens_per_s_per_gpu"):
                ratio = row["tokens_per_s_per_gpu"] / other["tokens_per_s_per_gpu"]
                return f", FairScale/FSDP2 {ratio:.2f}x"
    return ""


def eval_speed_figure(data: dict[str, Any]) -> str:
    entries = [("fp32, batch " + str(r["batch_size"]), r) for r in data.get("batch_sizes") or []]
    entries += [(r["variant"], r) for r in data.get("variants") or []]
    entries += [
        (f"{r['precision']}, {r['max_batch_tokens']} tokens, {r.get('layout', 'padded')}", r)
        for r in data.get("token_budgets") or []
    ]
    if not entries:
        return "nothing measured"
    label, best = max(entries, key=lambda e: e[1]["step_queries_per_s"])
    return f"{best['step_queries_per_s']:,.0f} queries/s ({label})"


def precision_figure(data: dict[str, Any]) -> str:
    comparison = data.get("comparison") or {}
    window = (data.get("settings") or {}).get("final_window")
    parts = [
        f"{name} {100 * c['rel_diff_final_loss']:.2f} % at the last step "
        f"({100 * c[f'rel_diff_mean_last_{window}']:.2f} % over the last {window})"
        for name, c in comparison.items()
        if isinstance(c, dict)
    ]
    runs = [r for r in data.get("runs", []) if "error" not in r]
    nonfinite = any(r.get("any_nonfinite") for r in runs)
    skipped = sum(r.get("num_skipped_steps") or 0 for r in runs)
    return (
        "final loss vs fp32: " + ", ".join(parts)
        + f"; {'non-finite losses' if nonfinite else 'no non-finite loss'}, {skipped} skipped"
    )  # fmt: skip


def max_model_figure(data: dict[str, Any]) -> str:
    parts = []
    for world in sorted({s["world_size"] for s in data.get("searches", [])}):
        trained = [
            s for s in data["searches"] if s["world_size"] == world and s["largest_trained_params"]
        ]
        if trained:
            best = max(trained, key=lambda s: s["largest_trained_params"])
            parts.append(
                f"{world} GPU(s): {best['largest_trained_params'] / 1e9:.2f}B (`{best['config']}`)"
            )
    return "; ".join(parts) or "nothing trained"


def multinode_figure(data: dict[str, Any]) -> str:
    diffs = [r.get("max_abs_weight_diff") for r in data.get("runs", [])]
    measured = [d for d in diffs if d is not None]
    if not measured:
        return "no weights compared"
    return f"largest weight difference to one node: {max(measured):g} ({len(measured)} launches)"


def lm_eval_speed_figure(data: dict[str, Any]) -> str:
    parts = [_lm_eval_ratio(suite, ratio) for suite, ratio in (data.get("ratios") or {}).items()]
    # A suite that ran without a ratio: one of the tools gave no rate.
    missing = sorted({run["suite"] for run in data.get("runs", [])} - set(data.get("ratios") or {}))
    parts += [f"{suite}: no same-run ratio" for suite in missing]
    return "; ".join(parts) or "no comparison measured"


def _lm_eval_ratio(suite: str, ratio: dict[str, Any]) -> str:
    """One suite's ratios: each figure a dict with its goal, or (earlier files) two numbers."""
    if not isinstance(ratio.get("scoring", 0.0), dict):
        return (
            f"{suite}: scoring {ratio['scoring']:.1f}x lm-eval's requests/s, command "
            f"{ratio['command']:.1f}x faster"
        )
    names = {
        "scoring": ("scoring", "package_over_lm_eval"),
        "command_first_model": ("command", "lm_eval_over_package"),
        "command_second_model": ("second model's command", "lm_eval_over_package"),
        "command_checkpoint_in_one_command": (
            "a checkpoint more in one command",
            "lm_eval_over_package",
        ),
    }
    shown = [
        f"{names[key][0]} {figure[names[key][1]]:.2f}x (goal {figure['goal']})"
        for key, figure in ratio.items()
        if key in names
    ]
    return f"{suite}: " + ", ".join(shown)


def generation_speed_figure(data: dict[str, Any]) -> str:
    ratio = data.get("ratios")
    if not ratio:
        return "no same-run comparison"
    return (
        f"generation {ratio['generation_throughput']:.1f}x lm-eval's tokens/s "
        f"(`{ratio['package']}` vs `{ratio['lm_eval']}`), command {ratio['command']:.1f}x faster"
    )


def torch_train_speed_figure(data: dict[str, Any]) -> str:
    rates = {r["step"]: r.get("tokens_per_s") for r in data.get("runs", [])}
    ratio = data.get("ratio_ours_to_torch_train")
    shown = ", ".join(f"`{step}` {rate:,.0f} tokens/s" for step, rate in rates.items() if rate)
    if ratio:
        return f"{shown} ({ratio:.2f}x)"
    return f"{shown}; no same-run comparison" if shown else "no run measured"


def main_job_figure(data: dict[str, Any]) -> str:
    runs = data.get("variants", {})
    parts = [
        f"`{name}` {run['wall_s']:.0f} s, {run.get('step_ms_mean', 0):.1f} ms a step, GPU busy "
        f"{run.get('gpu_busy_pct_step_loop')} % in the loop"
        for name, run in runs.items()
        if run.get("wall_s")
    ]
    gap = data.get("loss_curve_vs_ddp_fp32")
    if gap:
        parts.append(
            f"losses within {100 * gap['max_relative_gap']:.1f} % of `ddp-fp32`'s "
            f"({gap['window_steps']}-step means)"
        )
    return "; ".join(parts) or "no run measured"


def graph_probe_figure(data: dict[str, Any]) -> str:
    rows = {r["variant"]: r for r in data.get("summary", [])}
    parts = [
        f"`{name}` {row['step_ms']:.1f} ms a step ({row.get('speedup_vs_eager_fp32') or 0:.2f}x "
        "`eager-fp32`)"
        for name, row in rows.items()
        if name.startswith("graph-") and row.get("step_ms")
    ]
    verdict = (data.get("parity") or {}).get("verdict", {}).get("graph-bf16-static")
    if verdict:
        parts.append(f"parity: {verdict.split(':')[0]}")
    return "; ".join(parts) or "no graph variant measured"


def scoring_events_figure(data: dict[str, Any]) -> str:
    parts = [
        f"{p['model']} model {p['task']}: {p['pass_s']:.2f} s, "
        + (f"kernels {p['kernel_busy_pct']} %, " if "kernel_busy_pct" in p else "")
        + f"GPU in forwards {p['event_busy_pct']} %, idle {p['gpu_idle_before_first_ms']:.0f} ms "
        f"before the first, {p['gpu_idle_after_last_ms']:.0f} ms after the last"
        for p in data.get("passes", [])
    ]
    return "; ".join(parts) or "no pass measured"


def cross_entropy_probe_figure(data: dict[str, Any]) -> str:
    parts = [
        f"{r['rows']} rows {r['form']} {r['ms']:.2f} ms"
        for r in data.get("cross_entropy", []) + data.get("accumulation", [])
    ]
    return "; ".join(parts) or "no form measured"


def checkpoint_write_probe_figure(data: dict[str, Any]) -> str:
    rates = ", ".join(f"{name} {rate} GB/s" for name, rate in data.get("gb_per_s", {}).items())
    return f"{data.get('state_gb')} GB: {rates}; SHA-256 alone {data.get('sha256_gb_per_s')} GB/s"


FIGURES = {
    "main_job": main_job_figure,
    "train_speed": train_speed_figure,
    "eval_speed": eval_speed_figure,
    "precision_run": precision_figure,
    "max_model": max_model_figure,
    "multinode": multinode_figure,
    "lm_eval_speed": lm_eval_speed_figure,
    "generation_speed": generation_speed_figure,
    "torch_train_speed": torch_train_speed_figure,
    "graph_probe": graph_probe_figure,
    "scoring_events": scoring_events_figure,
    "cross_entropy_probe": cross_entropy_probe_figure,
    "checkpoint_write_probe": checkpoint_write_probe_figure,
}


def results_table_figure(text: str) -> str | None:
    """``tango-fairscale results``' table (the e2e suite): acc per run."""
    lines = text.splitlines()
    # The runs table, then (newer layouts) the tasks table: the first header naming acc.
    header = next(
        (i for i, line in enumerate(lines) if line.startswith("run ") and " acc " in line), None
    )
    if header is None:
        return None
    names = re.split(r"\s{2,}", lines[header].strip())  # values hold single spaces ("0.5 ± 0.1")
    accs = []
    for line in lines[header + 2 :]:
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) != len(names):
            break
        accs.append(f"{cells[0]} {cells[names.index('acc')].split()[0]}")
    return "acc " + ", ".join(accs) if accs else None
