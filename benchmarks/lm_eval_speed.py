"""The package's scorer against lm-evaluation-harness's HF backend on the same tasks and model:
scoring requests/s and whole-command wall time, measured in the same run.

    python benchmarks/lm_eval_speed.py --piqa .gpudata/piqa --tokenizer .gpudata/gpt2-tokenizer \
        --out results/lm_eval_speed.json [--suites synthetic,piqa] [--tools package,lm-eval] \
        [--pyspy DIR] [--scoring-profile DIR] [--tiny]

Suites: ``piqa`` — lm-eval's ``piqa`` on the official validation files (3,676 requests);
``synthetic`` — >= 50,000 requests in HellaSwag's shape (long contexts, four long endings) and
MMLU's (long questions, one-token answers), random text in each task's real schema. For each,
one command per tool and setting (:data:`RUNS`, by priority within ``--budget-s``; every suite's
runs before the :data:`EXTRA_RUNS` of any), timed from
start to exit, on a GPT-2 124M-shaped model (random weights): the package through ``tango run``
(``configs/gpt2_piqa.jsonnet -D train_steps=0`` for PIQA as a user evaluates it,
``configs/mc_suite.jsonnet`` for the synthetic tasks; a fresh workspace, then a second model of
the same shape in the same workspace, whose requests come from the cache; then, through
``tango-fairscale eval``, a third model alone and a fourth and fifth in one command: what a
checkpoint adds to a command that scores several, the second command's seconds less the
first's) and
``lm_eval --model hf`` in bfloat16 at batch sizes 64, 256 and ``auto`` (and at 256 with
``--cache_requests true``: a first model that fills lm-eval's request cache, then the second
model reading it). Scoring requests/s: requests over the time of the tool's own log-likelihood
pass — the package's ``ScorerLM`` logs it; lm-eval's progress bar reports its rate. Where a
package command's time goes: each Tango step it ran (from the workspace's step records) and the
time before the first and after the last; each package command's output, progress bars left out,
beside ``--out`` in ``commands.log``. With ``--pyspy DIR``, each package command runs
under py-spy (100 samples/s, every process, idle time included; ``pip install py-spy``):
``DIR/<suite>-<label>.txt``, for ``sampled_summary.py`` (their seconds are slightly slowed). With
``--scoring-profile DIR``, each log-likelihood pass of a package command runs under
``torch.profiler`` (``profile_hook/``): ``DIR/<suite>-<label>/<pid>-<n>.txt``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402

_bench.setup_paths()

WORDS = (
    "the of and to in is that for it as with was on be by at this from or an are not have "
    "water light river stone market garden winter engine paper window music animal city road "
    "build carry open close slowly quickly bright heavy small ancient modern simple careful"
).split()

CACHE = ("--cache_requests", "true")
#: Runs that rank lm-eval's batch sizes only: measured after every suite's other runs.
EXTRA_RUNS = {"lm-eval hf bfloat16 auto", "lm-eval hf bfloat16 b64"}

#: Each suite's runs, by priority: (label, tool, lm-eval batch size, model, lm-eval flags).
#: Model ``second``: another random model of the same shape (the package: in the first run's
#: workspace, so its requests come from the cache); ``third`` and ``fourth,fifth`` likewise, the
#: latter two in one ``tango-fairscale eval`` command.
RUNS: dict[str, list[tuple[str, str, str | None, str, tuple[str, ...]]]] = {
    "synthetic": [
        ("package bf16-mixed", "package", None, "first", ()),
        ("lm-eval hf bfloat16 b256 cache_requests", "lm-eval", "256", "first", CACHE),
        ("package bf16-mixed second model", "package", None, "second", ()),
        (
            "lm-eval hf bfloat16 b256 cache_requests second model",
            "lm-eval",
            "256",
            "second",
            CACHE,
        ),  # fmt: skip
        ("package eval one model", "package eval", None, "third", ()),
        ("package eval two models", "package eval", None, "fourth,fifth", ()),
        ("lm-eval hf bfloat16 auto", "lm-eval", "auto", "first", ()),
        ("lm-eval hf bfloat16 b64", "lm-eval", "64", "first", ()),
    ],
    "piqa": [
        ("package eval only (gpt2_piqa.jsonnet)", "package", None, "first", ()),
        ("lm-eval hf bfloat16 b256", "lm-eval", "256", "first", ()),
        ("lm-eval hf bfloat16 auto", "lm-eval", "auto", "first", ()),
    ],
}


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def piqa_data(piqa: Path, root: Path, limit: int | None) -> dict[str, int]:
    lines = (piqa / "valid.jsonl").read_text(encoding="utf-8").splitlines()[:limit]
    labels = (piqa / "valid-labels.lst").read_text().split()
    rows = [{**json.loads(line), "label": int(label)} for line, label in zip(lines, labels)]
    write_jsonl(root / "piqa" / "validation.jsonl", rows)
    return {"piqa": 2 * len(rows)}


def synthetic_data(root: Path, scale: float) -> dict[str, int]:
    """HellaSwag-shaped (8,000 documents x 4 endings) and MMLU-shaped (5,000 x 4) documents."""
    rng = random.Random(0)
    hellaswag = [
        {
            "ind": i,
            "activity_label": words(rng, 2),
            "ctx_a": words(rng, 40),
            "ctx_b": words(rng, 12),
            "ctx": "",
            "endings": [words(rng, rng.randint(15, 30)) for _ in range(4)],
            "source_id": f"s{i}",
            "split": "val",
            "split_type": "indomain",
            "label": str(i % 4),
        }
        for i in range(int(8000 * scale))
    ]
    mmlu = [
        {
            "question": words(rng, rng.randint(120, 250)),
            "subject": "anatomy",
            "choices": [words(rng, rng.randint(3, 10)) for _ in range(4)],
            "answer": i % 4,
        }
        for i in range(int(5000 * scale))
    ]
    write_jsonl(root / "hellaswag" / "validation.jsonl", hellaswag)
    write_jsonl(root / "mmlu_anatomy" / "test.jsonl", mmlu)
    write_jsonl(root / "mmlu_anatomy" / "dev.jsonl", mmlu[:5])
    return {"hellaswag": 4 * len(hellaswag), "mmlu_anatomy": 4 * len(mmlu)}


def task_yamls(tasks: list[str], root: Path, out: Path) -> list[str]:
    """For lm-eval's CLI: YAMLs that include its own task file and read the local data."""
    import lm_eval.tasks
    import yaml

    tasks_dir = Path(lm_eval.tasks.__file__).parent
    own = {"piqa": "piqa/piqa.yaml", "hellaswag": "hellaswag/hellaswag.yaml",
           "mmlu_anatomy": "mmlu/default/mmlu_anatomy.yaml"}  # fmt: skip
    paths = []
    for task in tasks:
        files = {p.stem: str(p.resolve()) for p in sorted((root / task).glob("*.jsonl"))}
        body = {
            "include": str(tasks_dir / own[task]),
            "task": f"{task}_local",
            "dataset_path": "json",
            "dataset_name": None,
            "dataset_kwargs": {"data_files": files},
            "training_split": None,
        }
        path = out / f"{task}_local.yaml"
        path.write_text(yaml.safe_dump(body, sort_keys=False))
        paths.append(str(path))
    return paths


