"""``tango-fairscale eval`` (``tango_fairscale.eval_cli``): lm-eval's command line over
``configs/mc_suite.jsonnet``. Bad arguments are refused in one line before any work; the results
JSON lands where lm-eval 0.4.13's ``EvaluationTracker`` puts it. As a command on two fixture
tasks (it prints lm-eval's table, loads the model once, and ``tango run configs/mc_suite.jsonnet``
with the same settings in the same workspace starts no step and gives the same metrics):
``tests/integration/commands/test_eval_command.py``."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from conftest import make_piqa_dir

from tango_fairscale.cli import main
from tango_fairscale.eval_cli import per_model, tango_arguments
from tango_fairscale.eval_results import new_date_id, write_results

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "tasks"


def eval_args(*args: str) -> argparse.Namespace:
    """The parsed ``eval`` arguments of one model: its settings as :func:`tango_arguments` reads
    them (``--model_args`` not yet resolved)."""
    from tango_fairscale.cli import build_parser

    parsed = build_parser().parse_args(["eval", *args])
    return argparse.Namespace(**vars(parsed), model=(parsed.models or [None])[0])


def one_model(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` once its ``--model_args`` are resolved: the settings of its one model."""
    (model,) = per_model(args)
    return model


def assert_one_line_error(code: int, err: str, fragment: str) -> None:
    assert code == 2
    assert err.startswith("tango-fairscale: error: ") and err.count("\n") == 1, err
    assert fragment in err, err


@pytest.mark.parametrize(
    ("tasks", "model", "fragment"),
    [
        ("copa,arc_eesy", None, "unknown lm-eval task 'arc_eesy'; did you mean 'arc_easy'"),
        ("copa,copa", None, "-D tasks lists copa more than once; list each task once"),
        (
            "copa",
            "/no/such/model",
            "cannot load model from path '/no/such/model' (no such directory); give --model DIR",
        ),
    ],
)
def test_what_cannot_run_is_refused_in_one_line_before_any_work(
    tmp_path: Path,
    tiny_model_dir: Path,
    capsys: pytest.CaptureFixture[str],
    tasks: str,
    model: str | None,
    fragment: str,
) -> None:
    workspace = tmp_path / "workspace"
    code = main(
        ["eval", "--model", model or str(tiny_model_dir), "--tasks", tasks]
        + ["--task_data_dir", str(FIXTURES), "-w", str(workspace)]
    )
    out, err = capsys.readouterr()
    assert_one_line_error(code, err, fragment)
    assert out == "" and not workspace.exists()  # no run was started


