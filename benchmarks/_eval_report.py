"""eval_speed.py's report: the summary against the target, and the Markdown beside the JSON."""

from __future__ import annotations

from typing import Any

import _bench

#: PIQA validation queries per second the scoring path must reach (GPT-2 124M, one H200).
TARGET_QUERIES_PER_S = 20_000
#: The catwalk integration's scoring speed on the same task, for scale.
EARLIER_QUERIES_PER_S = 260


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    rows = report.get("batch_sizes") or []
    if not rows:
        return {}
    best = max(rows, key=lambda r: r["step_queries_per_s"])
    summary: dict[str, Any] = {
        "best_step_queries_per_s": best["step_queries_per_s"],
        "best_step_batch_size": best["batch_size"],
        "best_score_only_queries_per_s": max(r["score_only_queries_per_s"] for r in rows),
        "best_forward_only_queries_per_s": max(r["forward_only_queries_per_s"] for r in rows),
        "tokenize_only_queries_per_s": report["tokenize"]["queries_per_s_warm"],
    }
    for variant in report.get("variants") or []:
        key = f"{variant['variant']}_step_queries_per_s"
        summary[key] = variant["step_queries_per_s"]
    fastest = max(
        [best["step_queries_per_s"]]
        + [v["step_queries_per_s"] for v in report.get("variants") or []]
        + [v["step_queries_per_s"] for v in report.get("token_budgets") or []]
    )
    summary["fastest_step_queries_per_s"] = fastest
    summary["target_met"] = fastest >= TARGET_QUERIES_PER_S
    summary["shortfall_factor"] = round(TARGET_QUERIES_PER_S / fastest, 2)
    if "one_at_a_time" in report:
        summary["speedup_vs_one_at_a_time"] = round(
            best["step_queries_per_s"] / report["one_at_a_time"]["queries_per_s"], 1
        )
    return summary


def one_line(entry: dict[str, Any]) -> str:
    return (
        f"step {entry['step_s']:.3f} s = {entry['step_queries_per_s']:,.0f} q/s; score only "
        f"{entry['score_only_queries_per_s']:,.0f} q/s; forward only "
        f"{entry['forward_only_queries_per_s']:,.0f} q/s; acc {entry['acc']:.4f}"
    )


