"""Tango's own ``torch::train`` with a tango_fairscale engine against the package's train step: the
same model, data, engine, precision and batch, training throughput measured in the same run.

    python benchmarks/torch_train_speed.py --piqa .gpudata/piqa \
        --tokenizer .gpudata/gpt2-tokenizer --out results/torch_train_speed.json \
        [--engine fsdp2] [--precision bf16-mixed] [--tiny]

Both run as users run them, one ``tango run`` each on PIQA's training examples (GPT-2 124M
shape, random weights, batch 16): ``examples/torch_train_fairscale.jsonnet`` (``torch::train``)
and ``configs/gpt2_piqa.jsonnet`` (``tango_fairscale::train``, padded batches as torch::train's
collator makes them). Throughput: the optimizer steps per second of each training progress bar's
last report (tqdm's rate), times the mean real tokens of a batch of PIQA's correct answers.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402

_bench.setup_paths()

RATE = re.compile(r"Training[^\r\n]*?\| (\d+)/(\d+) \[[\d:]+<[\d:?]+, *([\d.]+)(it/s|s/it)")


def steps_per_second(output: str) -> float | None:
    """The last rate a training progress bar reported (steps/s)."""
    found = RATE.findall(output)
    if not found:
        return None
    *_, value, unit = found[-1]
    return float(value) if unit == "it/s" else 1 / float(value)


def mean_example_tokens(piqa: Path, tokenizer: Path, limit: int | None) -> float:
    """Mean tokens of ``Question: goal\\nAnswer: <correct sol>`` over the training examples."""
    from transformers import AutoTokenizer

    from tango_fairscale.tasks.piqa import read_piqa

    tok = AutoTokenizer.from_pretrained(str(tokenizer))
    examples = list(read_piqa(piqa, limit=limit)["train"])
    texts = [f"Question: {e['goal']}\nAnswer: " + e["sol1" if e["label"] == 0 else "sol2"]
             for e in examples]  # fmt: skip
    return sum(len(ids) for ids in tok(texts)["input_ids"]) / len(texts)


def run(command: list[str], log: Path, timeout: float) -> tuple[float, int, str]:
    started = time.perf_counter()
    with log.open("w") as file:
        try:
            done = subprocess.run(command, stdout=file, stderr=subprocess.STDOUT, timeout=timeout)
            code = done.returncode
        except subprocess.TimeoutExpired:
            code = 124
    return time.perf_counter() - started, code, log.read_text(errors="replace")


def write_profile_summary(stem: Path, top: int = 60) -> None:
    """``stem.txt``: the profile's functions by own time, then by cumulative time."""
    import io
    import pstats

    text = io.StringIO()
    stats = pstats.Stats(f"{stem}.prof", stream=text).strip_dirs()
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    stem.with_suffix(".txt").write_text(text.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--piqa", type=Path, required=True)
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--engine", default="fsdp2")
    parser.add_argument("--precision", default="bf16-mixed")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--work", type=Path, default=Path("/tmp/torch_train_speed"))
    parser.add_argument("--timeout-s", type=float, default=200, help="per command")
    parser.add_argument("--tiny", action="store_true", help="CPU smoke test")
    parser.add_argument("--commit")
    parser.add_argument(
        "--profile",
        type=Path,
        help="run each command's main process under cProfile (slower: its rates are not the "
        "figures); writes LABEL.prof and LABEL.txt (functions by own and cumulative time) here",
    )
    args = parser.parse_args()
    from tango_fairscale.model.causal_lm import ModelWrapper

    shape = _bench.SHAPES["tiny" if args.tiny else "124m"]
    config = {"model_type": "gpt2", "n_positions": 1024, **shape}
    model_dir = args.work / "model"
    ModelWrapper(config=config, tokenizer=str(args.tokenizer), seed=0).save(model_dir)
    steps = 6 if args.tiny else args.steps
    limit = 64 if args.tiny else 2000
    defines = [f"model={model_dir}", f"data_dir={args.piqa}", f"engine={args.engine}",
               f"precision={args.precision}", f"train_steps={steps}", f"limit={limit}",
               f"batch_size={args.batch_size}", "device_count=1", "lr=1e-4"]  # fmt: skip
    tango = [sys.executable, "-m", "tango", "--file-friendly-logging", "run"]
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    padded = '{"steps.trained_model.runtime.pack_sequences": false}'
    commands = {
        "torch::train": [*tango, "examples/torch_train_fairscale.jsonnet", "-i",
                         "examples/torch_train_piqa.py", "-w", str(args.work / "ws-torch")],
        "tango_fairscale::train": [*tango, "configs/gpt2_piqa.jsonnet", "-w",
                                   str(args.work / "ws-ours"), "-D", f"validate_every={steps}",
                                   "-o", padded],
    }  # fmt: skip
    tokens = mean_example_tokens(args.piqa, args.tokenizer, limit) * args.batch_size
    results: list[dict[str, Any]] = []
    report = {
        "benchmark": "torch_train_speed",
        "environment": _bench.environment(args.commit),
        "model": config,
        "settings": {"engine": args.engine, "precision": args.precision, "steps": steps,
                     "batch_size": args.batch_size, "mean_tokens_per_step": round(tokens, 1)},
        "runs": results,
    }  # fmt: skip
    for label, command in commands.items():
        profile = None if args.profile is None else args.profile / label.replace("::", "-")
        if profile is not None:
            command = [command[0], "-m", "cProfile", "-o", f"{profile}.prof", *command[1:]]
        seconds, code, output = run(
            [*command, *(f"-D{d}" for d in defines)], args.work / f"{label}.log", args.timeout_s
        )
        if profile is not None and Path(f"{profile}.prof").is_file():
            write_profile_summary(profile)
        rate = steps_per_second(output)
        results.append(
            {
                "step": label,
                "exit_code": code,
                "command_s": round(seconds, 2),
                "steps_per_s": None if rate is None else round(rate, 3),
                "tokens_per_s": None if rate is None else round(rate * tokens, 1),
            }
        )
        print(json.dumps(results[-1]), flush=True)
        _bench.write_json(args.out, report)
    rates = {r["step"]: r["tokens_per_s"] for r in results}
    if all(rates.values()):
        report["ratio_ours_to_torch_train"] = round(
            rates["tango_fairscale::train"] / rates["torch::train"], 3
        )
    _bench.write_json(args.out, report)
    print(json.dumps(report.get("ratio_ours_to_torch_train")))


if __name__ == "__main__":
    main()
