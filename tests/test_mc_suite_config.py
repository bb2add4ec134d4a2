"""``configs/mc_suite.jsonnet``: a ``-D`` value that cannot be right is refused in one line before
any step starts — a negative ``limit`` (refused by ``gpt2_piqa.jsonnet`` too), a task listed twice
(was a Jsonnet duplicate-field traceback), a misspelled task or a task without data anywhere in
``-D tasks`` (was refused only when its step ran, after the tasks before it were scored)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from tango.common import Params
from tango.common.exceptions import ConfigurationError
from tango.step_graph import StepGraph

REPO_ROOT = Path(__file__).resolve().parents[1]
MC_SUITE = REPO_ROOT / "configs" / "mc_suite.jsonnet"
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "tasks"
DEFAULTS = yaml.safe_load((REPO_ROOT / "tango.yml").read_text())["environment"]


def evaluate(config: Path, **variables: str) -> dict:
    return Params.from_file(config, ext_vars={**DEFAULTS, **variables}).as_dict()


def assert_one_line(message: str, fragment: str) -> None:
    lines = [line for line in message.splitlines() if fragment in line]
    assert lines, message


@pytest.mark.parametrize("config", ["gpt2_piqa.jsonnet", "mc_suite.jsonnet"])
def test_a_negative_limit_is_refused_by_both_configs(config: str) -> None:
    with pytest.raises(RuntimeError) as error:  # mc_suite took it for "all documents"
        evaluate(REPO_ROOT / "configs" / config, limit="-1")
    assert_one_line(str(error.value), "limit must be 0 (all examples) or positive")
    assert_one_line(str(error.value), "got -1")


def test_mc_suites_limit_is_a_count_or_a_fraction_as_lm_evals() -> None:
    steps = evaluate(MC_SUITE, tasks="copa", limit="0.25")["steps"]
    assert steps["requests_copa"]["task"]["limit"] == steps["scores_copa"]["task"]["limit"] == 0.25
    with pytest.raises(RuntimeError) as error:
        evaluate(MC_SUITE, tasks="copa", limit="2.5")
    assert_one_line(str(error.value), "a fraction of each task's below 1 (0.1), got 2.5")


def test_a_task_listed_twice_is_refused_in_one_line() -> None:
    with pytest.raises(RuntimeError) as error:
        evaluate(MC_SUITE, tasks="arc_easy,copa,arc_easy,copa,piqa")
    assert_one_line(str(error.value), "-D tasks lists arc_easy, copa more than once; list each")
    assert "duplicate field" not in str(error.value).lower()


@pytest.mark.parametrize("train_steps", ["0", "3"])
@pytest.mark.parametrize(
    ("variables", "fragment"),
    [
        (
            {"tasks": "piqa,copa,arc_eesy"},
            "unknown lm-eval task 'arc_eesy'; did you mean 'arc_easy'",
        ),
        (
            {"tasks": "piqa,copa,arc_challenge", "task_data_dir": str(FIXTURES)},
            f"task 'arc_challenge': data_dir '{FIXTURES}/arc_challenge' holds no <split>.jsonl",
        ),
    ],
)
def test_every_task_is_checked_when_the_steps_are_built(
    tiny_model_dir: Path, train_steps: str, variables: dict, fragment: str
) -> None:
    """``tango run`` builds every step (and its task specs) before it runs any."""
    config = {"model": str(tiny_model_dir), "train_steps": train_steps, **variables}
    params = Params.from_file(MC_SUITE, ext_vars={**DEFAULTS, **config})
    with pytest.raises(ConfigurationError) as error:
        StepGraph.from_params(params.pop("steps"))
    assert fragment in str(error.value) and "\n" not in str(error.value)


def test_mc_suite_evaluates_unless_training_is_asked_for() -> None:
    """tango.yml's ``train_steps: ""`` is each config's own default: mc_suite evaluates only."""
    assert "trained_model" not in evaluate(MC_SUITE)["steps"]
    trained = evaluate(MC_SUITE, train_steps="3")["steps"]["trained_model"]
    assert trained["train_steps"] == 3
    main = evaluate(REPO_ROOT / "configs" / "gpt2_piqa.jsonnet")["steps"]["trained_model"]
    assert main["train_steps"] == 2000


def test_the_official_piqa_files_are_read_through_a_piqa_step() -> None:
    """``-D data_dir`` (the main config's official PIQA files): task piqa reads them, the other
    tasks keep their ``task_data_dir`` folders; without it there is no ``piqa`` step."""
    steps = evaluate(
        MC_SUITE, tasks="piqa,copa", data_dir="/data/piqa", task_data_dir="/data/tasks"
    )["steps"]
    assert steps["piqa"] == {"type": "tango_fairscale::piqa", "data_dir": "/data/piqa"}
    assert steps["scores_piqa"]["task"]["dataset"] == {"type": "ref", "ref": "piqa"}
    assert "data_dir" not in steps["scores_piqa"]["task"]
    assert steps["scores_copa"]["task"]["data_dir"] == "/data/tasks/copa"
    for task in ("piqa", "copa"):  # each task's requests built by a step of its own, same task
        requests = steps[f"requests_{task}"]
        assert requests == {"type": "tango_fairscale::task_requests", "task": requests["task"]}
        assert requests["task"] == steps[f"scores_{task}"]["task"]
        assert steps[f"scores_{task}"]["requests"] == {"type": "ref", "ref": f"requests_{task}"}
    assert "piqa" not in evaluate(MC_SUITE, tasks="piqa,copa")["steps"]
    trained = evaluate(MC_SUITE, tasks="copa", data_dir="/data/piqa", train_steps="3")["steps"]
    assert trained["trained_model"]["task"]["dataset"] == {"type": "ref", "ref": "piqa"}


def test_an_empty_num_fewshot_is_each_tasks_own() -> None:
    """``-D num_fewshot=`` (what ``tango-fairscale eval`` passes without ``--num_fewshot``, as
    ``lm_eval`` defaults): no count in the task spec, so each task's YAML count holds (gsm8k: 5,
    copa: none, 0)."""
    from tango_fairscale.tasks.lm_eval import TaskSpec, load_tasks

    variables = {"tasks": "copa,gsm8k", "num_fewshot": "", "task_data_dir": str(FIXTURES)}
    steps = evaluate(MC_SUITE, **variables)["steps"]
    for task, count in (("gsm8k", 5), ("copa", 0)):
        spec = steps[f"scores_{task}"]["task"]
        assert spec["num_fewshot"] is None
        loaded = load_tasks(TaskSpec(**spec))["tasks"][task]
        assert loaded.get_config("num_fewshot") == count
    assert evaluate(MC_SUITE, tasks="gsm8k")["steps"]["scores_gsm8k"]["task"]["num_fewshot"] == 0


def test_lm_evals_chat_formatting_reaches_every_task() -> None:
    """``-D apply_chat_template`` / ``fewshot_as_multiturn`` / ``system_instruction``: lm-eval's
    chat settings on every task's spec (tango.yml's defaults: none of them set), each scores step
    building its own requests; few-shot turns without a chat template, or a value that is not
    true or false, refused in one line."""
    steps = evaluate(MC_SUITE, tasks="copa")["steps"]
    assert {"apply_chat_template", "fewshot_as_multiturn", "system_instruction"}.isdisjoint(
        steps["scores_copa"]["task"]
    )
    chat = {"apply_chat_template": "true", "system_instruction": "Be brief."}
    for multiturn, expected in (("", {}), ("false", {"fewshot_as_multiturn": False})):
        variables = {"tasks": "copa,arc_easy", "fewshot_as_multiturn": multiturn, **chat}
        steps = evaluate(MC_SUITE, **variables)["steps"]
        for task in ("copa", "arc_easy"):
            spec = steps[f"scores_{task}"]["task"]
            assert spec["apply_chat_template"] is True and spec["system_instruction"] == "Be brief."
            assert {k: spec[k] for k in expected} == expected
            assert ("fewshot_as_multiturn" in spec) == bool(expected)
            # the prompts depend on the model's tokenizer: no requests built for every model
            assert {"requests", "tokens"}.isdisjoint(steps[f"scores_{task}"])
            assert f"requests_{task}" not in steps and f"tokens_{task}" not in steps
    with pytest.raises(RuntimeError) as refused:
        evaluate(MC_SUITE, fewshot_as_multiturn="true")
    assert_one_line(str(refused.value), "fewshot_as_multiturn=true needs -D apply_chat_template")
    with pytest.raises(RuntimeError) as refused:
        evaluate(MC_SUITE, apply_chat_template="yes")
    assert_one_line(str(refused.value), '-D apply_chat_template must be true or false, got "yes"')


def test_the_fewshot_seed_picks_the_examples_as_lm_evals_seed_does() -> None:
    """``-D fewshot_seed`` (``tango-fairscale eval --seed``) reaches every task spec, and lm-eval
    draws other few-shot examples with it; the default, lm-eval's 1234, is no key of its own."""
    from tango_fairscale.tasks.lm_eval import TaskSpec, load_tasks

    variables = {"tasks": "copa", "num_fewshot": "2", "task_data_dir": str(FIXTURES)}
    contexts = {}
    for seed in ("1234", "7"):
        spec = evaluate(MC_SUITE, fewshot_seed=seed, **variables)["steps"]["scores_copa"]["task"]
        assert spec.get("fewshot_seed", 1234) == int(seed)
        task = load_tasks(TaskSpec(**spec))["tasks"]["copa"]
        task.build_all_requests(limit=2, rank=0, world_size=1)
        contexts[seed] = [instance.arguments[0] for instance in task.instances]
    assert "fewshot_seed" not in evaluate(MC_SUITE, **variables)["steps"]["scores_copa"]["task"]
    assert contexts["1234"] != contexts["7"]