def test_an_output_path_that_cannot_be_written_is_refused_before_any_work(
    tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("")
    workspace = tmp_path / "workspace"
    code = main(
        ["eval", "--model", str(tiny_model_dir), "--tasks", "copa", "-w", str(workspace)]
        + ["--task_data_dir", str(FIXTURES), "--output_path", str(tmp_path / "file" / "results")]
    )
    assert_one_line_error(code, capsys.readouterr().err, f"--output_path {tmp_path}/file/results")
    assert not workspace.exists()


def test_every_models_refusals_come_before_any_models_work(
    tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workspace = tmp_path / "workspace"
    settings = ["--tasks", "copa", "--task_data_dir", str(FIXTURES), "-w", str(workspace)]
    code = main(["eval", "--model", str(tiny_model_dir), "/no/such/model", *settings])
    assert_one_line_error(code, capsys.readouterr().err, "cannot load model from path '/no/such")
    assert not workspace.exists()  # the first model was not evaluated either
    code = main(["eval", "-M", "a", "b", *settings, "--output_path", str(tmp_path / "r.json")])
    fragment = f"--output_path {tmp_path}/r.json is one file, and 2 models were given: give a"
    assert_one_line_error(code, capsys.readouterr().err, fragment)


def test_a_failing_model_names_itself_and_the_models_left(
    tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The second of three models fails in its run (its weights are not a model's): the command
    exits with the run's code and says which model failed and which were not evaluated."""
    import shutil

    broken, third = tmp_path / "broken", tmp_path / "third"
    shutil.copytree(tiny_model_dir, broken)
    shutil.copytree(tiny_model_dir, third)
    for weights in broken.glob("*.safetensors"):
        weights.write_bytes(b"not weights")
    workspace = tmp_path / "workspace"
    code = main(
        ["eval", "--model", str(tiny_model_dir), str(broken), str(third)]
        + ["--tasks", "copa", "--limit", "2", "--task_data_dir", str(FIXTURES)]
        + ["-w", str(workspace), "--device", "cpu"]
    )
    err = capsys.readouterr().err
    assert code != 0
    assert f"model 2 of 3 ({broken}) failed; not evaluated: {third}" in err, err


def test_a_model_named_twice_by_two_paths_is_refused(
    tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["eval", "-M", str(tiny_model_dir), f"{tiny_model_dir}/.", "--tasks", "copa"])
    fragment = f"--model lists {tiny_model_dir} more than once; list each model once"
    assert_one_line_error(code, capsys.readouterr().err, fragment)


def test_a_hub_id_neither_reachable_nor_cached_is_refused_in_eval_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import huggingface_hub.constants as hub

    from tango_fairscale.model import fingerprint

    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub"))
    fingerprint.hub_revision.cache_clear()
    workspace = tmp_path / "workspace"
    code = main(["eval", "--model", "no-org/no-model", "--tasks", "copa", "-w", str(workspace)])
    fragment = "cannot load model 'no-org/no-model': neither a local directory nor reachable on "
    assert_one_line_error(code, capsys.readouterr().err, fragment + "the hub")
    assert not workspace.exists()
    fingerprint.hub_revision.cache_clear()


def test_a_tokenizer_without_a_chat_template_is_refused_before_any_models_work(
    tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workspace, output = tmp_path / "workspace", tmp_path / "out"
    code = main(
        ["eval", "-M", str(tiny_model_dir), "--tasks", "copa", "--apply_chat_template"]
        + ["--task_data_dir", str(FIXTURES), "-w", str(workspace), "--output_path", str(output)]
    )
    fragment = f"--apply_chat_template: the tokenizer of {tiny_model_dir} has no chat template"
    assert_one_line_error(code, capsys.readouterr().err, fragment)
    assert not workspace.exists() and not output.exists()  # no run, no results folder


def test_the_results_folder_is_the_whole_model_path_as_lm_evals_command_line_names_it() -> None:
    """lm_eval's command line passes ``--model_args`` as a dict: a model path with a comma names
    its results folder whole (a ``pretrained=...`` string would be cut at the comma)."""
    from lm_eval.loggers.evaluation_tracker import GeneralConfigTracker

    from tango_fairscale.eval_results import experiment_fields

    model = "runs/lr3e-4,bs64/step1000"
    ours = experiment_fields(eval_args("--model", model, "--tasks", "copa"), 0.0)
    theirs = GeneralConfigTracker()
    theirs.log_experiment_args("hf", {"pretrained": model}, None, None, False)
    assert ours.model_name == theirs.model_name == model
    assert ours.model_name_sanitized == theirs.model_name_sanitized


def test_log_samples_without_an_output_path_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workspace = tmp_path / "workspace"
    code = main(["eval", "--model", "m", "--tasks", "copa", "-w", str(workspace), "-s"])
    assert_one_line_error(code, capsys.readouterr().err, "--log_samples needs --output_path")
    assert not workspace.exists()


def test_the_tango_command_line_is_mc_suite_with_its_variables() -> None:
    args = eval_args(
        "--model",
        "/m",
        "--tasks",
        "copa, arc_easy",
        "--limit",
        "4",
        "--batch_size",
        "64",
        "--seed",
        "0,1234,1234,5",
        "--include_path",
        "/my/tasks",
    )
    argv = tango_arguments(args, "/ws", "eval-x")
    config = str(REPO_ROOT / "configs" / "mc_suite.jsonnet")
    assert argv[:4] == ["--settings", str(REPO_ROOT / "tango.yml"), "run", config]
    assert argv[4:8] == ["-w", "/ws", "-n", "eval-x"]
    defines = [argv[i + 1] for i, arg in enumerate(argv) if arg == "-D"]
    assert defines == [
        "model=/m",
        "tasks=copa,arc_easy",
        "num_fewshot=",  # each task's own, as lm_eval's default
        "limit=4",
        "train_steps=0",
        "fewshot_seed=5",  # lm_eval's fourth seed
        "include_path=/my/tasks",
    ]
    overrides = json.loads(argv[argv.index("-o") + 1])  # the scoring batch size: not in the key
    assert overrides == {"steps.scores_copa.batch_size": 64, "steps.scores_arc_easy.batch_size": 64}


def test_piqas_official_release_in_the_task_data_is_read_as_the_configs_data_dir(
    tmp_path: Path,
) -> None:
    """``--task_data_dir DIR`` with the official PIQA files in ``DIR/piqa`` (as ``tango run``'s
    ``data_dir`` takes them): the config reads them with their own reader; other tasks' folders,
    and a ``piqa`` folder of ``<split>.jsonl`` documents, stay task data."""

    def defines(tasks: str) -> list[str]:
        argv = tango_arguments(
            eval_args("-M", "/m", "-t", tasks, "--task_data_dir", str(tmp_path)), "/ws", "x"
        )
        return [argv[i + 1] for i, arg in enumerate(argv) if arg == "-D"]

    release = make_piqa_dir(tmp_path / "piqa")
    assert f"data_dir={release}" in defines("copa,piqa")
    assert f"task_data_dir={tmp_path}" in defines("copa,piqa")
    assert not any(define.startswith("data_dir=") for define in defines("copa"))
    (release / "valid-labels.lst").unlink()
    assert not any(define.startswith("data_dir=") for define in defines("piqa"))


def test_lm_evals_gen_kwargs_become_a_json_object() -> None:
    """``--gen_kwargs`` in lm_eval's forms (``k=v,k2=[...]``, apart, or JSON): one JSON object in
    ``-D gen_kwargs``, the values read as lm_eval reads them."""
    from tango_fairscale.eval_options import take_gen_kwargs

    expected = {"max_gen_toks": 64, "until": ["Q:", "A:"], "do_sample": False}
    for given in (
        ['max_gen_toks=64,until=["Q:","A:"],do_sample=False'],
        ["max_gen_toks=64", 'until=["Q:","A:"]', "do_sample=False"],
        [json.dumps(expected)],
    ):
        args = eval_args("--model", "/m", "--tasks", "gsm8k", "--gen_kwargs", *given)
        take_gen_kwargs(args)
        argv = tango_arguments(args, "/ws", "eval-x")
        defines = [argv[i + 1] for i, arg in enumerate(argv) if arg == "-D"]
        assert json.loads(defines[-1].removeprefix("gen_kwargs=")) == expected, given


def test_lm_evals_hf_command_line_names_the_model_its_dtype_and_batch_size() -> None:
    """``lm_eval --model hf --model_args pretrained=...,dtype=... --batch_size auto`` with the
    program name changed: the same config variables as ``--model PATH --precision P``."""
    from tango_fairscale.eval_options import take_model_args

    model_args = ["--model", "hf", "--model_args", "pretrained=/m,dtype=bfloat16"]
    for batch_size in ("auto", "auto:4"):
        args = eval_args(*model_args, "--tasks", "copa", "--batch_size", batch_size)
        assert args.batch_size is None  # the package's default batches
    take_model_args(args)
    plain = eval_args("--model", "/m", "--tasks", "copa", "--precision", "bf16-true")
    assert tango_arguments(one_model(args), "/ws", "x") == tango_arguments(plain, "/ws", "x")
    # lm_eval's other spellings: space-separated or JSON model arguments, hf as the default
    # model, tasks separated by spaces, its short options.
    for spelling in (
        ["-M", "hf", "-a", "pretrained=/m", "dtype=bfloat16", "-t", "copa"],
        ["--model_args", '{"pretrained": "/m", "dtype": "bfloat16"}', "--tasks", "copa"],
    ):
        args = eval_args(*spelling)
        take_model_args(args)
        assert tango_arguments(one_model(args), "/ws", "x") == tango_arguments(plain, "/ws", "x")
    assert eval_args("--model", "m", "--tasks", "copa", "arc_easy,piqa").tasks == [
        "copa",
        "arc_easy",
        "piqa",
    ]
    chat = ["--apply_chat_template", "--fewshot_as_multiturn", "false"]
    chat += ["--system_instruction", "Be brief."]
    argv = tango_arguments(eval_args("-M", "/m", "-t", "copa", *chat), "/ws", "x")
    defines = [argv[i + 1] for i, arg in enumerate(argv) if arg == "-D"]
    assert defines[-3:] == [
        "system_instruction=Be brief.",
        "apply_chat_template=true",
        "fewshot_as_multiturn=false",
    ]
    for dtype, precision in (("float32", "32-true"), ("auto", "auto")):
        args = eval_args(*model_args[:3], f"pretrained=/m,dtype={dtype}", "--tasks", "copa")
        take_model_args(args)
        assert (args.models, args.precision) == (["/m"], precision)


@pytest.mark.parametrize(
    ("option", "fragment"),
    [
        (["--model", "hf"], "--model hf names lm-eval's Hugging Face backend: give the model as"),
        (["-M", "a", "b", "a"], "--model lists a more than once; list each model once"),
        (["-M", "a", "-M", "b", "--model", "a"], "--model lists a more than once; list each"),
        ([], "give the model: --model PATH_OR_ID, or lm_eval's --model_args pretrained="),
        (
            ["--model_args", "{'pretrained': 1}"],
            "--model_args: Invalid JSON: {'pretrained': 1}.",
        ),
        (["-M", "m", "--apply_chat_template", "chatml"], "templates are not chosen by name here"),
        (["-M", "m", "--fewshot_as_multiturn"], "--fewshot_as_multiturn needs --apply_chat"),
        (["-M", "m", "--system_instruction", "a=b"], "'=' in 'a=b': Tango's -D values cannot"),
        (["-M", "m", "--gen_kwargs", "{max_gen_toks: 5}"], "--gen_kwargs: Invalid JSON: {max_"),
        (["-M", "m", "--gen_kwargs", "max_gen_toks"], "--gen_kwargs: expected `key=value`, got"),
        (["--model", "m", "--model_args", "pretrained=/m"], "--model_args goes with lm_eval's"),
        (["--model", "hf", "--model_args", "dtype=float32"], "names no model: give pretrained="),
        (
            ["--model", "hf", "--model_args", "pretrained=/m,revision=main,parallelize=True"],
            "--model_args: revision, parallelize not taken (taken: pretrained, dtype,",
        ),
        (
            ["--model", "hf", "--model_args", "pretrained=/m,trust_remote_code=True"],
            "models are loaded without running code from their files",
        ),
        (
            ["--model", "hf", "--model_args", "pretrained=/m,dtype=float16"],
            "dtype=float16: take float32, bfloat16 or auto, or --precision",
        ),
        (
            ["--model", "hf", "--model_args", "pretrained=/m,dtype=float32"]
            + ["--precision", "bf16-mixed"],
            "dtype=float32 is --precision 32-true, and --precision bf16-mixed was given",
        ),
    ],
)
def test_lm_evals_model_arguments_that_cannot_be_taken_are_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: list[str], fragment: str
) -> None:
    workspace = tmp_path / "workspace"
    code = main(["eval", *option, "--tasks", "copa", "-w", str(workspace)])
    assert_one_line_error(code, capsys.readouterr().err, fragment)
    assert not workspace.exists()


def test_the_device_is_chosen_through_cuda_visible_devices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--device cpu`` hides the GPUs; ``cuda:N`` keeps the N-th visible one, refused in one
    line where there is none (this machine: no GPU at all)."""
    import torch

    from tango_fairscale.eval_options import EvalError, use_device

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    use_device("cpu")
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""
    if torch.cuda.is_available():
        pytest.skip("the refusal needs a machine without a GPU")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,7")
    with pytest.raises(EvalError, match="--device cuda:1: this machine has no such GPU visible"):
        use_device("cuda:1")
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "7"
    with pytest.raises(EvalError, match="--device cuda:2: this machine has no such GPU"):
        use_device("cuda:2")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_device_cuda_n_leaves_that_gpu_alone_visible() -> None:
    """On a GPU machine, in a fresh process (CUDA not started): ``--device cuda:0`` leaves one
    GPU visible to scoring; an index past the last GPU is refused in one line."""
    count = torch.cuda.device_count()
    script = (
        "import torch\n"
        "from tango_fairscale.eval_options import EvalError, use_device\n"
        "try:\n"
        "    use_device(DEVICE)\n"
        "except EvalError as error:\n"
        "    print(error)\n"
        "else:\n"
        "    print(torch.cuda.device_count())\n"
    )
    for device, printed in (("cuda:0", "1"), (f"cuda:{count}", "this machine has no such GPU")):
        done = subprocess.run(
            [sys.executable, "-c", script.replace("DEVICE", repr(device))],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert printed in done.stdout, done.stdout


def test_the_results_name_the_chat_template_the_prompts_were_written_in(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    import shutil

    from tango_fairscale.eval_results import chat_template

    assert chat_template(str(tiny_model_dir)) is None
    model = tmp_path / "chat"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    config["chat_template"] = template
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    assert chat_template(str(model)) == template


@pytest.mark.parametrize("output", ["out.json", "results", "nested/dir"])
def test_the_results_file_is_where_lm_eval_writes_it(tmp_path: Path, output: str) -> None:
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.loggers.evaluation_tracker import GeneralConfigTracker

    base = {"results": {"copa": {"acc,none": 0.5}}, "versions": {"copa": 1}}
    model_args = "pretrained=/models/tiny:v1"
    tracker = EvaluationTracker(output_path=str(tmp_path / "lm_eval" / output))
    tracker.general_config_tracker.log_experiment_args("hf", model_args, None, None, False)
    tracker.save_results_aggregated(results=dict(base), samples=None)
    config = GeneralConfigTracker()
    config.log_experiment_args("tango_fairscale", model_args, None, None, False)
    ours = write_results(
        {**base, "task_hashes": {}, **asdict(config)},
        str(tmp_path / "ours" / output),
        new_date_id(),
    )

    def layout(root: Path) -> list[str]:
        files = [str(path.relative_to(root)) for path in root.rglob("*") if path.is_file()]
        return [re.sub(r"\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d\.\d+", "DATE", file) for file in files]

    assert layout(tmp_path / "ours") == layout(tmp_path / "lm_eval") != []
    theirs = json.loads(next((tmp_path / "lm_eval").rglob("*.json")).read_text())
    assert set(theirs) <= set(json.loads(ours.read_text()))
