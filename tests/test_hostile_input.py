"""Hostile config and data: every bad input is a one-line error that names the field or file and
says what to change, raised before any expensive work — or a documented, tested behaviour.

Most cases go through the Python API as Tango builds the components (``Params`` /
``from_params`` / ``Lazy``, the steps' ``run``); two go through ``tango run`` for the Jsonnet
variables (``-D name=value``). Documented behaviours, not errors: texts longer than the model's
context are left-truncated as lm-eval does (``tango_fairscale.data.queries``); a line over
``MAX_LINE_BYTES`` in a PIQA file is refused (``tango_fairscale.tasks.piqa``).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import GOOD_FILES, line, make_piqa_dir, with_runtime
from helpers.commands import assert_tango_run_refuses
from tango import Step
from tango.common import Lazy, Params
from tango.common.dataset_dict import DatasetDict
from tango.common.exceptions import ConfigurationError
from tango.integrations.torch import Model, TrainConfig, TrainingEngine

from tango_fairscale.evaluation.steps import TaskMetricsStep, TaskScoresStep
from tango_fairscale.model.causal_lm import ModelWrapper
from tango_fairscale.parallel.precision import resolve_precision
from tango_fairscale.parallel.sharding import ShardingConfig
from tango_fairscale.tasks.lm_eval import TaskSpec
from tango_fairscale.tasks.piqa import MAX_LINE_BYTES, PiqaFormatError, read_piqa
from tango_fairscale.train.step import TrainStep

REPO_ROOT = Path(__file__).resolve().parents[1]


def one_line(error: BaseException, *fragments: str) -> str:
    """The error's message, asserted to be one line holding every fragment."""
    message = str(error)
    assert "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, message
    return message


def example(goal: str = "g", sol1: str = "a", sol2: str = "b", label: int = 0) -> dict:
    return {"goal": goal, "sol1": sol1, "sol2": sol2, "label": label}


def dataset(train: int = 32, validation: int = 4) -> DatasetDict:
    return DatasetDict(
        splits={
            "train": [example(f"t{i}", label=i % 2) for i in range(train)],
            "validation": [example(f"v{i}", label=i % 2) for i in range(validation)],
        }
    )


def build_engine(engine: dict[str, Any], tmp_path: Path) -> Any:
    """Construct an engine from its config as the training step does (model never built)."""
    params = {"optimizer": {"type": "torch::AdamW", "lr": 1e-3}, **engine}
    return Lazy(TrainingEngine, Params(params)).construct(
        train_config=TrainConfig("hostile", tmp_path), model=None
    )


def piqa(dataset_dict: DatasetDict | None = None) -> TaskSpec:
    """lm-eval's ``piqa`` over ``dataset_dict`` (default: :func:`dataset`)."""
    return TaskSpec(name="piqa", dataset=dataset_dict if dataset_dict is not None else dataset())


def train(dataset_dict: DatasetDict | None = None, **arguments: Any) -> Any:
    """``TrainStep.run``; its argument checks fail before the model is built or a process starts."""
    model = Lazy(Model, Params({"type": "tango_fairscale::causal_lm", "model": "never-loaded"}))
    engine = Lazy(TrainingEngine, Params({"type": "tango_fairscale::ddp"}))
    return TrainStep(step_name="hostile").run(
        model=model,
        engine=engine,
        task=piqa(dataset_dict),
        **with_runtime({"train_steps": 5, "batch_size": 8, **arguments}),
    )


@pytest.fixture(scope="module")
def short_model(tokenizer_dir: Path) -> ModelWrapper:
    """A randomly initialised 1-layer GPT-2 with a 16-token context."""
    from helpers.tokenizer import vocabulary_fields

    config = {"model_type": "gpt2", "n_layer": 1, "n_embd": 16, "n_head": 2, "n_positions": 16}
    config.update(vocabulary_fields(tokenizer_dir))
    return ModelWrapper(config=config, tokenizer=str(tokenizer_dir), seed=0)