def timed(
    command: list[str], log: Path, timeout: float, env: dict[str, str] | None = None
) -> tuple[float, int, str, dict[str, float | None]]:
    """Run ``command`` with its output in ``log``: its seconds, exit code, output, and the GPU's
    busy share (NVML, every 100 ms) over the command and over the package's scoring passes (each
    ``scored N requests in S s`` line: the S seconds before it appeared)."""
    sampler = _bench.GpuSampler()
    sampler.start()
    started = time.perf_counter()
    windows: list[tuple[float, float]] = []
    with log.open("w") as file:
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,  # its workers too are killed at the timeout
        )
        assert process.stdout is not None
        watchdog = threading.Timer(timeout, os.killpg, (process.pid, signal.SIGKILL))
        watchdog.start()
        for line in process.stdout:
            file.write(line)
            scored = re.search(r"scored [\d,]+ requests in ([\d.]+) s", line)
            if scored:
                now = time.perf_counter()
                windows.append((now - float(scored.group(1)), now))
        returncode = process.wait()
        timed_out = not watchdog.is_alive() and returncode < 0
        watchdog.cancel()
        code = 124 if timed_out else returncode
    ended = time.perf_counter()
    sampler.stopped.set()
    busy = {"gpu_busy_pct_command": sampler.busy((started, ended))}
    busy["gpu_busy_pct_scoring"] = sampler.busy(*windows) if windows else None
    return ended - started, code, log.read_text(errors="replace"), busy


