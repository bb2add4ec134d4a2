"""Shared test fixtures.

Two layers. ``tests/<package>/test_<module>.py`` (and the top-level ``tests/test_<module>.py`` of
the package's top-level modules and commands) are the unit tests of that module: they run in this
process (training on one process included), and all of them are in the default tier (``pytest``).
``tests/integration/<package>/`` holds the integration tests: several processes working together
(the parity runs of every engine against DDP, ``helpers/parity.py``; ranks scoring and generating
together; the faults of a 2-process run), the real commands (``tango run``, ``python -m
tango_fairscale run``, torchrun, the SLURM example; ``integration/commands/``), and lm-eval's own
evaluation as the reference of the package's scores. They are marked ``integration``
(``pytest -m integration`` selects them) and are in the slow tier, except what the default tier
runs of them: one 2-process parity test per engine (ddp, fairscale, fsdp2, pipe) and a few quick
ones (the commands' one-line refusals, the spawned workers' own behaviour, one comparison with
lm-eval per kind of request). A unit test may start one short-lived process where the fact is
about a fresh process (what an import pulls in, a command's exit status) or build a fixture with
one (``test_results.py``'s workspace).

The official PIQA files and the GPT-2 tokenizer are read from the directory named by the
environment variable ``TANGO_FAIRSCALE_SHARED_DATA`` (``.ci/run`` sets it to ``../shared/data``).
Tests that need it fail, never skip, when it is missing.
"""

import contextlib
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

# The compiled parity runs check how torch.compile composes with each engine, not Inductor's CPU
# kernels: its scalar C++ compiles in about half the time of its vectorized C++ (a clean clone
# starts with an empty Inductor cache: 33 s instead of 57 s for the three runs). Set before any
# process, this one or those it starts, reads Inductor's config.
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "0")

import pytest  # noqa: E402
import torch  # noqa: E402
from helpers.families import FAMILY_CONFIGS  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]


def _register_components() -> None:
    """What ``include_package: [tango_fairscale]`` does for ``tango run``: import every module."""
    from tango.common.util import import_module_and_submodules

    import_module_and_submodules("tango_fairscale")


_register_components()


