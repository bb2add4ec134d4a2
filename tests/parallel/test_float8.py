"""``parallel/float8.py``: the transformer blocks' projections swapped for torchao's float8 ones
(GPT-2's ``Conv1D`` and ``nn.Linear`` alike) with the model's state unchanged, and a float8
setting refused in one line where it cannot train. float8's kernels need an H100-class GPU: here
torchao emulates their rounding on the CPU; ``scripts/gpu_tests.sh`` runs the GPU test."""

from __future__ import annotations

import copy

import pytest
import torch
from tango.common.exceptions import ConfigurationError
from transformers import AutoConfig, AutoModelForCausalLM

from tango_fairscale.parallel.float8 import Float8Conv1D, apply_float8, check_float8
from tango_fairscale.parallel.precision import resolve_precision

pytest.importorskip("torchao.float8")

SHAPES = {
    "gpt2": {"n_layer": 2, "n_embd": 64, "n_head": 2},
    "llama": {
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    },
}


def small_model(family: str, **overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    config = AutoConfig.for_model(family, vocab_size=128, **{**SHAPES[family], **overrides})
    return AutoModelForCausalLM.from_config(config).eval()  # no dropout: runs compare alike


def loss_and_grads(model: torch.nn.Module, ids: torch.Tensor) -> tuple[float, dict]:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(ids, labels=ids).loss
    loss.backward()
    return loss.item(), {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("family, swapped", [("gpt2", 2 * 4), ("llama", 2 * 7)])
def test_block_projections_become_float8_with_the_state_unchanged(family, swapped) -> None:
    """Every projection of every block is swapped (GPT-2: qkv, attention out, two MLP; Llama:
    q, k, v, o, gate, up, down), nothing outside the blocks; the state dict keeps its keys,
    shapes and values (the same parameter objects); the loss and every gradient stay within
    float8's rounding of the unconverted model's."""
    model = small_model(family)
    reference = copy.deepcopy(model)
    before = {name: p for name, p in model.named_parameters()}
    assert apply_float8(model, "tensorwise", emulate=True) == swapped
    assert {name: p for name, p in model.named_parameters()} == before
    kinds = {type(m).__name__ for m in model.modules()}
    assert kinds & {"Float8Conv1D", "Float8Linear"}
    assert type(model.lm_head).__name__ == "Linear"  # the vocabulary projection stays bf16
    ids = torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(1))
    loss, grads = loss_and_grads(model, ids)
    reference_loss, reference_grads = loss_and_grads(reference, ids)
    assert loss != reference_loss  # float8's rounding was applied
    assert loss == pytest.approx(reference_loss, rel=1e-2)
    for name, grad in grads.items():
        expected = reference_grads[name]
        assert (grad - expected).norm() <= 0.2 * expected.norm() + 1e-6, name


def test_float8_conv1d_is_gpt2s_projection() -> None:
    """Without float8's rounding (its scales' cast undone by a high-precision matmul, emulated),
    the swapped GPT-2 projection computes ``x @ weight + bias`` as Conv1D does, within
    float8's step."""
    from torchao.float8 import Float8LinearConfig
    from transformers.pytorch_utils import Conv1D

    conv = Conv1D(48, 32)
    torch.nn.init.normal_(conv.bias)
    swapped = Float8Conv1D(conv, Float8LinearConfig(emulate=True))
    x = torch.randn(4, 5, 32)
    assert swapped(x).shape == conv(x).shape == (4, 5, 48)
    torch.testing.assert_close(swapped(x), conv(x), rtol=0.15, atol=0.15)


def test_projections_with_sizes_float8_cannot_take_stay_as_they_are() -> None:
    """float8's kernels need every dimension a multiple of 16: a width of 40 keeps them all."""
    model = small_model("gpt2", n_embd=40, n_head=2)
    assert apply_float8(model, "tensorwise", emulate=True) == 0
    assert not any("Float8" in type(m).__name__ for m in model.modules())


@pytest.mark.parametrize(
    "recipe, precision, device, message",
    [
        ("tensorwise", "32-true", "cpu", "float8 computes around bf16: set precision"),
        ("tensorwise", "bf16-mixed", "cpu", "float8 needs an NVIDIA GPU with float8 tensor"),
        ("columnwise", "bf16-mixed", "cpu", "unknown float8 .columnwise.; choose one of tens"),
    ],
)
def test_a_float8_setting_that_cannot_train_is_refused_in_one_line(
    recipe, precision, device, message
) -> None:
    with pytest.raises(ConfigurationError, match=message) as error:
        check_float8(
            recipe, resolve_precision(precision, torch.device(device)), torch.device(device)
        )
    assert "\n" not in str(error.value)


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
    reason="float8 kernels need an H100-class GPU",
)
def test_float8_trains_gpt2_on_a_gpu_near_bf16() -> None:
    """On the GPU's float8 kernels: ten AdamW steps of a GPT-2 block stack, compiled, track the
    bf16 run's losses within 2 %."""
    losses = {}
    for recipe in ("bf16", "tensorwise"):
        model = small_model("gpt2", n_embd=256, n_head=4).cuda()
        check_float8(
            "tensorwise",
            resolve_precision("bf16-mixed", torch.device("cuda")),
            torch.device("cuda"),
        )
        if recipe != "bf16":
            apply_float8(model, recipe)
        for block in model.transformer.h:
            block.compile()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        ids = torch.randint(0, 128, (8, 128), device="cuda")
        losses[recipe] = []
        for _ in range(10):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses[recipe].append(loss.item())
    assert losses["tensorwise"][-1] < losses["tensorwise"][0]
    for ours, reference in zip(losses["tensorwise"], losses["bf16"]):
        assert ours == pytest.approx(reference, rel=0.02)