def step_split(workspace: Path, started: datetime.datetime, wall_s: float) -> dict[str, Any]:
    """Seconds of each Tango step that the command starting at ``started`` ran in ``workspace``
    (from its step records), and the command's seconds before the first and after the last."""
    from tango import Workspace

    ran = {  # the command's runs: several where it scored several models
        run.name: {
            name: (info.start_time, info.end_time)
            for name, info in run.steps.items()
            if info.start_time and info.end_time and info.start_time >= started
        }
        for run in Workspace.from_url(str(workspace)).registered_runs().values()
    }
    ran = {run: steps for run, steps in ran.items() if steps}
    spans = {
        name if len(ran) == 1 else f"{run}/{name}": span
        for run, steps in ran.items()
        for name, span in steps.items()
    }
    if not spans:
        return {}
    first = min(start for start, _ in spans.values())
    last = max(end for _, end in spans.values())
    return {
        "before_steps_s": round((first - started).total_seconds(), 2),
        "steps_s": {
            name: round((end - start).total_seconds(), 2)
            for name, (start, end) in sorted(spans.items(), key=lambda item: item[1])
        },
        "after_steps_s": round(wall_s - (last - started).total_seconds(), 2),
    }


def pyspy_binary() -> str:
    """py-spy's executable, or exit saying how to install it."""
    # pip install --target puts the binary in the target's bin/, which is not on PATH.
    bins = [os.environ.get("PATH", ""), *(str(Path(p) / "bin") for p in sys.path if p)]
    pyspy = shutil.which("py-spy", path=os.pathsep.join(bins))
    if pyspy is None:
        raise SystemExit("--pyspy needs py-spy (pip install py-spy==0.4.3)")
    return pyspy


def sampled(command: list[str], pyspy: str, recording: Path) -> list[str]:
    """``command`` under the ``pyspy`` executable, sampled into ``recording`` (raw format)."""
    recording.parent.mkdir(parents=True, exist_ok=True)
    sampler = [pyspy, "record", "--rate", "100", "--subprocesses", "--idle", "--format", "raw"]
    return [*sampler, "--output", str(recording), "--", *command]


def scoring_profiled_env(folder: Path) -> dict[str, str]:
    """The environment that profiles each log-likelihood pass into ``folder``
    (``benchmarks/profile_hook/``)."""
    hook = str(Path(__file__).resolve().parent / "profile_hook")
    paths = [hook, *filter(None, [os.environ.get("PYTHONPATH")])]
    return {
        **os.environ,
        "BENCH_SCORING_PROFILE_DIR": str(folder),
        "PYTHONPATH": os.pathsep.join(paths),
    }


def kept_log(log: Path, kept: Path) -> None:
    """``log`` appended to ``kept`` under a header, without its progress bars' redrawn lines."""
    lines = (line.rsplit("\r", 1)[-1] for line in log.read_text(errors="replace").splitlines())
    with kept.open("a") as file:
        file.write(f"===== {log.stem}\n" + "\n".join(line for line in lines if line.strip()) + "\n")


def ours_rate(output: str) -> float | None:
    """Requests/s of the package's log-likelihood passes (``ScorerLM``'s log lines), pooled."""
    found = re.findall(r"scored ([\d,]+) requests in ([\d.]+) s", output)
    requests = sum(int(n.replace(",", "")) for n, _ in found)
    seconds = sum(float(s) for _, s in found)
    return requests / seconds if seconds else None


def lm_eval_rate(output: str) -> float | None:
    """Requests/s of lm-eval's log-likelihood pass: its progress bar's last line (``N/N [..]``
    with elapsed time), requests over elapsed. The bar shows whole seconds: a suite scored in a
    second or two (PIQA) cannot rank the tools, the synthetic suite can."""
    bars = re.findall(
        r"Running loglikelihood requests: 100%\|[^|]*\| (\d+)/\d+ \[(\d+):(\d+)", output
    )
    if not bars:
        return None
    requests, minutes, seconds = (int(value) for value in bars[-1])
    elapsed = 60 * minutes + seconds
    return requests / elapsed if elapsed else None