# Unknown fields: Tango's error, plus the closest field and the fields taken (compat.py) --------


def test_unknown_sharding_field_suggests_the_closest(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError) as err:
        ShardingConfig.from_params(Params({"modules_to_wrapp": ["model\\.x"]}))
    one_line(err.value, "'modules_to_wrapp'", "did you mean 'modules_to_wrap'", "cpu_offload")


def test_unknown_field_inside_the_engine_sharding_block_is_not_swallowed(tmp_path: Path) -> None:
    # Tango used to report only "Failed to construct argument sharding with type ...".
    engine = {"type": "tango_fairscale::fairscale", "sharding": {"cpu_ofload": True}}
    with pytest.raises(ConfigurationError) as err:
        build_engine(engine, tmp_path)
    one_line(err.value, "ShardingConfig", "did you mean 'cpu_offload' for 'cpu_ofload'")


@pytest.mark.parametrize(
    "given, said",
    [
        (
            {"device_count": 2},
            "device_count belongs in the 'runtime' block: runtime: {device_count: ...}",
        ),
        (
            {"log_every": 1, "pack_sequences": None},
            "log_every, pack_sequences belong in the 'runtime' block: runtime: {log_every: ..., "
            "pack_sequences: ...}",
        ),
    ],
)
def test_a_runtime_key_at_the_steps_top_level_is_told_where_it_goes(
    given: dict, said: str, tiny_model_dir: Path
) -> None:
    from tango import Step

    config = {
        "type": "tango_fairscale::train",
        "model": {"type": "tango_fairscale::causal_lm", "model": str(tiny_model_dir)},
        "engine": {"type": "tango_fairscale::ddp"},
        "task": "piqa",
        "train_steps": 3,
        **given,
    }
    with pytest.raises(ConfigurationError) as err:
        Step.from_params(Params(config))
    one_line(err.value, "Extra parameters passed to TrainStep", said)


def test_unknown_engine_field_suggests_the_closest(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError) as err:
        build_engine({"type": "tango_fairscale::fsdp2", "precison": "32-true"}, tmp_path)
    one_line(err.value, "FSDP2Engine", "did you mean 'precision' for 'precison'", "sharding")


def test_unknown_step_field_suggests_the_closest() -> None:
    with pytest.raises(ConfigurationError) as err:
        Step.from_params(Params({"type": "tango_fairscale::piqa", "data_dri": "/data/piqa"}))
    one_line(err.value, "PiqaDataStep", "did you mean 'data_dir' for 'data_dri'", "limit")


def test_unknown_train_step_field_suggests_the_closest() -> None:
    config = {
        "type": "tango_fairscale::train",
        "model": {"type": "tango_fairscale::causal_lm", "model": "never-loaded"},
        "engine": {"type": "tango_fairscale::ddp", "optimizer": {"type": "torch::AdamW"}},
        "task": "piqa",
        "train_steps": 5,
        "grad_acum": 2,
    }
    with pytest.raises(ConfigurationError) as err:
        Step.from_params(Params(config))
    one_line(err.value, "TrainStep", "did you mean 'grad_accum' for 'grad_acum'")


def test_unknown_model_field_suggests_the_closest() -> None:
    params = Params({"type": "tango_fairscale::causal_lm", "modle": "gpt2"})
    with pytest.raises(ConfigurationError) as err:
        Lazy(Model, params).construct()
    one_line(err.value, "ModelWrapper", "did you mean 'model' for 'modle'")


def test_misspelled_engine_type_lists_the_registered_engines(tmp_path: Path) -> None:
    # Tango searches its integrations for an unknown name; the transformers one does not import
    # with the pinned transformers (raw ImportError before compat.py skips it).
    with pytest.raises(ConfigurationError) as err:
        build_engine({"type": "tango_fairscale::fairscal"}, tmp_path)
    one_line(err.value, "'tango_fairscale::fairscal' not in acceptable choices", "fairscale'")


# Wrong types and values in the engine and sharding config ---------------------------------------