def markdown(report: dict[str, Any]) -> str:
    env = report["environment"]
    data = report.get("data", {})
    model = report["model"]
    lines = [
        f"# PIQA validation scoring speed: {env.get('gpu_name') or 'CPU'}, commit "
        f"{str(env.get('commit'))[:12]}, torch {env.get('torch')}, transformers "
        f"{env.get('transformers')}",
        "",
        f"GPT-2 {model['shape']} shape ({model['parameters']:,} parameters, random init, fp32 "
        f"weights), device `{report['device']}`; {data.get('examples')} examples = "
        f"{data.get('queries')} queries, {data.get('tokens'):,} tokens (mean "
        f"{data.get('mean_tokens_per_query')}, max {data.get('max_tokens_per_query')}). Times: "
        f"fastest of {report['settings']['repeats']} after a warm-up pass, device synchronised.",
        "",
        f"Tokenization alone (`encode_pairs`): {report['tokenize']['warm_s']:.3f} s warm "
        f"({report['tokenize']['queries_per_s_warm']:,.0f} q/s; first call "
        f"{report['tokenize']['first_s']:.3f} s).",
        "",
        "## The scoring path, fp32",
        "",
        "`step`: the scoring path (tokenize both choices, then `score_queries`); `score only`: "
        "`score_queries` on pre-tokenized queries; `forward only`: the forwards on pre-collated "
        "batches already on the device.",
        "",
        "| batch | forwards | pad % | step s | step q/s | score only q/s | forward only q/s | "
        "acc | acc_norm | peak alloc GiB |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    pads = data.get("padding_fraction_by_batch_size", {})
    for r in report.get("batch_sizes") or []:
        pad = pads.get(str(r["batch_size"]))
        lines.append(
            f"| {r['batch_size']} | {r['num_forwards']} | "
            f"{'–' if pad is None else f'{100 * pad:.1f}'} | {r['step_s']:.3f} "
            f"| {r['step_queries_per_s']:,.0f} | {r['score_only_queries_per_s']:,.0f} "
            f"| {r['forward_only_queries_per_s']:,.0f} | {r['acc']:.4f} | {r['acc_norm']:.4f} "
            f"| {r.get('peak_allocated_gib', '–')} |"
        )
    single = report.get("one_at_a_time")
    if single:
        lines += [
            "",
            "## One query at a time (lm-eval with batch size 1: full-vocabulary logits)",
            "",
            f"{single['queries']} queries in {single['s']:.3f} s = "
            f"**{single['queries_per_s']:,.0f} q/s**; largest |log-likelihood difference| from "
            f"the batched path: {single['max_abs_diff_vs_batched']:.2e}.",
        ]
    variants = report.get("variants") or []
    if variants:
        lines += [
            "",
            f"## Precision variants, batch {variants[0]['batch_size']} (scoring path)",
            "",
            "| variant | step s | step q/s | score only q/s | max abs diff vs fp32 | acc | "
            "acc_norm | predictions changed |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for v in variants:
            lines.append(
                f"| {v['variant']} | {v['step_s']:.3f} | {v['step_queries_per_s']:,.0f} "
                f"| {v['score_only_queries_per_s']:,.0f} | {v['max_abs_diff_vs_fp32']:.3g} "
                f"| {v['acc']:.4f} | {v['acc_norm']:.4f} | {v['predictions_changed_vs_fp32']} |"
            )
    budgets = report.get("token_budgets") or []
    if budgets:
        tokenize = report["tokenize"]
        lines += [
            "",
            "## Token budgets (scoring path, batch_size "
            f"{report['settings']['budget_batch_size']}, `max_batch_tokens`)",
            "",
            "`padded`: right-padded rows (the default); `packed`: `pack_sequences` "
            "(queries end to end, a shared context once). `positions`: "
            "positions fed to the model over all forwards.",
            "",
            "| precision | max_batch_tokens | layout | forwards | positions | pad % | step s "
            "| step q/s | max abs diff vs fp32 | acc | acc_norm |",
            "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for b in budgets:
            lines.append(
                f"| {b['precision']} | {b['max_batch_tokens']} | {b.get('layout', 'padded')} "
                f"| {b['num_forwards']} | {b.get('positions_fed', 0):,} "
                f"| {100 * b['padding_fraction']:.1f} | {b['step_s']:.3f} "
                f"| {b['step_queries_per_s']:,.0f} | {b['max_abs_diff_vs_fp32']:.3g} "
                f"| {b['acc']:.4f} | {b['acc_norm']:.4f} |"
            )
        if "parallel_warm_s" in tokenize:
            lines += [
                "",
                f"Tokenization: {tokenize['serial_warm_s']:.3f} s with "
                f"`TOKENIZERS_PARALLELISM=false`, {tokenize['parallel_warm_s']:.3f} s with the "
                "tokenizer's thread pool.",
            ]
    summary = report.get("summary") or {}
    if summary:
        verdict = "met" if summary["target_met"] else "**not met**"
        lines += [
            "",
            "## Target",
            "",
            f"Target {TARGET_QUERIES_PER_S:,} q/s (the catwalk attempt: ~"
            f"{EARLIER_QUERIES_PER_S} q/s): fastest scoring path "
            f"{summary['fastest_step_queries_per_s']:,.0f} q/s — {verdict} (factor "
            f"{summary['shortfall_factor']} to go). Best fp32 score-only "
            f"{summary['best_score_only_queries_per_s']:,.0f} q/s, forward-only "
            f"{summary['best_forward_only_queries_per_s']:,.0f} q/s, tokenization alone "
            f"{summary['tokenize_only_queries_per_s']:,.0f} q/s."
            + (
                f" Batched vs one at a time: {summary['speedup_vs_one_at_a_time']}x."
                if "speedup_vs_one_at_a_time" in summary
                else ""
            ),
        ]
    lines += profile_markdown(report.get("profile"))
    for note in report.get("notes") or []:
        lines.append(f"\nNote: {note}")
    lines.append(f"\nTotal wall time {report.get('total_wall_s')} s.")
    return "\n".join(lines) + "\n"


def profile_markdown(profiled: dict[str, Any] | None) -> list[str]:
    """``--profile``: one warm run under ``torch.profiler``, GPU kernel time by kind."""
    if not profiled:
        return []
    ms = profiled["gpu_ms"]
    kinds = [k for k in _bench.KERNEL_KIND_NAMES if ms.get(k)]
    return [
        "",
        f"## Where the time goes ({profiled['precision']}, max_batch_tokens "
        f"{profiled['max_batch_tokens']}, {profiled['layout']})",
        "",
        "One warm run of the scoring path under `torch.profiler`: wall ms, GPU kernel ms (busy) "
        "and by kind; tokenization alone (it runs before the first forward), timed above.",
        "",
        "| wall ms | busy ms | idle ms | tokenize ms | "
        + " | ".join(f"{k} ms" for k in kinds)
        + " |",
        "|" + "---:|" * (4 + len(kinds)),
        f"| {ms['wall']:.1f} | {ms['busy']:.1f} | {ms['wall'] - ms['busy']:.1f} "
        f"| {1000 * profiled['tokenize_s']:.1f} | "
        + " | ".join(f"{ms[k]:.1f}" for k in kinds)
        + " |",
    ]
