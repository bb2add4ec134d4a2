"""One model load per command (``tango_fairscale.evaluation.shared_model``): building
``configs/mc_suite.jsonnet``'s steps loads no model and keeps every cache key; running its scoring
steps loads the model once for all of them, a rerun from the cache loads none, and the model is
freed with the steps. A precision's cast never reaches the shared fp32 model of a later step."""

from __future__ import annotations

import copy
import gc
import itertools
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml
from tango.common import Lazy, Params
from tango.integrations.torch import Model
from tango.step_graph import StepGraph
from tango.workspaces import LocalWorkspace

import tango_fairscale.model.causal_lm as causal_lm
from tango_fairscale.evaluation import shared_model
from tango_fairscale.evaluation.shared_model import ModelSource, cast_copy, evaluation_model
from tango_fairscale.evaluation.steps import TaskScoresStep
from tango_fairscale.model.causal_lm import ModelWrapper
from tango_fairscale.runtime.devices import move_batch
from tango_fairscale.tasks.lm_eval import TaskSpec

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "tasks"
DEFAULTS = yaml.safe_load((REPO_ROOT / "tango.yml").read_text())["environment"]
TASKS = ("copa", "arc_easy", "piqa")
CPU = torch.device("cpu")


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every model load (``build_model``, what reads or builds the weights), by source."""
    calls: list[str] = []
    build = causal_lm.build_model

    def counted(model, config, seed):  # type: ignore[no-untyped-def]
        calls.append(str(model))
        return build(model, config, seed)

    monkeypatch.setattr(causal_lm, "build_model", counted)
    yield calls


def suite_steps(model_dir: Path, **variables: str) -> StepGraph:
    """``configs/mc_suite.jsonnet``'s steps as ``tango run`` builds them (three fixture tasks)."""
    defines = {
        **DEFAULTS,
        "model": str(model_dir),
        "tasks": ",".join(TASKS),
        "task_data_dir": str(FIXTURES),
        "limit": "3",
        "precision": "32-true",
        **variables,
    }
    params = Params.from_file(REPO_ROOT / "configs" / "mc_suite.jsonnet", ext_vars=defines)
    return StepGraph.from_params(params.pop("steps"))


def test_building_the_steps_loads_no_model_and_keeps_the_cache_keys(
    tiny_model_dir: Path, loads: list[str]
) -> None:
    graph = suite_steps(tiny_model_dir)
    assert loads == []  # was one load per scoring step, cached or not
    model = ModelWrapper(str(tiny_model_dir))  # the model Tango used to load for each step
    for task in TASKS:
        step = graph[f"scores_{task}"]
        assert isinstance(step.kwargs["model"], ModelSource)
        loaded = TaskScoresStep(
            model=model, **{k: v for k, v in step.kwargs.items() if k != "model"}
        )
        assert step.unique_id == loaded.unique_id


def test_a_model_built_from_a_config_keeps_its_cache_key(tokenizer_dir: Path) -> None:
    from conftest import TINY_GPT2

    fields = {
        "config": {**TINY_GPT2, "architectures": ["GPT2LMHeadModel"]},
        "tokenizer": str(tokenizer_dir),
        "seed": 3,
    }
    lazy = Lazy(Model, Params({"type": "tango_fairscale::causal_lm", **copy.deepcopy(fields)}))
    task = TaskSpec(name="copa", data_dir=str(FIXTURES / "copa"))
    step = TaskScoresStep(model=lazy, task=task)
    assert isinstance(step.kwargs["model"], ModelSource)
    assert step.unique_id == TaskScoresStep(model=ModelWrapper(**fields), task=task).unique_id


def test_the_steps_share_one_load_and_a_rerun_from_the_cache_loads_none(
    tmp_path: Path, tiny_model_dir: Path, loads: list[str]
) -> None:
    workspace = LocalWorkspace(tmp_path / "workspace")
    graph = suite_steps(tiny_model_dir)
    first = graph["metrics"].result(workspace)
    assert loads == [str(tiny_model_dir)]  # three tasks, one load
    assert {f"{task}/acc" for task in TASKS} <= set(first)
    (key,) = [key for key in shared_model._LOADED.keys() if key[0] == _hash(graph)]
    held = weakref.ref(shared_model._LOADED[key])
    del graph
    gc.collect()
    assert held() is None  # released with the command's steps

    again = suite_steps(tiny_model_dir)["metrics"].result(workspace)
    assert again == first and loads == [str(tiny_model_dir)]  # from the cache: no load


def _hash(graph: StepGraph) -> str:
    from tango.common.det_hash import det_hash

    return det_hash(graph[f"scores_{TASKS[0]}"].kwargs["model"].origin)