def test_string_for_a_boolean_sharding_field(tmp_path: Path) -> None:
    # "false" is truthy: never silently true. From a config Tango's own check names the field;
    # from Python the dataclass does.
    engine = {"type": "tango_fairscale::fairscale", "sharding": {"cpu_offload": "false"}}
    with pytest.raises(TypeError) as type_error:
        build_engine(engine, tmp_path)
    one_line(type_error.value, "Expected cpu_offload to be bool, found false")
    with pytest.raises(ConfigurationError) as err:
        ShardingConfig(cpu_offload="false")  # type: ignore[arg-type]
    one_line(err.value, "sharding.cpu_offload must be true or false, got 'false'")


@pytest.mark.parametrize("name", ["compile", "hybrid_shard"])
def test_sharding_flags_must_be_booleans(name: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        ShardingConfig(**{name: "yes"})  # type: ignore[arg-type]
    one_line(err.value, f"sharding.{name} must be true or false, got 'yes'")


def test_hybrid_shard_is_refused_by_fairscale(tmp_path: Path) -> None:
    name = "hybrid_shard"
    engine = {"type": "tango_fairscale::fairscale", "sharding": {name: True}}
    with pytest.raises(ConfigurationError) as err:
        build_engine(engine, tmp_path)
    one_line(err.value, f"sharding.{name} is supported by the fsdp2 engine only; remove it or use")


@pytest.mark.parametrize("name", ["modules_to_wrap", "activation_checkpointing"])
def test_single_string_for_a_list_of_regexes_is_refused(tmp_path: Path, name: str) -> None:
    # Tango used to turn the string into the list of its characters, each a 1-character regex.
    sharding = {name: "model\\.transformer\\.h\\.0"}
    with pytest.raises(ConfigurationError) as err:
        build_engine({"type": "tango_fairscale::fairscale", "sharding": sharding}, tmp_path)
    one_line(err.value, f"sharding.{name} must be a list of regexes", "write ['model")
    with pytest.raises(ConfigurationError) as err:
        ShardingConfig(**sharding)  # type: ignore[arg-type]


def test_regex_that_does_not_compile_fails_at_engine_construction(tmp_path: Path) -> None:
    sharding = {"activation_checkpointing": ["model\\.transformer\\.h\\.[0-9+"]}
    with pytest.raises(ConfigurationError) as err:
        build_engine({"type": "tango_fairscale::fsdp2", "sharding": sharding}, tmp_path)
    one_line(
        err.value, "module pattern 'model\\\\.transformer\\\\.h\\\\.[0-9+'", "not a valid regex"
    )


@pytest.mark.parametrize("value", ["abc", -1.0, 0, True])
def test_bad_max_grad_norm(tmp_path: Path, value: Any) -> None:
    with pytest.raises(ConfigurationError) as err:
        build_engine({"type": "tango_fairscale::ddp", "max_grad_norm": value}, tmp_path)
    one_line(err.value, f"max_grad_norm must be a positive number or null, got {value!r}")


@pytest.mark.parametrize("name", ["fp16", "bf16", "32", ""])
def test_unknown_precision_lists_the_choices(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        build_engine({"type": "tango_fairscale::ddp", "precision": name}, tmp_path)
    one_line(err.value, f"unknown precision {name!r}", "bf16-mixed", "32-true")
    with pytest.raises(ConfigurationError):
        resolve_precision(name, torch.device("cpu"))


# Training step arguments: refused before a model is loaded or a process spawned ---------------


@pytest.mark.parametrize(
    "name, value",
    [
        ("train_steps", 0),
        ("train_steps", -3),
        ("train_steps", "abc"),
        ("train_steps", 2.5),
        ("train_steps", True),  # bool is an int to Python; not a step count
        ("batch_size", 0),
        ("grad_accum", -1),
        ("checkpoint_every", 0),
        ("keep_checkpoints", 0),
        ("keep_checkpoints", "2"),
        ("validate_every", 0),  # used to be read as 1
        ("eval_batch_size", "32"),
        ("device_count", 0),
    ],
)
def test_zero_negative_or_mistyped_counts(name: str, value: Any) -> None:
    with pytest.raises(ConfigurationError) as err:
        train(**{name: value})
    one_line(err.value, f"{name} must be a positive integer", f"got {value!r}")


def test_batch_not_divisible_by_devices_says_what_to_change() -> None:
    with pytest.raises(ConfigurationError) as err:
        train(batch_size=6, device_count=4)
    one_line(err.value, "batch_size 6 must be divisible by device_count × grad_accum = 4")


def test_too_few_examples_after_limit(tmp_path: Path) -> None:
    few = read_piqa(make_piqa_dir(tmp_path), limit=2)
    with pytest.raises(ConfigurationError) as err:
        train(few, batch_size=8)
    one_line(
        err.value, "only 2 training examples for batch_size 8;", "raise limit or lower batch_size"
    )


def test_empty_validation_split_is_refused_before_training() -> None:
    # Used to train first, then divide by zero when validating.
    with pytest.raises(ConfigurationError) as err:
        train(dataset(validation=0))
    one_line(err.value, "task 'piqa' scores split 'validation', which its data does not hold")


def test_a_task_without_training_documents_is_refused_before_training() -> None:
    with pytest.raises(ConfigurationError) as err:
        train(DatasetDict(splits={"validation": dataset()["validation"]}))
    one_line(err.value, "task 'piqa' has no training split")


def test_unknown_signal_name() -> None:
    with pytest.raises(ConfigurationError) as err:
        train(preemption_signal="SIGKILL")
    one_line(err.value, "unknown runtime.preemption_signal 'SIGKILL'", "choose one of SIGTERM, ")


def test_pack_sequences_must_be_a_boolean() -> None:
    with pytest.raises(ConfigurationError) as err:
        train(pack_sequences="yes")
    one_line(err.value, "pack_sequences must be true or false, got 'yes'")


def test_keep_optimizer_state_must_be_a_boolean() -> None:
    with pytest.raises(ConfigurationError) as err:
        train(keep_optimizer_state="no")
    one_line(err.value, "keep_optimizer_state must be true or false, got 'no'")


# Model config ------------------------------------------------------------------------------------


def test_model_given_as_a_number_is_refused_without_the_network() -> None:
    start = time.monotonic()
    with pytest.raises(ConfigurationError) as err:
        ModelWrapper(124)  # type: ignore[arg-type]
    one_line(err.value, "'model' must be a hub id or directory (a string), got 124")
    assert time.monotonic() - start < 1  # no retries against the hub


def test_unknown_model_type_suggests_the_closest(tokenizer_dir: Path) -> None:
    with pytest.raises(ConfigurationError) as err:
        ModelWrapper(config={"model_type": "gpt3"}, tokenizer=str(tokenizer_dir))
    one_line(err.value, "unknown config.model_type 'gpt3'; did you mean ", "'gpt2'")
    assert len(str(err.value)) < 200  # not transformers' list of 700 model types


def test_inconsistent_model_shape_is_a_configuration_error(tokenizer_dir: Path) -> None:
    config = {"model_type": "gpt2", "n_layer": 1, "n_embd": 30, "n_head": 4}
    with pytest.raises(ConfigurationError) as err:
        ModelWrapper(config=config, tokenizer=str(tokenizer_dir))
    one_line(err.value, "cannot build a model from 'config'", "divisible")


def test_model_config_that_is_not_an_object(tokenizer_dir: Path) -> None:
    with pytest.raises(ConfigurationError) as err:
        ModelWrapper(config=["gpt2"], tokenizer=str(tokenizer_dir))  # type: ignore[arg-type]
    one_line(err.value, "'config' must be an object of Hugging Face config fields, got ['gpt2']")


# Scoring and metrics steps ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"batch_size": "8"}, "batch_size must be a positive integer, got '8'"),
        ({"batch_size": 0}, "batch_size must be a positive integer, got 0"),
        ({"max_batch_tokens": 0}, "max_batch_tokens must be a positive integer or null, got 0"),
        ({"max_batch_tokens": 1.5}, "max_batch_tokens must be a positive integer or null, got 1.5"),
        ({"precision": "16-mixed"}, "'16-mixed' (fp16 with gradient scaling) needs a CUDA GPU"),
        ({"precision": "bogus"}, "unknown precision 'bogus'"),
        ({"bootstrap_iters": "many"}, "bootstrap_iters must be an integer, got 'many'"),
    ],
)
def test_bad_scoring_arguments(short_model: ModelWrapper, arguments: dict, message: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        TaskScoresStep(step_name="hostile").run(short_model, piqa(), **arguments)
    one_line(err.value, message)


def test_scoring_an_empty_split(short_model: ModelWrapper) -> None:
    with pytest.raises(ConfigurationError) as err:
        TaskScoresStep(step_name="hostile").run(short_model, piqa(dataset(validation=0)))
    one_line(err.value, "task 'piqa' scores split 'validation', which its data does not hold")


def test_metrics_of_nothing_say_what_to_give() -> None:
    with pytest.raises(ConfigurationError) as err:
        TaskMetricsStep(step_name="hostile").run([])
    one_line(err.value, "scores must be a non-empty list of task_scores results")


# Sequences longer than the model's context: documented lm-eval left truncation -----------------


def test_texts_longer_than_the_context_are_left_truncated_and_scored(
    short_model: ModelWrapper,
) -> None:
    long_goal = "how to stay dry " * 2_000  # ~8,000 tokens for a 16-token context
    long_sol = " ".join(["umbrella"] * 40)  # a continuation longer than the context too
    examples = [example(long_goal, "use an umbrella", long_sol, label=1), example()]
    result = TaskScoresStep(step_name="hostile").run(
        short_model, piqa(DatasetDict(splits={"validation": examples})), batch_size=2
    )
    first = result["samples"]["piqa"][0]
    assert all(math.isfinite(resp[0][0]) for resp in first["resps"])
    # The model sees the last max_length + 1 tokens; a continuation longer than that is scored
    # on the max_length tokens the model can predict (lm-eval's HF backend refuses it).
    from tango_fairscale.data.queries import encode_pairs

    queries = encode_pairs(short_model.tokenizer, first["arguments"], short_model.max_length)
    assert queries[1].continuation_length == short_model.max_length == 16
    assert queries[0].continuation_length == len(
        short_model.tokenizer(" use an umbrella")["input_ids"]
    )


# PIQA files ---------------------------------------------------------------------------------------


def test_a_10_mb_single_line_is_refused_at_once(tmp_path: Path) -> None:
    piqa_dir = make_piqa_dir(tmp_path)
    huge = line("x" * 10_000_000)
    (piqa_dir / "train.jsonl").write_text(huge + "\n" + GOOD_FILES["train.jsonl"])
    start = time.monotonic()
    with pytest.raises(PiqaFormatError) as err:
        read_piqa(piqa_dir)
    assert time.monotonic() - start < 5
    one_line(
        err.value,
        f"{piqa_dir / 'train.jsonl'}:1: line is {len(huge):,} bytes, longer than the "
        f"{MAX_LINE_BYTES:,} accepted",
    )


def test_a_long_line_under_the_limit_is_accepted(tmp_path: Path) -> None:
    goal = "word " * ((MAX_LINE_BYTES - 100) // 5)
    piqa_dir = make_piqa_dir(
        tmp_path, {"valid.jsonl": line(goal) + "\n", "valid-labels.lst": "0\n"}
    )
    assert read_piqa(piqa_dir)["validation"][0]["goal"] == goal


def test_non_utf8_label_file_names_byte_and_column(tmp_path: Path) -> None:
    piqa_dir = make_piqa_dir(tmp_path)
    (piqa_dir / "valid-labels.lst").write_bytes(b"0\n1\xff\n0\n")
    with pytest.raises(PiqaFormatError) as err:
        read_piqa(piqa_dir)
    path = piqa_dir / "valid-labels.lst"
    one_line(err.value, f"{path}:2: not valid UTF-8 (byte 0xff at column 2)")


def test_latin1_file_names_the_first_bad_line(tmp_path: Path) -> None:
    piqa_dir = make_piqa_dir(tmp_path)
    naive = '{"goal": "na\u00efve", "sol1": "a", "sol2": "b"}'  # not escaped: a raw byte 0xef
    text = line("v0") + "\n" + naive + "\n" + line("v2") + "\n"
    (piqa_dir / "valid.jsonl").write_bytes(text.encode("latin-1"))
    with pytest.raises(PiqaFormatError) as err:
        read_piqa(piqa_dir)
    one_line(err.value, f"{piqa_dir / 'valid.jsonl'}:2: not valid UTF-8 (byte 0xef")


def test_unpaired_surrogate_escape_is_refused(tmp_path: Path) -> None:
    # Valid UTF-8 and valid JSON, but no text: the tokenizer raised a TypeError deep inside.
    piqa_dir = make_piqa_dir(tmp_path)
    bad = '{"goal": "caf\\ud800", "sol1": "a", "sol2": "b"}'
    (piqa_dir / "tests.jsonl").write_text(line("t0") + "\n" + bad + "\n" + line("t2") + "\n")
    with pytest.raises(PiqaFormatError) as err:
        read_piqa(piqa_dir)
    path = piqa_dir / "tests.jsonl"
    one_line(err.value, f"{path}:2: value of 'goal' holds an unpaired surrogate")


def test_byte_order_mark_is_malformed_json_on_line_1(tmp_path: Path) -> None:
    piqa_dir = make_piqa_dir(tmp_path)
    (piqa_dir / "train.jsonl").write_text("\ufeff" + GOOD_FILES["train.jsonl"], encoding="utf-8")
    with pytest.raises(PiqaFormatError) as err:
        read_piqa(piqa_dir)
    one_line(err.value, f"{piqa_dir / 'train.jsonl'}:1: malformed JSON", "BOM")


def test_empty_examples_file_is_refused(tmp_path: Path) -> None:
    piqa_dir = make_piqa_dir(tmp_path, {"valid.jsonl": "", "valid-labels.lst": ""})
    with pytest.raises(PiqaFormatError) as err:
        read_piqa(piqa_dir, limit=1)
    one_line(err.value, f"{piqa_dir / 'valid.jsonl'} holds no examples")


# Jsonnet variables through `tango run` ------------------------------------------------------------


def test_bad_command_line_variables_are_named() -> None:
    """``-D`` values reach Jsonnet as strings; the config checks them before any step starts."""
    cases = {
        "batch_size=abc": '-D batch_size must be an integer, got "abc"',
        "lr=-1": "lr must be positive, got -1",
    }
    assert_tango_run_refuses(["configs/gpt2_piqa.jsonnet", "-w", "unused-workspace"], cases, 120)
    assert not (REPO_ROOT / "unused-workspace").exists()


def test_config_files_are_still_valid_json() -> None:
    # The hostile-input helpers in the Jsonnet must not change a good config.
    import yaml
    from tango.common import Params as P

    defaults = {
        **yaml.safe_load((REPO_ROOT / "tango.yml").read_text())["environment"],
        "model": "gpt2",
        "train_steps": "20",
        "device_count": "2",
        "engine": "fsdp2",
        "batch_size": "8",
        "lr": "1e-3",
        "seed": "-1",
    }
    steps = P.from_file(REPO_ROOT / "configs/gpt2_piqa.jsonnet", ext_vars=defaults)["steps"]
    trained = json.loads(json.dumps(steps["trained_model"].as_dict()))
    assert trained["engine"]["optimizer"]["lr"] == 1e-3
    assert (trained["batch_size"], trained["seed"], trained["train_steps"]) == (8, -1, 20)