def ratios(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The target figures of one suite's ``runs``: lm-eval's best whole command over the
    package's (first model: a fresh workspace; second model: requests cached, against lm-eval's
    second model with ``--cache_requests true``) and the scoring rates' ratio."""
    done = [r for r in runs if r["exit_code"] == 0]

    def best(tool: str, model: str, key: str, fastest: bool = True) -> dict[str, Any] | None:
        rows = [r for r in done if r["tool"].startswith(tool) and r["model"] == model and r[key]]
        if not rows:
            return None
        return (min if fastest else max)(rows, key=lambda r: r[key])

    figures: dict[str, Any] = {}
    for model, goal in (("first", ">= 4"), ("second", ">= 10")):
        ours, theirs = best("package", model, "command_s"), best("lm-eval", model, "command_s")
        if ours and theirs:
            figures[f"command_{model}_model"] = {
                "lm_eval_over_package": round(theirs["command_s"] / ours["command_s"], 2),
                "package": ours["tool"],
                "lm_eval": theirs["tool"],
                "goal": goal,
            }
    one, two = (
        best("package eval", "third", "command_s"),
        best("package eval", "fourth,fifth", "command_s"),
    )
    theirs = best("lm-eval", "second", "command_s")
    if one and two and theirs:
        added = two["command_s"] - one["command_s"]  # a checkpoint more in one command
        figures["command_checkpoint_in_one_command"] = {
            "package_s": round(added, 2),
            "lm_eval_over_package": round(theirs["command_s"] / added, 2) if added > 0 else None,
            "lm_eval": theirs["tool"],
            "goal": ">= 10",
        }
    rate = "scoring_requests_per_s"
    ours, theirs = best("package", "first", rate, False), best("lm-eval", "first", rate, False)
    if ours and theirs:
        figures["scoring"] = {
            "package_over_lm_eval": round(ours[rate] / theirs[rate], 2),
            "lm_eval": theirs["tool"],
            "goal": ">= 3",
        }
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--piqa", type=Path, required=True)
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--suites", default="synthetic,piqa", help="in this order")
    parser.add_argument("--tools", default="package,lm-eval", help="the runs of these tools only")
    parser.add_argument("--pyspy", type=Path, help="the package's commands under py-spy")
    parser.add_argument(
        "--scoring-profile", type=Path, help="the package's scoring passes under torch.profiler"
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/lm_eval_speed"))
    parser.add_argument("--timeout-s", type=float, default=240, help="per command")
    parser.add_argument("--budget-s", type=float, default=1e9, help="all commands: skip the rest")
    parser.add_argument("--tiny", action="store_true", help="CPU smoke test: tiny model, few docs")
    parser.add_argument("--commit")
    args = parser.parse_args()
    pyspy = None if args.pyspy is None else pyspy_binary()  # before any model or data is made
    import torch

    from tango_fairscale.model.causal_lm import ModelWrapper

    begun = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shape = _bench.SHAPES["tiny" if args.tiny else "124m"]
    config = {"model_type": "gpt2", "n_positions": 1024, **shape}
    # A warm device machine keeps /tmp between calls: a workspace left there would hold the
    # requests, and the "fresh workspace" command would build none.
    shutil.rmtree(args.work, ignore_errors=True)
    names = ("first", "second", "third", "fourth", "fifth")
    model_dirs = {name: args.work / f"model{i + 1}" for i, name in enumerate(names)}
    for seed, model_dir in enumerate(model_dirs.values()):
        ModelWrapper(config=config, tokenizer=str(args.tokenizer), seed=seed).save(model_dir)
    results: list[dict[str, Any]] = []
    report: dict[str, Any] = {
        "benchmark": "lm_eval_speed",
        "environment": _bench.environment(args.commit),
        "model": config,
        "runs": results,
    }
    planned = []  # (suite, requests, label, command, rate_of, model), in the order they run
    for suite in args.suites.split(","):
        root = args.work / suite / "data"
        if suite == "piqa":
            requests = piqa_data(args.piqa, root, 50 if args.tiny else None)
        else:
            requests = synthetic_data(root, 0.002 if args.tiny else 1.0)
        tasks = list(requests)
        yamls = task_yamls(tasks, root, args.work / suite)
        total = sum(requests.values())
        commands = {}
        for label, tool, batch, which, flags in RUNS[suite]:
            if tool.split()[0] not in args.tools.split(","):
                continue
            models = [str(model_dirs[name]) for name in which.split(",")]
            model = models[0]
            if tool == "package eval":
                workspace = args.work / suite / "ws"
                command = [sys.executable, "-m", "tango_fairscale", "eval", "--model", *models,
                           "--tasks", ",".join(tasks), "--task_data_dir", str(root),
                           "--precision", "bf16-mixed", "--num_fewshot", "0",  # as tango.yml's
                           "-w", str(workspace)]  # fmt: skip
                commands[label] = (command, ours_rate, which)
            elif tool == "package" and suite == "piqa":
                workspace = args.work / suite / "ws"
                tango = [sys.executable, "-m", "tango", "--log-level", "info", "run"]
                command = [*tango, "configs/gpt2_piqa.jsonnet", "-w", str(workspace)]
                defines = [f"model={model}", f"data_dir={args.piqa}", "train_steps=0"]
                if args.tiny:
                    defines.append("limit=50")
                commands[label] = ([*command, *(f"-D{d}" for d in defines)], ours_rate, which)
            elif tool == "package":
                workspace = args.work / suite / "ws"
                defines = [f"model={model}", f"tasks={','.join(tasks)}",
                           f"task_data_dir={root}", "train_steps=0",
                           "precision=bf16-mixed"]  # fmt: skip
                tango = [sys.executable, "-m", "tango", "--log-level", "info", "run"]
                command = [*tango, "configs/mc_suite.jsonnet", "-w", str(workspace)]
                commands[label] = ([*command, *(f"-D{d}" for d in defines)], ours_rate, which)
            else:
                command = [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args",
                           f"pretrained={model},dtype=bfloat16", "--tasks", ",".join(yamls),
                           "--batch_size", str(batch), "--device", device, *flags]  # fmt: skip
                commands[label] = (command, lm_eval_rate, which)
        planned += [(suite, total, label, *run) for label, run in commands.items()]
    # Every suite's figures first, then the runs that only rank lm-eval's batch sizes.
    planned.sort(key=lambda run: run[2] in EXTRA_RUNS)  # a stable sort: priority kept within
    for suite, total, label, command, rate_of, which in planned:
        left = args.budget_s - (time.perf_counter() - begun)
        if left < 20:
            print(f"skipped {suite} {label}: {left:.0f} s of the budget left", flush=True)
            continue
        slug = re.sub(r"[^a-z0-9]+", "-", f"{suite} {label}").strip("-")
        log = args.work / suite / f"{slug}.log"
        started = datetime.datetime.now(datetime.timezone.utc)
        env = None
        if pyspy is not None and label.startswith("package"):
            command = sampled(command, pyspy, args.pyspy / f"{slug}.txt")
        if args.scoring_profile is not None and label.startswith("package"):
            env = scoring_profiled_env(args.scoring_profile / slug)
        if label.startswith("package eval"):  # Tango's info log: the scoring passes' lines
            env = {**(env or os.environ), "TANGO_LOG_LEVEL": "info"}
        seconds, code, output, busy = timed(command, log, min(args.timeout_s, left), env)
        rate = rate_of(output)
        results.append(
            {
                "suite": suite,
                "tool": label,
                "model": which,
                "requests": total,
                "exit_code": code,
                "command_s": round(seconds, 2),
                "scoring_requests_per_s": None if rate is None else round(rate, 1),
                **busy,
            }
        )
        if label.startswith("package"):
            results[-1].update(step_split(args.work / suite / "ws", started, seconds))
            kept_log(log, args.out.parent / "commands.log")
        print(json.dumps(results[-1]), flush=True)
        _bench.write_json(args.out, report)
    for suite in {r["suite"] for r in results}:
        figures = ratios([r for r in results if r["suite"] == suite])
        if figures:  # none where one tool ran alone (--tools)
            report.setdefault("ratios", {})[suite] = figures
    _bench.write_json(args.out, report)
    print(json.dumps(report.get("ratios", {}), indent=1))


if __name__ == "__main__":
    main()