def test_a_source_loads_once_per_device_and_dtype(tiny_model_dir: Path, loads: list[str]) -> None:
    lazy = Lazy(Model, Params({"type": "tango_fairscale::causal_lm", "model": str(tiny_model_dir)}))
    one, other = ModelSource.of(lazy), ModelSource.of(copy.deepcopy(lazy))
    assert one is not None and other is not None
    fp32 = one.load(CPU, torch.float32)
    assert other.load(CPU, torch.float32) is fp32 and len(loads) == 1
    bf16 = other.load(CPU, torch.bfloat16)
    assert len(loads) == 2 and bf16 is not fp32
    assert {p.dtype for p in bf16.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in fp32.parameters()} == {torch.float32}  # untouched by the cast


def test_a_cast_copy_scores_as_the_cast_model_and_leaves_it_as_it_was(
    tiny_model_dir: Path,
) -> None:
    from conftest import choice_queries  # noqa: F401  (the tests' helpers are importable)

    from tango_fairscale.data.batches import collate
    from tango_fairscale.data.queries import Query

    model = ModelWrapper(str(tiny_model_dir)).eval()
    before = {name: value.clone() for name, value in model.state_dict().items()}
    copied = cast_copy(model, CPU, torch.bfloat16)
    assert evaluation_model(model, CPU, torch.float32) is model
    reference = copy.deepcopy(model).to(torch.bfloat16)
    assert {p.dtype for p in copied.parameters()} == {torch.bfloat16}
    assert copied.tokenizer is model.tokenizer
    head, embedding = copied.model.get_output_embeddings(), copied.model.get_input_embeddings()
    assert head.weight is embedding.weight  # tied weights stay tied
    batch = move_batch(collate([Query((5, 6, 7, 8, 9), 2), Query((10, 11, 12), 1)], 0), CPU)
    with torch.no_grad():
        assert torch.equal(copied(**batch)["loglikelihood"], reference(**batch)["loglikelihood"])
    for name, value in model.state_dict().items():
        assert value.dtype == before[name].dtype and torch.equal(value, before[name])


def test_bf16_true_leaves_a_shared_model_as_it_was_for_the_next_step(
    tiny_model_dir: Path,
) -> None:
    """A trained model's step result is one object for every scoring step that reads it."""
    task = TaskSpec(name="copa", data_dir=str(FIXTURES / "copa"), limit=2)
    shared = ModelWrapper(str(tiny_model_dir))
    step = TaskScoresStep()
    step.run(model=shared, task=task, precision="bf16-true")
    assert {p.dtype for p in shared.parameters()} == {torch.float32}
    after_bf16 = step.run(model=shared, task=task, precision="32-true")
    fresh = step.run(model=ModelWrapper(str(tiny_model_dir)), task=task, precision="32-true")
    assert after_bf16["samples"] == fresh["samples"]


def test_a_bf16_model_is_probed_on_the_gpu_only_where_its_fp32_weights_fit_four_times(
    tiny_model_dir, monkeypatch
) -> None:
    """A bf16 model's load probes run in fp32 on the GPU where that copy takes at most a quarter
    of the free memory, else on the CPU (the GPU's peak then stays at bf16's size)."""
    model = ModelWrapper(str(tiny_model_dir))
    fp32_bytes = sum(4 * p.numel() for p in itertools.chain(model.parameters(), model.buffers()))
    cuda = torch.device("cuda")
    for free_bytes, on_gpu in [(4 * fp32_bytes, True), (4 * fp32_bytes - 1, False)]:
        free_and_total = (free_bytes, 1 << 40)
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device, m=free_and_total: m)
        assert shared_model.probes_on(model, cuda, torch.bfloat16) is on_gpu
        assert shared_model.probes_on(model, cuda, torch.float32)
    assert shared_model.probes_on(model, CPU, torch.bfloat16)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="probes on a GPU")
def test_a_small_model_is_probed_on_the_gpu_it_scores_on(tiny_model_dir, probed_devices) -> None:
    """The load probes of a model that fits the GPU four times over in fp32 run there, in fp32,
    whatever dtype it scores in, and both dtypes take packed batches."""
    source = ModelSource({"model": str(tiny_model_dir)})
    cuda = torch.device("cuda")
    fp32 = source.load(cuda, torch.float32)
    bf16 = source.load(cuda, torch.bfloat16)
    assert probed_devices == ["cuda", "cuda"]
    assert fp32.supports_packing and bf16.supports_packing
    assert {p.device.type for p in bf16.parameters()} == {"cuda"}
