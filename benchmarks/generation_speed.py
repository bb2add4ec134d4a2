"""The package's ``generate_until`` against lm-evaluation-harness's HF backend on the same
GSM8K-shaped suite and model: generated tokens/s and whole-command wall time, in the same run.

    python benchmarks/generation_speed.py --tokenizer .gpudata/gpt2-tokenizer \
        --out results/generation_speed.json [--prompts 2000] [--max-gen-toks 256] [--tiny]

The suite: ``--prompts`` documents in ``openai/gsm8k``'s schema (random words: questions of
30-60 words, worked answers of 40-90 words ending ``#### <number>``), asked through lm-eval's
own ``gsm8k`` task (its 5-shot prompt, stop sequences, filters and exact match) by a task YAML
that includes it, reads the local files and sets ``max_gen_toks``; the model a GPT-2 124M shape
with random weights (so nearly every answer runs to ``max_gen_toks``). One command per tool and
setting (:data:`RUNS`, by priority within ``--budget-s``), timed from start to exit:
``tango run`` of a config with one ``tango_fairscale::task_scores`` step (``precision``,
``batch_size``) and ``lm_eval --model hf`` (``dtype``, ``--batch_size`` 64 and ``auto``).

Generation rate: requests over the time of each tool's generation pass (the package logs it;
lm-eval's progress bar shows it, in whole seconds), and generated tokens/s: the package's own count
of generated tokens over that time (both tools decode the same greedy tokens from the same model,
so lm-eval's count is the same up to bf16 rounding; its rate is that count over its pass).
``--tiny``: a CPU smoke test (a tiny model, a few prompts, 16 new tokens).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402

_bench.setup_paths()

WORDS = (
    "the of and to in is that for it as with was on be by at this from or an are not have "
    "apples cookies dollars hours miles pages trees marbles tickets boxes friends students "
    "buys sells gives bakes reads walks saves spends each more less twice half total left"
).split()

#: The runs, by priority: (label, tool, precision or dtype, batch size).
RUNS = [
    ("package bf16-mixed b256", "package", "bf16-mixed", "256"),
    ("lm-eval hf bfloat16 b64", "lm-eval", "bfloat16", "64"),
    ("lm-eval hf bfloat16 auto", "lm-eval", "bfloat16", "auto"),
    ("package bf16-mixed b512", "package", "bf16-mixed", "512"),
]


def words(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def gsm8k_data(root: Path, prompts: int) -> dict[str, str]:
    """``test.jsonl`` (``prompts`` documents) and ``train.jsonl`` (the few-shot pool)."""
    rng = random.Random(0)

    def document() -> dict[str, str]:
        number = rng.randint(1, 999)
        answer = f"{words(rng, 40, 90)} <<{number}={number}>>{number}.\n#### {number}"
        return {"question": words(rng, 30, 60) + "?", "answer": answer}

    files = {}
    for split, count in (("test", prompts), ("train", 50)):
        path = root / f"{split}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(document()) + "\n" for _ in range(count)))
        files[split] = str(path.resolve())
    return files


def task_yaml(files: dict[str, str], max_gen_toks: int, out: Path) -> Path:
    """A task YAML both tools read: lm-eval's ``gsm8k`` on the local files, ``max_gen_toks``."""
    import lm_eval.tasks
    import yaml
    from lm_eval.tasks._yaml_loader import load_yaml

    own = Path(lm_eval.tasks.__file__).parent / "gsm8k" / "gsm8k.yaml"
    generation = dict(load_yaml(own, resolve_func=True)["generation_kwargs"])
    body = {
        "include": str(own),
        "task": "gsm8k_synthetic",
        "dataset_path": "json",
        "dataset_name": None,
        "dataset_kwargs": {"data_files": files},
        "generation_kwargs": {**generation, "max_gen_toks": max_gen_toks},
    }
    path = out / "gsm8k_synthetic.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def package_command(model_dir: Path, yaml: Path, precision: str, batch: str, work: Path):
    """``tango run`` of a one-step config: ``task_scores`` of the suite, then its metrics."""
    config = {
        "steps": {
            "scores": {
                "type": "tango_fairscale::task_scores",
                "model": {"type": "tango_fairscale::causal_lm", "model": str(model_dir)},
                "task": {"yaml": str(yaml)},
                "precision": precision,
                "batch_size": int(batch),
            },
            "metrics": {"type": "tango_fairscale::task_metrics", "scores": [{"ref": "scores"}]},
        }
    }
    path = work / f"generation_{precision}_{batch}.jsonnet"
    path.write_text(json.dumps(config, indent=1))
    workspace = work / f"ws-{precision}-{batch}"
    tango = [sys.executable, "-m", "tango", "--log-level", "info", "run"]
    return [*tango, str(path), "-w", str(workspace)]


def timed(command: list[str], log: Path, timeout: float) -> tuple[float, int, str]:
    started = time.perf_counter()
    with log.open("w") as file:
        try:
            code = subprocess.run(
                command, stdout=file, stderr=subprocess.STDOUT, timeout=timeout
            ).returncode
        except subprocess.TimeoutExpired:
            code = 124
    return time.perf_counter() - started, code, log.read_text(errors="replace")


def ours_pass(output: str) -> tuple[int, int, float] | None:
    """(requests, generated tokens, seconds) of the package's generation passes, pooled."""
    found = re.findall(r"generated ([\d,]+) tokens for ([\d,]+) requests in ([\d.]+) s", output)
    if not found:
        return None
    tokens = sum(int(t.replace(",", "")) for t, _, _ in found)
    requests = sum(int(r.replace(",", "")) for _, r, _ in found)
    return requests, tokens, sum(float(s) for _, _, s in found)


