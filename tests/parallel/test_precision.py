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


def test_loss_scaling_skips_an_overflowed_step_and_steps_a_finite_one(caplog) -> None:
    """fp16's loss scaling with torch's grad scaler (on the CPU here; engines use it on GPUs):
    an infinite gradient skips the step (weights unchanged, scale halved, counted and logged),
    clipping sees unscaled gradients, a finite step updates the weights."""
    from tango_fairscale.parallel.precision import LossScaling

    weight = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    scaling = LossScaling(torch.amp.GradScaler("cpu", init_scale=1024.0))
    clipped: list[float] = []

    def clip() -> None:
        clipped.append(float(weight.grad.norm()))

    scaling.backward((weight * float("inf")).sum())
    with caplog.at_level("WARNING", logger="tango_fairscale.parallel.precision"):
        scaling.optimizer_step(optimizer, clip)
    assert torch.equal(weight.detach(), torch.ones(2)) and scaling.skipped_steps == 1
    assert scaling.grad_scaler.get_scale() == 512.0
    assert "fp16 gradient overflow: optimizer step skipped, loss scale 1024 -> 512" in caplog.text
    optimizer.zero_grad()
    scaling.backward(weight.sum())
    scaling.optimizer_step(optimizer, clip)
    assert clipped[-1] == pytest.approx(2**0.5)  # unscaled: d(sum)/dw = 1 per element
    assert torch.allclose(weight.detach(), torch.full((2,), 0.9))
    assert scaling.skipped_steps == 1


def test_without_a_scaler_loss_scaling_clips_and_steps() -> None:
    from tango_fairscale.parallel.precision import LossScaling

    weight = torch.nn.Parameter(torch.ones(1))
    optimizer = torch.optim.SGD([weight], lr=0.5)
    scaling = LossScaling(None)
    calls: list[str] = []
    scaling.backward(weight.sum())
    scaling.optimizer_step(optimizer, lambda: calls.append("clip"))
    assert calls == ["clip"] and float(weight.detach()) == 0.5 and scaling.skipped_steps == 0


def test_convert_module_and_forward_context_follow_the_precision() -> None:
    mixed, pure = resolve_precision("bf16-mixed", CPU), resolve_precision("bf16-true", CPU)
    layer = torch.nn.Linear(2, 2).to(torch.bfloat16)  # as a bf16 checkpoint loads
    assert mixed.convert_module(layer).weight.dtype == torch.float32  # fp32 master weights
    with mixed.forward_context(CPU):
        assert layer(torch.ones(1, 2)).dtype == torch.bfloat16  # fp32 weights, autocast
    with resolve_precision("32-true", CPU).forward_context(CPU):
        assert layer(torch.ones(1, 2)).dtype == torch.float32
    assert pure.convert_module(layer).weight.dtype == torch.bfloat16


def test_backwards_on_a_gpu_take_the_forwards_attention_kernels() -> None:
    """A checkpointed module's forward is recomputed in the backward: with the same kernels, or
    torch's checkpoint refuses what it saves (only the backend flags are read: no GPU needed)."""
    gpu, enabled = torch.device("cuda"), torch.backends.cuda.cudnn_sdp_enabled()
    precision = resolve_precision("32-true", gpu)
    with precision.attention_kernels(gpu):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.mem_efficient_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled() == enabled
    with precision.attention_kernels(CPU):
        assert torch.backends.cuda.cudnn_sdp_enabled() == enabled


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the attention kernels of a GPU")
def test_forwards_on_a_gpu_leave_cudnn_attention_out() -> None:
    """cuDNN's attention builds a plan for every new shape (up to a second each); packed batches
    change shape from batch to batch."""
    gpu = torch.device("cuda")
    enabled = torch.backends.cuda.cudnn_sdp_enabled()
    with resolve_precision("bf16-mixed", gpu).forward_context(gpu):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.mem_efficient_sdp_enabled()
        q = torch.randn(2, 4, 40, 64, device=gpu)
        mask = torch.ones(40, 40, dtype=torch.bool, device=gpu).tril()
        out = torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)
        assert out.dtype == torch.bfloat16
    assert torch.backends.cuda.cudnn_sdp_enabled() == enabled
