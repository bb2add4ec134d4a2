"""``parallel/float8.py``: the transformer blocks' projections swapped for torchao's float8 ones
(GPT-2's ``Conv1D`` and ``nn.Linear`` alike) with the model's state unchanged, and a float8
setting refused in one line where it cannot train. float8's kernels need an H100-class GPU: here
torchao emulates their rounding on the CPU; ``benchmarks/gpu.sh tests`` runs the GPU test."""

from __future__ import annotations

import copy

import pytest
import torch
from tango.common.exceptions import ConfigurationError
from transformers import AutoConfig, AutoModelForCausalLM

from tango_fairscale.parallel.float8 import (
    Float8Conv1D,
    apply_float8,
    check_float8,
    check_float8_setting,
)
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


@pytest.mark.parametrize("rows", [(12,), (3, 4)])
@pytest.mark.parametrize("autocast", [False, True])
def test_float8_conv1d_computes_what_torchaos_layer_does_with_the_transposed_weight(
    rows, autocast
) -> None:
    """GPT-2's projection swapped: the output (values and dtype) and both gradients equal
    torchao's own float8 layer over the linear weight that Conv1D's ``(in, out)`` one transposes,
    for inputs of rank 2 and 3, with and without bf16 autocast."""
    from torchao.float8 import Float8LinearConfig
    from torchao.float8.float8_linear import Float8Linear
    from transformers.pytorch_utils import Conv1D

    config = Float8LinearConfig(emulate=True)
    torch.manual_seed(0)
    conv = Conv1D(48, 32)
    torch.nn.init.normal_(conv.weight)
    torch.nn.init.normal_(conv.bias)
    linear = torch.nn.Linear(32, 48)
    linear.weight = torch.nn.Parameter(conv.weight.detach().t().clone())
    linear.bias = torch.nn.Parameter(conv.bias.detach().clone())
    reference = Float8Linear.from_float(linear, config)
    swapped = Float8Conv1D(conv, config)
    x = torch.randn(*rows, 32)
    results = []
    for layer in (swapped, reference):
        given = x.clone().requires_grad_()
        if layer is swapped:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                out = layer(given)
        else:  # torchao's layer casts to the GPU's autocast dtype even on a CPU: cast here
            out = layer(given.to(torch.bfloat16) if autocast else given)
        out.float().square().sum().backward()
        results.append((out, given.grad))
    ours, theirs = results
    assert ours[0].dtype == (torch.bfloat16 if autocast else torch.float32)
    assert ours[0].shape == (*rows, 48)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    torch.testing.assert_close(conv.weight.grad, linear.weight.grad.t(), rtol=0, atol=0)
    torch.testing.assert_close(conv.bias.grad, linear.bias.grad, rtol=0, atol=0)
    assert not torch.equal(ours[0].float(), conv(x).float())  # float8's rounding applied


def test_projections_float8_cannot_take_are_kept_and_a_model_with_none_is_refused() -> None:
    """float8's kernels need every dimension a multiple of 16: a width of 40 leaves nothing to
    swap, refused in one line rather than trained in bf16 under a float8 label."""
    model = small_model("gpt2", n_embd=40, n_head=2)
    with pytest.raises(ConfigurationError, match="float8: no linear layer of this model") as error:
        apply_float8(model, "tensorwise", emulate=True)
    assert "\n" not in str(error.value)
    assert not any("Float8" in type(m).__name__ for m in model.modules())