def lm_eval_pass(output: str) -> tuple[int, float] | None:
    """(requests, seconds) of lm-eval's generation pass: its progress bar's last line."""
    bars = re.findall(
        r"Running generate_until requests: 100%\|[^|]*\| (\d+)/\d+ \[(?:(\d+):)?(\d+):(\d+)",
        output,
    )
    if not bars:
        return None
    requests, hours, minutes, seconds = bars[-1]
    elapsed = 3600 * int(hours or 0) + 60 * int(minutes) + int(seconds)
    return int(requests), float(elapsed)


def run_all(args: argparse.Namespace, model_dir: Path, yaml: Path, report: dict) -> None:
    """Every run of :data:`RUNS` that fits the budget; each one's row in ``report["runs"]``."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    begun = time.perf_counter()
    tokens_per_request = None  # the package's count, for lm-eval's rate
    for label, tool, setting, batch in RUNS:
        if args.tiny and batch == "auto":  # lm-eval's batch-size search takes minutes on a CPU
            continue
        left = args.budget_s - (time.perf_counter() - begun)
        if left < 20:
            print(f"skipped {label}: {left:.0f} s of the budget left", flush=True)
            continue
        if tool == "package":
            command = package_command(model_dir, yaml, setting, batch, args.work)
        else:
            command = [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args",
                       f"pretrained={model_dir},dtype={setting}", "--tasks", str(yaml),
                       "--batch_size", batch, "--device", device]  # fmt: skip
        log = args.work / f"{label}.log"
        seconds, code, output = timed(command, log, min(args.timeout_s, left))
        row: dict[str, Any] = {"tool": label, "exit_code": code, "command_s": round(seconds, 2)}
        if tool == "package" and (found := ours_pass(output)):
            requests, tokens, pass_s = found
            tokens_per_request = tokens / max(requests, 1)
            row |= {"requests": requests, "generated_tokens": tokens, "generation_s": pass_s}
        elif tool == "lm-eval" and (found_lm := lm_eval_pass(output)):
            requests, pass_s = found_lm
            row |= {"requests": requests, "generation_s": pass_s}
            if tokens_per_request is not None:
                row["generated_tokens"] = round(tokens_per_request * requests)
        if row.get("generation_s"):
            row["requests_per_s"] = round(row["requests"] / row["generation_s"], 2)
            if "generated_tokens" in row:
                row["generated_tokens_per_s"] = round(row["generated_tokens"] / row["generation_s"])
        report["runs"].append(row)
        print(json.dumps(row), flush=True)
        _bench.write_json(args.out, report)


def ratios(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The best package run against the best lm-eval run: generation rate and command time."""
    rows = [r for r in runs if r.get("requests_per_s")]
    ours = max((r for r in rows if r["tool"].startswith("package")), default=None,
               key=lambda r: r["requests_per_s"])  # fmt: skip
    theirs = max((r for r in rows if r["tool"].startswith("lm-eval")), default=None,
                 key=lambda r: r["requests_per_s"])  # fmt: skip
    if not (ours and theirs):
        return None
    achieved = ours["requests_per_s"] / theirs["requests_per_s"]
    return {
        "package": ours["tool"],
        "lm_eval": theirs["tool"],
        "generation_throughput": round(achieved, 2),
        "command": round(theirs["command_s"] / ours["command_s"], 2),
        "goal": ">= 3x lm-eval's generation throughput",
        "met": achieved >= 3.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--prompts", type=int, default=2000)
    parser.add_argument("--max-gen-toks", type=int, default=256)
    parser.add_argument("--work", type=Path, default=Path("/tmp/generation_speed"))
    parser.add_argument("--timeout-s", type=float, default=300, help="per command")
    parser.add_argument("--budget-s", type=float, default=1e9, help="all commands: skip the rest")
    parser.add_argument("--tiny", action="store_true", help="CPU smoke test: a tiny model")
    parser.add_argument("--commit")
    args = parser.parse_args()
    if args.tiny:
        args.prompts, args.max_gen_toks = min(args.prompts, 16), min(args.max_gen_toks, 16)
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    args.work.mkdir(parents=True, exist_ok=True)
    model_dir = args.work / "model"
    config = {"n_positions": 1024, **_bench.SHAPES["tiny" if args.tiny else "124m"]}
    tokenizer = AutoTokenizer.from_pretrained(str(args.tokenizer))
    tokenizer.eos_token = tokenizer.bos_token = "<|endoftext|>"  # lm-eval's HF backend needs them
    import torch

    torch.manual_seed(0)
    hf_config = AutoConfig.for_model("gpt2", vocab_size=len(tokenizer), **config)
    AutoModelForCausalLM.from_config(hf_config).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    yaml = task_yaml(gsm8k_data(args.work / "data", args.prompts), args.max_gen_toks, args.work)
    report: dict[str, Any] = {
        "benchmark": "generation_speed",
        "environment": _bench.environment(args.commit),
        "model": {"model_type": "gpt2", **config},
        "suite": {
            "task": "lm-eval gsm8k (5-shot), synthetic documents",
            "prompts": args.prompts,
            "max_gen_toks": args.max_gen_toks,
        },
        "runs": [],
    }
    run_all(args, model_dir, yaml, report)
    report["ratios"] = ratios(report["runs"])
    _bench.write_json(args.out, report)
    print(json.dumps(report["ratios"], indent=1))


if __name__ == "__main__":
    main()
