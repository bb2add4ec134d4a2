"""``parallel/precision.py``: Lightning's precision names resolved into the dtypes an engine
computes and updates in; ``auto`` by device; refusals in one line."""

from __future__ import annotations

import pytest
import torch
from tango.common.exceptions import ConfigurationError

from tango_fairscale.parallel.precision import resolve_precision

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    "name, compute, update, mixed, scaler",
    [
        ("32-true", torch.float32, torch.float32, False, False),
        ("bf16-mixed", torch.bfloat16, torch.float32, True, False),
        ("bf16-true", torch.bfloat16, torch.bfloat16, False, False),
    ],
)
def test_names_resolve_to_dtypes(name, compute, update, mixed, scaler) -> None:
    precision = resolve_precision(name, CPU)
    assert (precision.name, precision.compute_dtype, precision.param_dtype) == (
        name,
        compute,
        update,
    )
    assert (precision.mixed, precision.needs_grad_scaler) == (mixed, scaler)


def test_auto_is_fp32_on_a_cpu_and_bf16_mixed_on_a_bf16_gpu(monkeypatch) -> None:
    assert resolve_precision("auto", CPU).name == "32-true"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert resolve_precision("auto", torch.device("cuda", 0)).name == "bf16-mixed"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert resolve_precision("auto", torch.device("cuda", 0)).name == "32-true"


def test_fp16_on_a_gpu_scales_gradients_and_is_refused_on_a_cpu() -> None:
    assert resolve_precision("16-mixed", torch.device("cuda", 0)).needs_grad_scaler
    with pytest.raises(ConfigurationError, match="'16-mixed' .* needs a CUDA GPU"):
        resolve_precision("16-mixed", CPU)


def test_an_unknown_name_is_refused_with_the_closest() -> None:
    with pytest.raises(ConfigurationError, match="unknown precision 'bf16mixed'; did you mean"):
        resolve_precision("bf16mixed", CPU)
