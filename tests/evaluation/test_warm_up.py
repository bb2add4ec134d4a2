"""The scoring warm-up (``evaluation/warm_up.py``): one small forward on a thread that the first
real forward waits for, nothing on a CPU, a batch every model takes, errors left to the real
forward; on a GPU, the same scores through the warmed call."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tango_fairscale.data.queries import Query
from tango_fairscale.evaluation.call import EvalOptions, ModelCall
from tango_fairscale.evaluation.lm import scoring_precision
from tango_fairscale.evaluation.scoring import score_queries
from tango_fairscale.evaluation.warm_up import forward_on_thread, warm_up_batch, warmed_up
from tango_fairscale.model.causal_lm import ModelWrapper
from tango_fairscale.parallel.precision import resolve_precision

QUERIES = [Query((5, 6, 7, 8, 9), 2), Query((5, 6, 7, 10), 1), Query((11, 12, 13), 1)]


def recording_call(log: list[str], warm_up_seconds: float = 0.0, fails: bool = False) -> ModelCall:
    """A call that logs which thread ran each batch (a warm-up batch has ``"warm"`` in it)."""

    def forward(batch: dict[str, Any]) -> Any:
        name = threading.current_thread().name
        if "warm" in batch:
            time.sleep(warm_up_seconds)
            if fails:
                raise RuntimeError("warm-up broke")
            log.append(f"warm-up on {name}, autocast {torch.is_autocast_enabled('cpu')}")
            return {}
        log.append(f"real on {name}")
        return {}

    return ModelCall(forward, model=None, device=torch.device("cpu"))  # type: ignore[arg-type]


def test_the_first_real_forward_waits_for_the_warm_up_on_its_thread() -> None:
    log: list[str] = []
    precision = resolve_precision("bf16-mixed", torch.device("cpu"))
    with forward_on_thread(recording_call(log, 0.3), {"warm": True}, precision) as call:
        assert log == []  # the warm-up is still running: entering did not wait
        call({"real": True})
        call({"real": True})
    main = threading.current_thread().name
    assert log == [
        "warm-up on scoring-warm-up, autocast True",  # under the precision, on its own thread
        f"real on {main}",
        f"real on {main}",
    ]


def test_a_failed_warm_up_is_left_to_the_real_forward() -> None:
    log: list[str] = []
    precision = resolve_precision("32-true", torch.device("cpu"))
    with forward_on_thread(recording_call(log, fails=True), {"warm": True}, precision) as call:
        call({"real": True})
    assert log == [f"real on {threading.current_thread().name}"]


def test_the_thread_is_joined_when_the_block_ends_without_a_forward() -> None:
    log: list[str] = []
    precision = resolve_precision("32-true", torch.device("cpu"))
    with forward_on_thread(recording_call(log, 0.2), {"warm": True}, precision):
        pass
    assert log == ["warm-up on scoring-warm-up, autocast False"]
    assert not any(t.name == "scoring-warm-up" for t in threading.enumerate())


def test_nothing_starts_on_a_cpu(tiny_model_dir: Path) -> None:
    model = ModelWrapper(model=str(tiny_model_dir))
    call = ModelCall.local(model, torch.device("cpu"))
    with warmed_up(call, resolve_precision("32-true", torch.device("cpu")), True) as warm:
        assert warm is call
        assert not any(t.name == "scoring-warm-up" for t in threading.enumerate())


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("n_positions", [1024, 12])
def test_every_model_takes_the_warm_up_batch(
    tokenizer_dir: Path, packed: bool, n_positions: int
) -> None:
    from conftest import TINY_GPT2
    from helpers.tokenizer import vocabulary_fields

    config = {**TINY_GPT2, **vocabulary_fields(tokenizer_dir), "n_positions": n_positions}
    model = ModelWrapper(config=config, tokenizer=str(tokenizer_dir)).eval()
    batch = warm_up_batch(model.pad_token_id, model.max_length, packed)
    assert ("query_ids" in batch) == packed
    if packed:  # a packed row may be wider than the window: positions restart in each segment
        assert int(batch["position_ids"].max()) < n_positions
    else:  # a padded row's last token is only predicted
        assert batch["input_ids"].shape[-1] - 1 <= n_positions
    with torch.no_grad():
        outputs = model(**batch)
    assert outputs["loglikelihood"].shape == (8,)
    assert torch.isfinite(outputs["loglikelihood"]).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the warm-up runs on GPUs only")
@pytest.mark.parametrize("precision_name", ["bf16-mixed", "32-true"])
def test_a_warmed_call_scores_as_the_call_on_a_gpu(tiny_model_dir: Path, precision_name: str):
    device = torch.device("cuda")
    precision = resolve_precision(precision_name, device)
    model = ModelWrapper(model=str(tiny_model_dir)).to(device).eval()
    call = ModelCall.local(model, device)
    options = EvalOptions(batch_size=2, packed=True, progress=False)
    pad = model.pad_token_id
    with scoring_precision(model, precision):
        with warmed_up(call, precision, packed=True) as warm:
            assert warm is not call
            assert any(t.name == "scoring-warm-up" for t in threading.enumerate())
            warmed = score_queries(warm, QUERIES, options, pad_token_id=pad, device=device)
        plain = score_queries(call, QUERIES, options, pad_token_id=pad, device=device)
    assert warmed == plain
