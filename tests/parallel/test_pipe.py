"""The pipe engine: its forward equals the model's, every stage sees every micro-batch, its balance
is automatic where asked; bad configs and other models fail in one line. Its parity with DDP is
``tests/integration/parallel/test_parity_pipe.py``."""

from pathlib import Path

import pytest
import torch
from conftest import (
    assert_close_by_key,
    train_tiny,
    training_queries,
)
from helpers.families import VOCAB
from tango.common import Lazy, Params
from tango.common.exceptions import ConfigurationError
from tango.integrations.torch import Model, TrainConfig, TrainingEngine

from tango_fairscale.data.batches import collate, packed_batch
from tango_fairscale.model.causal_lm import ModelWrapper
from tango_fairscale.model.stages import Stage
from tango_fairscale.parallel.pipe import PipeEngine

PIPE = "tango_fairscale::pipe"


@pytest.mark.parametrize("name", ["gpt2", "llama"])
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_forward_equals_model_wrapper(
    precision, name, tmp_path, family_model_dir, piqa_small
) -> None:
    """Outputs equal ModelWrapper.forward under the same autocast (applied inside the stages),
    also for a batch with fewer rows than chunks (the last validation batch)."""
    model_dir = family_model_dir(name)
    reference = ModelWrapper(str(model_dir))
    built = engine(tmp_path, model_dir, precision=precision, chunks=4)
    queries = training_queries(list(piqa_small["train"])[:6], reference.tokenizer, 128)
    for rows in (6, 1):
        batch = collate(queries[:rows], reference.pad_token_id)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
            expected = reference(**batch)
        outputs = built.forward_eval(batch)
        keys = ("loss", "loglikelihood", "num_tokens")
        assert_close_by_key(outputs, expected, keys, rtol=1e-6, atol=1e-6)


def engine(
    tmp_path: Path, model_dir: Path, world_size: int = 1, precision: str = "32-true", **pipe
) -> PipeEngine:
    """The pipe engine of ``model_dir`` built with ``pipe`` as its ``pipe`` block."""
    config = TrainConfig(
        "test",
        tmp_path,
        world_size=world_size,
        is_distributed=world_size > 1,
        devices=[-1] * world_size,
    )
    model = Lazy(Model, Params({"type": "tango_fairscale::causal_lm", "model": str(model_dir)}))
    params = {"type": PIPE, "precision": precision, "optimizer": {"type": "torch::AdamW"}}
    lazy = Lazy(TrainingEngine, Params({**params, "pipe": pipe}))
    built = lazy.construct(train_config=config, model=model)
    assert isinstance(built, PipeEngine)
    return built


def assert_one_line(error: pytest.ExceptionInfo, *parts: str) -> None:
    message = str(error.value)
    assert "\n" not in message, message
    for part in parts:
        assert part in message, message


@pytest.mark.parametrize(
    "params, parts",
    [
        ({"balance": [1, 2]}, ("sums to 3", "2 decoder layers", "sum to 2")),
        ({"balance": [1, 0, 1]}, ("positive layer counts",)),
        ({"balance": [1, 1], "devices": ["cpu"]}, ("2 stages", "only 1", "add devices")),
        ({"chunks": 0}, ("pipe.chunks must be a positive integer",)),
        ({"checkpoint": "sometimes"}, ("never, always, except_last", "'sometimes'")),
        ({"devices": ["tpu:0"]}, ("'tpu:0'",)),
        ({"devices": ["cuda:99"]}, ("'cuda:99' is not available",)),
    ],
    ids=[
        "balance-sum",
        "balance-zero",
        "stages>devices",
        "chunks",
        "checkpoint",
        "device",
        "missing-gpu",
    ],
)
def test_bad_config_is_one_line(params, parts, tmp_path, tiny_model_dir) -> None:
    with pytest.raises(ConfigurationError) as error:
        engine(tmp_path, tiny_model_dir, **params)
    assert_one_line(error, *parts)


def test_more_processes_are_refused(tmp_path, tiny_model_dir) -> None:
    with pytest.raises(ConfigurationError) as error:
        engine(tmp_path, tiny_model_dir, world_size=2)
    assert_one_line(error, "set device_count=1")


def test_chunks_larger_than_micro_batch(tmp_path, tiny_model_dir, piqa_small) -> None:
    """The micro-batch size is known at the first forward: 8 rows cannot make 16 chunks."""
    with pytest.raises(ConfigurationError) as error:
        train_tiny(tmp_path, tiny_model_dir, piqa_small, PIPE, 1, pipe={"chunks": 16})
    assert_one_line(error, "pipe.chunks=16", "8 examples", "at most 8")


def test_other_architectures_are_refused(tmp_path, tokenizer_dir) -> None:
    model_dir = tmp_path / "bloom"
    ModelWrapper(
        config={
            "model_type": "bloom",
            "n_layer": 2,
            "hidden_size": 32,
            "n_head": 2,
            "vocab_size": VOCAB,
        },
        tokenizer=str(tokenizer_dir),
    ).save(model_dir)
    with pytest.raises(ConfigurationError) as error:
        engine(tmp_path, model_dir)
    assert_one_line(
        error,
        "the pipe engine cannot split BloomForCausalLM (model_type 'bloom')",
        "it splits model types gemma, gemma2, gemma3_text, gpt2, gpt_neox, llama, mistral, opt, "
        "qwen2, qwen3, smollm3",
        "use engine ddp, fairscale or fsdp2 for other models",
    )


def test_every_stage_sees_every_micro_batch(tmp_path, family_model_dir, piqa_small) -> None:
    """Only batch-first tensors cross the stages: a batch of 4 rows in 2 chunks runs each stage
    twice (a tensor of first dimension 1, such as rotary cos/sin, would make it once)."""
    built = engine(tmp_path, family_model_dir("llama"), chunks=2)
    stages = [module for module in built.model.pipe.modules() if isinstance(module, Stage)]
    calls = [0] * len(stages)
    for index, stage in enumerate(stages):
        stage.register_forward_hook(
            lambda *_, index=index: calls.__setitem__(index, calls[index] + 1)
        )
    wrapper = built.wrapped_model
    queries = training_queries(list(piqa_small["train"])[:4], wrapper.tokenizer, 128)
    built.forward_eval(collate(queries, wrapper.pad_token_id))
    assert calls == [2, 2]


def test_packed_batches_are_refused(tmp_path, family_model_dir, piqa_small) -> None:
    """The model's attention takes packed batches (sdpa), the pipe never does (refused by the
    engine or, called directly, by the pipelined model)."""
    built = engine(tmp_path, family_model_dir("llama"))
    wrapper = built.wrapped_model
    assert wrapper.supports_packing and not built.accepts_packed_batches
    queries = training_queries(list(piqa_small["train"])[:4], wrapper.tokenizer, 128)
    batch = packed_batch(queries, wrapper.pad_token_id)
    with pytest.raises((ConfigurationError, ValueError), match="packed"):
        built.forward_eval(batch)
    with pytest.raises(ValueError, match="right-padded batches only"):
        built.model(**batch)


def test_automatic_balance(tmp_path, tiny_model_dir) -> None:
    """balance null: by parameter count (tests/model/test_stages.py) over the default devices,
    two CPU stages."""
    built = engine(tmp_path, tiny_model_dir)
    assert built.strategy.balance == [1, 1]
    assert built.strategy.stage_devices == [torch.device("cpu")] * 2
    assert built.wrapped_model is built.model.module