def test_an_include_path_reaches_every_task_and_its_tasks_are_found_there(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """``-D include_path`` (``tango-fairscale eval --include_path``): every task spec takes it,
    and ``tango run`` builds a step graph whose task comes from the folder's YAML, beside lm-eval's
    own; with a task data folder, a name found there is no "unknown task" of the input check."""
    import sys

    from tango_fairscale.inputs import check_inputs

    sys.path.insert(0, str(FIXTURES))
    from lm_eval_fixtures import write_task_yaml

    folder = tmp_path / "custom"
    write_task_yaml("copa", folder, name="my_copa")
    config = {"model": str(tiny_model_dir), "tasks": "my_copa,arc_easy"}
    steps = evaluate(MC_SUITE, include_path=str(folder), **config)["steps"]
    assert {steps[f"scores_{t}"]["task"]["include_path"] for t in ("my_copa", "arc_easy")} == {
        str(folder)
    }
    with_data = {**config, "tasks": "my_copa", "task_data_dir": str(tmp_path / "data")}
    with pytest.raises(ConfigurationError, match="^no task data: .* for my_copa"):
        check_inputs(evaluate(MC_SUITE, include_path=str(folder), **with_data)["steps"])
    ext_vars = {**DEFAULTS, **config, "include_path": str(folder)}
    graph = StepGraph.from_params(Params.from_file(MC_SUITE, ext_vars=ext_vars).pop("steps"))
    found = graph["scores_my_copa"].kwargs["task"].yaml_file
    assert found == str(folder.resolve() / "my_copa.yaml")
    assert graph["scores_arc_easy"].kwargs["task"].yaml_file is None
    assert "include_path" not in evaluate(MC_SUITE, **config)["steps"]["scores_arc_easy"]["task"]


def test_gen_kwargs_reach_every_task_as_an_object(tiny_model_dir: Path) -> None:
    """``-D gen_kwargs`` (a JSON object, ``tango-fairscale eval --gen_kwargs``) reaches every
    task spec (``tasks/test_requests.py`` shows lm-eval's requests with them)."""
    variables = {"tasks": "gsm8k,copa", "task_data_dir": str(FIXTURES)}
    variables["model"] = str(tiny_model_dir)
    given = '{"max_gen_toks": 5, "until": ["Q:"]}'
    steps = evaluate(MC_SUITE, gen_kwargs=given, **variables)["steps"]
    for task in ("gsm8k", "copa"):
        assert steps[f"scores_{task}"]["task"]["gen_kwargs"] == {"max_gen_toks": 5, "until": ["Q:"]}
        assert steps[f"requests_{task}"]["task"] == steps[f"scores_{task}"]["task"]
    assert "gen_kwargs" not in evaluate(MC_SUITE, **variables)["steps"]["scores_gsm8k"]["task"]
    with pytest.raises(RuntimeError) as error:  # lm_eval's key=value form is no JSON
        evaluate(MC_SUITE, gen_kwargs="max_gen_toks:5", **variables)
    assert_one_line(str(error.value), '-D gen_kwargs must be a JSON object, e.g. {"max_gen_toks"')
    graph = StepGraph.from_params(
        Params.from_file(MC_SUITE, ext_vars={**DEFAULTS, **variables, "gen_kwargs": given}).pop(
            "steps"
        )
    )
    assert graph["scores_gsm8k"].kwargs["task"].gen_kwargs == {"max_gen_toks": 5, "until": ["Q:"]}
