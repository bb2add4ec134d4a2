"""``tango-fairscale eval`` as a command on two fixture tasks and two models (two commands, ~10 s
each). Its arguments (lm_eval's command line for its Hugging Face backend among them) and results
file are ``tests/test_eval_cli.py``."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from helpers.commands import run_command
from test_eval_cli import FIXTURES


def lm_evals_logged_samples(tasks: list[str], limit: int) -> dict[str, dict[int, dict]]:
    """lm-eval's own logged samples of the fixture tasks, by task and ``doc_id``, from a model
    that answers every request alike (documents, prompts and targets do not depend on it)."""
    import lm_eval
    from conftest import lm_eval_as_released
    from lm_eval.api.model import LM

    sys.path.insert(0, str(FIXTURES))
    from lm_eval_fixtures import task_config, task_manager

    class Constant(LM):
        def loglikelihood(self, requests: list, disable_tqdm: bool = False) -> list:
            return [(0.0, False)] * len(requests)

        def loglikelihood_rolling(self, requests: list, disable_tqdm: bool = False) -> list:
            return [0.0] * len(requests)

        def generate_until(self, requests: list, disable_tqdm: bool = False) -> list:
            return [""] * len(requests)

    with lm_eval_as_released():
        output = lm_eval.simple_evaluate(
            model=Constant(),
            tasks=[task_config(task) for task in tasks],
            task_manager=task_manager(),
            limit=limit,
            log_samples=True,
            bootstrap_iters=0,
        )
    return {
        task: {sample["doc_id"]: sample for sample in samples}
        for task, samples in output["samples"].items()
    }


@pytest.mark.slow  # two commands, ~10 s each
def test_eval_is_mc_suite_with_lm_eval_output(tmp_path: Path, tokenizer_dir: Path) -> None:
    from conftest import save_tiny_gpt2
    from tango import Workspace

    model = save_tiny_gpt2(tmp_path / "model", tokenizer_dir, n_positions=256)
    checkpoint = save_tiny_gpt2(tmp_path / "checkpoint", tokenizer_dir, seed=2, n_positions=256)
    workspace, out = tmp_path / "workspace", tmp_path / "out"
    settings = ["--tasks", "copa,arc_easy", "--limit", "4", "--task_data_dir", str(FIXTURES)]
    settings += ["--precision", "32-true", "--batch_size", "auto", "--device", "cpu"]
    # two models in one command: each scored in turn, on requests built once
    command = [sys.executable, "-m", "tango_fairscale", "eval", "--model", str(model)]
    command += [str(checkpoint), *settings, "-w", str(workspace), "--output_path", str(out), "-s"]
    done = run_command(command)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    # stdout holds lm_eval's header and table alone (Tango's log goes to stderr, as lm_eval's)
    header = f"tango_fairscale ({ {'pretrained': str(model)} }), gen_kwargs: ({{}}), limit: 4.0"
    assert done.stdout.startswith(header) and "Starting step" in done.stderr, done.stdout[:2000]
    assert f"\ntango_fairscale ({ {'pretrained': str(checkpoint)} })" in done.stdout
    rows = [line for line in done.stdout.splitlines() if line.startswith("|")]
    cells = [[cell.strip() for cell in row.split("|")[1:-1]] for row in rows]
    assert cells[0][:5] == ["Tasks", "Version", "Filter", "n-shot", "Metric"]
    assert {row[0] for row in cells[2:]} >= {"copa", "arc_easy"}
    assert [row[0] for row in cells].count("Tasks") == 2  # a table for each model
    assert output.count("Loading weights: 100%") == 2  # transformers' bar: one load a model
    assert len(re.findall(r"^loaded .* shared by this command", output, re.MULTILINE)) == 2
    for task in ("copa", "arc_easy"):  # the requests built once, scored by each model
        assert output.count(f'Starting step "requests_{task}"') == 1
        assert output.count(f'Starting step "scores_{task}"') == 2

    (written,) = out.glob(f"{str(model).replace('/', '__')}/results_*.json")
    (other,) = out.glob(f"{str(checkpoint).replace('/', '__')}/results_*.json")
    assert json.loads(other.read_text())["model_name"] == str(checkpoint)
    results = json.loads(written.read_text())
    assert results["config"]["model_args"] == {"pretrained": str(model)}  # as lm-eval types it
    assert results["config"]["precision"] == "32-true"
    assert results["config"]["limit"] == 4.0 and "groups" not in results
    assert results["configs"]["copa"]["task"] == "copa"  # lm-eval's task configs
    assert results["lm_eval_version"] == "0.4.13" and results["transformers_version"] >= "5"
    assert results["model_name"] == str(model) and results["n-samples"]["copa"]["effective"] == 4
    assert results["max_length"] == 256  # lm-eval's tokenizer fields, as the scores steps saw them
    assert results["tokenizer_pad_token"][1] == str(results["eot_token_id"])
    # --log_samples: lm-eval's samples files beside the results, one line a document, with
    # lm-eval's own documents and hashes
    date = written.stem.removeprefix("results_")
    logged = lm_evals_logged_samples(["copa", "arc_easy"], limit=4)
    for task in ("copa", "arc_easy"):
        lines = (written.parent / f"samples_{task}_{date}.jsonl").read_text().splitlines()
        samples = [json.loads(line) for line in lines]
        assert [sample["doc_id"] for sample in samples] == [0, 1, 2, 3]
        for sample in samples:
            expected = logged[task][sample["doc_id"]]
            assert list(sample) == list(expected)  # lm-eval's keys in its order
            for key in ("doc", "doc_hash", "prompt_hash", "target_hash", "filter", "metrics"):
                assert sample[key] == expected[key], (task, key)
        choices = range(len(samples[0]["resps"]))  # arguments keyed as lm-eval keys them
        assert set(samples[0]["arguments"]) == {f"gen_args_{i}" for i in choices}
        accuracy = sum(sample["acc"] for sample in samples) / len(samples)
        assert accuracy == results["results"][task]["acc,none"]

    defines = {"model": model, "tasks": "copa,arc_easy", "limit": 4, "task_data_dir": FIXTURES}
    defines["precision"] = "32-true"
    defines["num_fewshot"] = ""  # no --num_fewshot: each task's own, as lm_eval
    tango = [sys.executable, "-m", "tango", "run", "configs/mc_suite.jsonnet", "-w", str(workspace)]
    tango += ["-n", "plain"] + [f"-D{name}={value}" for name, value in defines.items()]
    rerun = run_command(tango)
    assert rerun.returncode == 0, rerun.stderr[-4000:]
    assert "Starting step" not in rerun.stderr + rerun.stdout  # all from the cache
    assert "Loading weights" not in rerun.stderr + rerun.stdout
    metrics = Workspace.from_url(str(workspace)).step_result_for_run("plain", "metrics")
    for key in ("results", "n-samples", "n-shot", "versions", "higher_is_better", "configs"):
        assert metrics["lm_eval"][key] == results[key]


@pytest.mark.slow  # one command, ~8 s
def test_each_model_is_freed_before_the_next_one_loads(tmp_path: Path, tokenizer_dir: Path) -> None:
    """``eval --model A B`` in one process: after each model's run no loaded model is left
    (``shared_model``'s table of loaded models, counted as the command frees them)."""
    from conftest import save_tiny_gpt2

    models = [save_tiny_gpt2(tmp_path / f"m{seed}", tokenizer_dir, seed=seed) for seed in (1, 2)]
    arguments = ["eval", "--model", *map(str, models), "--tasks", "copa", "--limit", "2"]
    arguments += ["--task_data_dir", str(FIXTURES), "--device", "cpu", "-w", str(tmp_path / "w")]
    script = (
        "import sys\n"
        "from tango_fairscale import eval_cli\n"
        "from tango_fairscale.cli import main\n"
        "from tango_fairscale.evaluation import shared_model\n"
        "release = eval_cli.release_models\n"
        "def counted():\n"
        "    release()\n"
        "    print('models left loaded:', len(shared_model._LOADED), file=sys.stderr)\n"
        "eval_cli.release_models = counted\n"
        f"sys.exit(main({arguments!r}))\n"
    )
    done = run_command([sys.executable, "-c", script])
    assert done.returncode == 0, done.stderr[-4000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith(("loaded", "models"))]
    assert [line.split(" on ")[0] for line in lines] == [
        f"loaded {models[0]}",
        "models left loaded: 0",
        f"loaded {models[1]}",
        "models left loaded: 0",
    ]