def test_a_layer_inside_nested_blocks_is_swapped_once() -> None:
    """Block classes nested in each other (both in ``_no_split_modules``): the inner block's
    layers, swapped first, are not swapped again by the outer one."""

    class Inner(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(32, 32)

    class Outer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner, self.proj = Inner(), torch.nn.Linear(32, 32)

    class Nested(torch.nn.Module):
        _no_split_modules = ["Outer", "Inner"]

        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList([Outer(), Outer()])

    model = Nested()
    assert apply_float8(model, "tensorwise", emulate=True) == 4
    inner = model.blocks[0].inner.proj
    assert type(inner).__name__ == "Float8Linear"
    assert all(type(m).__name__ != "Float8Linear" for m in inner.children())


@pytest.mark.parametrize("engine_name", ["tango_fairscale::ddp", "tango_fairscale::pipe"])
def test_the_engine_trains_its_model_with_float8_layers(
    engine_name, monkeypatch, tmp_path, tiny_model_dir, caplog
) -> None:
    """The engine's wiring (the GPU check taken away, float8 emulated on the CPU): the wrapped
    model (the pipe's: its stages) holds float8 projections, a bf16-mixed step trains them, no
    CUDA graphs replay the step, and a warning says that without compile it is slow."""
    import functools

    from conftest import engine_config
    from tango.common import Lazy, Params
    from tango.integrations.torch import Model, TrainConfig, TrainingEngine

    import tango_fairscale.parallel.engine as engine_module

    monkeypatch.setattr(engine_module, "check_float8", lambda *args: None)
    emulated = functools.partial(apply_float8, emulate=True)
    monkeypatch.setattr(engine_module, "apply_float8", emulated)
    config = TrainConfig("f8", tmp_path, devices=[-1], world_size=1, is_distributed=False)
    given = {"type": "tango_fairscale::causal_lm", "model": str(tiny_model_dir)}
    fields = engine_config(engine_name, precision="bf16-mixed", float8="tensorwise")
    engine = Lazy(TrainingEngine, Params(fields)).construct(
        train_config=config, model=Lazy(Model, Params(given))
    )
    assert "float8 without compile is slow" in caplog.text
    layers = [m for m in engine.model.modules() if isinstance(m, Float8Conv1D)]
    assert len(layers) == 2 * 4 and engine.graphs is None
    # Four rows: the pipe's four chunks of a micro-batch.
    ids = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(0))
    before = layers[0].weight.detach().clone()
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    loss, _ = engine.forward_train(batch, 0, 1)
    engine.backward(loss)
    engine.step()
    assert torch.isfinite(loss) and not torch.equal(before, layers[0].weight)


@pytest.mark.parametrize(
    "recipe, precision, message",
    [
        ("tensorwise", "32-true", "float8 computes around bf16: set precision to 'bf16-mixed'"),
        ("rowwise", "16-mixed", "float8 computes around bf16: set precision to 'bf16-mixed'"),
        ("columnwise", "bf16-mixed", "unknown float8 'columnwise'; choose one of tensorwise"),
    ],
)
def test_a_float8_setting_is_refused_from_the_config_in_one_line(recipe, precision, message):
    with pytest.raises(ConfigurationError, match=message) as error:
        check_float8_setting(recipe, precision)
    assert "\n" not in str(error.value)
    check_float8_setting("rowwise", "auto")  # resolved on the device, checked there


@pytest.mark.parametrize("precision", ["bf16-mixed", "32-true"])
def test_float8_without_a_float8_gpu_is_refused_for_the_device_first(precision) -> None:
    """On a CPU the device is what to change, whatever precision ``auto`` resolved to there."""
    cpu = torch.device("cpu")
    with pytest.raises(ConfigurationError, match="float8 needs NVIDIA GPUs .* cpu is not one"):
        check_float8("tensorwise", resolve_precision(precision, cpu), [cpu])


def test_every_device_a_run_computes_on_must_take_float8(monkeypatch) -> None:
    """The pipe's stages on several GPUs: one without float8 kernels (an A100 beside an H100) is
    named."""
    capabilities = {0: (9, 0), 1: (8, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d: capabilities[d.index])
    devices = [torch.device("cuda", 0), torch.device("cuda", 1)]
    bf16 = resolve_precision("bf16-mixed", devices[0])
    with pytest.raises(ConfigurationError, match="cuda:1 is not one; remove float8"):
        check_float8("tensorwise", bf16, devices)
    check_float8("tensorwise", bf16, devices[:1])  # torchao is installed here


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
        gpu = torch.device("cuda")
        check_float8("tensorwise", resolve_precision("bf16-mixed", gpu), [gpu])
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