INTEGRATION = Path(__file__).parent / "integration"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under ``tests/integration/`` is marked ``integration``."""
    for item in items:
        if INTEGRATION in item.path.parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(autouse=True)
def _environment_restored() -> Iterator[None]:
    """Each test leaves ``os.environ`` as it found it. Tango's ``initialize_logging`` (run by
    in-process ``tango run``s) exports its log level and log socket's port and its teardown
    leaves them: a later test's subprocess would send its log records to a dead socket."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def shared_data_dir() -> Path:
    """Directory holding ``piqa/`` and ``gpt2-tokenizer/``."""
    path = Path(os.environ.get("TANGO_FAIRSCALE_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))
    if not (path / "piqa" / "valid.jsonl").is_file():
        raise RuntimeError(
            f"shared test data not found at {path}: set TANGO_FAIRSCALE_SHARED_DATA to the "
            "directory holding piqa/ and gpt2-tokenizer/"
        )
    return path


@pytest.fixture
def probed_devices(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The device type of every model whose load probes run (``check_fast_path``, their first),
    in order, the probes themselves unchanged."""
    import tango_fairscale.model.causal_lm as causal_lm

    devices: list[str] = []
    check = causal_lm.check_fast_path

    def recorded(model, *args):  # type: ignore[no-untyped-def]
        devices.append(next(model.parameters()).device.type)
        return check(model, *args)

    monkeypatch.setattr(causal_lm, "check_fast_path", recorded)
    return devices


@pytest.fixture(scope="session")
def piqa_dir() -> Path:
    return shared_data_dir() / "piqa"


@pytest.fixture(scope="session")
def gpt2_tokenizer_dir() -> Path:
    """GPT-2's own tokenizer files: for the comparisons with lm-eval's encoding and scores."""
    return shared_data_dir() / "gpt2-tokenizer"


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory, gpt2_tokenizer_dir: Path) -> Path:
    """The tests' tokenizer (``helpers/tokenizer.py``): GPT-2's BPE with its first merges only."""
    from helpers.tokenizer import save_small_tokenizer

    return save_small_tokenizer(gpt2_tokenizer_dir, tmp_path_factory.mktemp("tokenizer"))


TINY_GPT2 = FAMILY_CONFIGS["gpt2"]  # dropout off: engines and world sizes must agree exactly


def save_tiny_gpt2(
    directory: Path, tokenizer_dir: Path, seed: int = 1, **overrides: object
) -> Path:
    """A seeded, randomly initialised GPT-2-shaped model saved like a hub checkpoint, its
    vocabulary that of the tokenizer in ``tokenizer_dir``."""
    from helpers.tokenizer import vocabulary_fields

    from tango_fairscale.model.causal_lm import ModelWrapper

    config = {**TINY_GPT2, **vocabulary_fields(tokenizer_dir), **overrides}
    model = ModelWrapper(config=config, tokenizer=str(tokenizer_dir), seed=seed)
    model.save(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> Path:
    return save_tiny_gpt2(tmp_path_factory.mktemp("tiny-gpt2"), tokenizer_dir)


@pytest.fixture(scope="session")
def family_model_dir(tmp_path_factory, tokenizer_dir):
    """``family_model_dir(name)``: the family's tiny model (``helpers/families.py``), saved once."""
    from helpers.families import save_tiny_model

    saved: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in saved:
            directory = tmp_path_factory.mktemp(name)
            saved[name] = save_tiny_model(name, directory, tokenizer_dir)
        return saved[name]

    return get


@contextlib.contextmanager
def lm_eval_as_released() -> Iterator[None]:
    """Within the block, lm-eval renders prompts with its own ``apply_template`` and lists a
    task's few-shot documents row by row (undoing the package's fixes, ``compat/lm_eval.py``):
    for the references tests compare with."""
    from lm_eval import utils
    from lm_eval.api.task import ConfigurableTask

    from tango_fairscale.compat import lm_eval as compat_lm_eval

    patched = utils.apply_template, ConfigurableTask.fewshot_docs
    fixes = compat_lm_eval.compile_templates_once, compat_lm_eval.read_fewshot_docs_in_bulk
    utils.apply_template = getattr(patched[0], "original", patched[0])
    ConfigurableTask.fewshot_docs = getattr(patched[1], "original", patched[1])
    # load_tasks applies the fixes again (fix_lm_eval) unless told not to
    compat_lm_eval.compile_templates_once = compat_lm_eval.read_fewshot_docs_in_bulk = _no_fix
    try:
        yield
    finally:
        utils.apply_template, ConfigurableTask.fewshot_docs = patched
        compat_lm_eval.compile_templates_once, compat_lm_eval.read_fewshot_docs_in_bulk = fixes


def _no_fix() -> None:
    pass


@pytest.fixture(scope="session")
def hflm(tmp_path_factory: pytest.TempPathFactory, gpt2_tokenizer_dir: Path):
    """lm-evaluation-harness's own HF backend over a tiny GPT-2 with GPT-2's own tokenizer, in fp32
    on the CPU: the reference the package's encoding and scores must equal.
    ``logits_cache=False``: its one-token cache returns the leading positions' log-probabilities
    for a request whose continuation is shorter than another's with the same
    ``context + continuation[:-1]`` (winogrande does this)."""
    from lm_eval.models.huggingface import HFLM

    model_dir = save_tiny_gpt2(tmp_path_factory.mktemp("gpt2-tokenizer-gpt2"), gpt2_tokenizer_dir)
    return HFLM(pretrained=str(model_dir), device="cpu", dtype="float32", logits_cache=False)


@pytest.fixture(scope="session")
def piqa_small(piqa_dir: Path):
    """The first 64 examples of each PIQA split."""
    from tango_fairscale.tasks.piqa import read_piqa

    return read_piqa(piqa_dir, limit=64)


def engine_config(engine: str, **engine_params) -> dict:
    return {
        "type": engine,
        "precision": "32-true",
        "optimizer": {"type": "torch::AdamW", "lr": 1e-3},
        "max_grad_norm": 0.5,  # below the tiny model's gradient norm: clipping is exercised
        **engine_params,
    }


def with_runtime(arguments: dict) -> dict:
    """Training step arguments as a config gives them: the keys of the ``runtime`` block
    (``device_count``, ``log_every``, ...) gathered into a
    :class:`~tango_fairscale.train.plan.TrainRuntime` (checked as it is built)."""
    import dataclasses

    from tango_fairscale.train.plan import TrainRuntime

    names = {field.name for field in dataclasses.fields(TrainRuntime)}
    runtime = {key: value for key, value in arguments.items() if key in names}
    rest = {key: value for key, value in arguments.items() if key not in names}
    return {**rest, "runtime": TrainRuntime(**runtime)} if runtime else rest


def train_tiny(
    workspace: Path,
    model_dir: Path,
    dataset_dict,
    engine: str = "tango_fairscale::ddp",
    device_count: int = 1,
    train_steps: int = 20,
    step_options: dict | None = None,
    **engine_params,
):
    """Run the real training step (spawning ``device_count`` processes) and return its model:
    lm-eval's ``piqa`` over ``dataset_dict``'s documents, validated on its validation split."""
    from tango.common import Lazy, Params
    from tango.integrations.torch import Model, TrainingEngine
    from tango.workspaces import LocalWorkspace

    from tango_fairscale.tasks.lm_eval import TaskSpec
    from tango_fairscale.train.step import TrainStep

    step = TrainStep(
        model=Lazy(Model, Params({"type": "tango_fairscale::causal_lm", "model": str(model_dir)})),
        engine=Lazy(TrainingEngine, Params(engine_config(engine, **engine_params))),
        task=TaskSpec(name="piqa", dataset=dataset_dict),
        **with_runtime(
            {
                "train_steps": train_steps,
                "batch_size": 8,
                "device_count": device_count,
                "validate_every": 10,
                "checkpoint_every": 5,
                "defer_checkpoints": False,  # exactly every 5 steps, whatever the disk
                "log_every": 1,
                **(step_options or {}),
            }
        ),
    )
    return step.result(LocalWorkspace(workspace))


def train_in(
    work_dir: Path,
    model_dir: Path,
    dataset_dict,
    engine: str,
    device_count: int,
    train_steps: int,
    **engine_params,
) -> None:
    """Run the training loop directly in ``work_dir`` (resuming from its checkpoints), as
    ``train_tiny`` configures it, so that one run can continue on another number of devices."""
    from tango.common import Lazy, Params
    from tango.integrations.torch import Model, TrainConfig, TrainingEngine

    from tango_fairscale.tasks.lm_eval import TaskSpec, load_tasks
    from tango_fairscale.tasks.training_pairs import training_pairs
    from tango_fairscale.train.launch import run_training
    from tango_fairscale.train.loop import TrainPlan, TrainRuntime

    config = TrainConfig(
        "test",
        work_dir,
        train_steps=train_steps,
        checkpoint_every=5,
        validate_every=10,
        log_every=1,
        is_distributed=device_count > 1,
        devices=[-1] * device_count,
        distributed_port=0,  # run_training binds a free one
        world_size=device_count,
    )
    model = Lazy(Model, Params({"type": "tango_fairscale::causal_lm", "model": str(model_dir)}))
    engine_lazy = Lazy(TrainingEngine, Params(engine_config(engine, **engine_params)))
    task = TaskSpec(name="piqa", dataset=dataset_dict)
    pairs = training_pairs(load_tasks(task, training=True)["tasks"]["piqa"], "piqa")
    # The optimizer state kept at the last step too: a later call continues the run.
    runtime = TrainRuntime(eval_batch_size=32, keep_optimizer_state=True, defer_checkpoints=False)
    run_training(TrainPlan(config, model, engine_lazy, pairs, [task], 8, runtime))


#: Weights of two runs agree to this, except for a few elements (:func:`assert_same_weights`).
WEIGHT_ATOL = 1e-5
#: Of a tensor's elements, the share (at least one) that may differ by more than
#: ``WEIGHT_ATOL``, but never by more than one optimizer step (the tests' lr, 1e-3).
STRAY_SHARE, STRAY_ATOL = 1e-5, 1e-3


def assert_close_by_key(
    got: Mapping[str, torch.Tensor],
    want: Mapping[str, torch.Tensor],
    keys: Iterable[str] | None = None,
    rtol: float = 0.0,
    atol: float = 0.0,
) -> None:
    """``got[key]`` equals ``want[key]`` within the tolerances (bitwise by default) for every key
    of ``keys`` (default: all of ``want``'s); a failure names the key and torch's details."""
    for key in want if keys is None else keys:
        torch.testing.assert_close(
            got[key], want[key], rtol=rtol, atol=atol, msg=lambda d, key=key: f"{key}: {d}"
        )


def assert_same_weights(
    expected: Mapping[str, torch.Tensor], got: Mapping[str, torch.Tensor], context: str = ""
) -> None:
    """The same keys, and every tensor within ``WEIGHT_ATOL`` but for at most ``STRAY_SHARE`` of
    its elements, which stay within ``STRAY_ATOL``. Why the strays: Adam divides each element's
    step by that element's own gradient scale, so an element whose gradient is as small as the
    rounding of another summation order (micro-batches, shards, a reordered kernel) can step
    differently (the pipe on the gemma3_text family can leave one element of its 1.6M-element
    embedding 1.6e-5 from DDP after 10 steps). A wrong reduction or a lost update moves far more
    elements than that. ``context`` (a family's name, say) starts a failure's message."""
    assert expected.keys() == got.keys(), context
    prefix = f"{context} " if context else ""
    for key, want in expected.items():
        difference = (got[key].double() - want.double()).abs()
        strays = int((difference > WEIGHT_ATOL).sum())
        allowed = max(1, int(STRAY_SHARE * want.numel()))
        worst = float(difference.max()) if difference.numel() else 0.0
        assert strays <= allowed and worst <= STRAY_ATOL, (
            f"{prefix}{key}: {strays} of {want.numel()} elements differ by more than {WEIGHT_ATOL} "
            f"(at most {allowed} may, by up to {STRAY_ATOL}); the largest difference is {worst}"
        )


def assert_same_training(reference, candidate_log, candidate_state, steps: int = 20) -> None:
    """Per-step losses within 1e-5 relative, the same weights (:func:`assert_same_weights`),
    the same validation accuracies; ``steps`` losses in each log."""
    losses = [r["train_loss"] for r in reference.training_log if "train_loss" in r]
    other = [r["train_loss"] for r in candidate_log if "train_loss" in r]
    assert len(losses) == len(other) == steps
    for step, (a, b) in enumerate(zip(losses, other), start=1):
        assert b == pytest.approx(a, rel=1e-5), f"loss differs at step {step}"
    assert_same_weights(reference.state_dict(), candidate_state)
    accuracies = [r["val_acc"] for r in candidate_log if "val_acc" in r]
    assert accuracies == [r["val_acc"] for r in reference.training_log if "val_acc" in r]


@pytest.fixture(scope="session")
def trained_run(request, tmp_path_factory, tiny_model_dir: Path, tokenizer_dir: Path, piqa_small):
    """``trained_run(name)``: the :class:`~helpers.group.TrainedRun` of the parity run ``name``
    (``tests/helpers/parity.py``). The first request of a world size trains every run of that
    world size that the selected tests name (``@pytest.mark.trains``) in one process group."""
    from helpers.families import save_tiny_model
    from helpers.parity import RunStore

    needed = {
        name
        for item in request.session.items
        for mark in item.iter_markers("trains")
        for name in mark.args
    }
    saved: dict[str, Path] = {"tiny": tiny_model_dir}

    def model_dir(name: str) -> Path:
        if name not in saved:
            saved[name] = save_tiny_model(name, tmp_path_factory.mktemp(name), tokenizer_dir)
        return saved[name]

    return RunStore(needed, tmp_path_factory.mktemp("parity-runs"), model_dir, piqa_small).get


def assert_same_run(reference, candidate) -> None:
    """:func:`assert_same_training` of two parity runs (``trained_run``), of the same length."""
    assert_same_training(
        reference, candidate.training_log, candidate.state_dict(), len(reference.losses())
    )


def child_processes(pid: int, marker: bytes) -> list[int]:
    """Process ids of the children of ``pid`` whose command line contains ``marker``."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == pid and marker in cmdline:
            children.append(int(stat.parent.name))
    return children


# Small PIQA-format files, for the reader's tests and hostile input -------------------------------


def line(goal: str, sol1: str = "a", sol2: str = "b") -> str:
    return json.dumps({"goal": goal, "sol1": sol1, "sol2": sol2})


GOOD_FILES: dict[str, str] = {
    "train.jsonl": "\n".join(line(f"train {i}") for i in range(3)) + "\n",
    "train-labels.lst": "1\n0\n1\n",
    "valid.jsonl": "\n".join(line(f"valid {i}") for i in range(3)) + "\n",
    "valid-labels.lst": "0\n1\n0\n",
    "tests.jsonl": "\n".join(line(f"test {i}") for i in range(3)) + "\n",
}


def make_piqa_dir(directory: Path, overrides: Mapping[str, str | None] | None = None) -> Path:
    """Write the five small, valid files into ``directory``; ``overrides`` replaces files by name
    (``None`` leaves one out)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, content in {**GOOD_FILES, **(overrides or {})}.items():
        if content is not None:
            (directory / name).write_text(content, encoding="utf-8")
    return directory


# PIQA token queries --------------------------------------------------------------------------


def piqa_task(examples, split: str = "validation"):
    """lm-eval's ``piqa`` task over ``examples`` (PIQA dicts) as its ``split``."""
    from tango.common.dataset_dict import DatasetDict

    from tango_fairscale.tasks.lm_eval import TaskSpec, load_tasks

    other = "train" if split == "validation" else "validation"
    dataset = DatasetDict(splits={split: list(examples), other: list(examples)[:1]})
    spec = TaskSpec(name="piqa", dataset=dataset)
    return load_tasks(spec, training=split == "train")["tasks"]["piqa"]


def choice_queries(examples, tokenizer, max_length: int):
    """Both choices of every PIQA example, as lm-eval's ``piqa`` task asks for them, encoded."""
    from tango_fairscale.data.queries import encode_pairs

    task = piqa_task(examples)
    pairs = [
        request.args
        for doc_id, doc in enumerate(task.validation_docs())
        for request in task.construct_requests(
            doc=doc, ctx=task.fewshot_context(doc, 0), metadata=("piqa", doc_id, 1)
        )
    ]
    return encode_pairs(tokenizer, pairs, max_length)


def training_queries(examples, tokenizer, max_length: int):
    """The correct choice of every labelled PIQA example, as the training step encodes them."""
    from tango_fairscale.data.queries import encode_pairs
    from tango_fairscale.tasks.training_pairs import training_pairs

    pairs = training_pairs(piqa_task(examples, split="train"), "piqa")
    return encode_pairs(tokenizer, pairs, max_length)
