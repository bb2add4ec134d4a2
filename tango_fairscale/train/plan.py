"""What every training process is given: the plan of a run (:class:`TrainPlan`) and how the run is
carried out (:class:`TrainRuntime`, the training step's ``runtime`` block, not in its cache key)."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tango.common import FromParams, Lazy
from tango.integrations.torch import Model, TrainCallback, TrainConfig, TrainingEngine

from ..checks import boolean, one_of, positive_int, positive_ints
from ..evaluation.call import EvalOptions, GenerationSettings
from ..runtime.signals import PREEMPTION_SIGNALS
from ..tasks.lm_eval import TaskSpec


@dataclass(frozen=True)
class TrainRuntime(FromParams):
    """How a training run is carried out, not what it computes: the step's ``runtime`` block, left
    out of its cache key as one argument (1 or 8 devices, packed or padded, any cadence of logs
    and checkpoints train the same model up to float rounding). Checked when built.

    :param device_count: processes, one per GPU (or CPU processes over gloo without GPUs).
    :param log_every: steps between logged losses, throughput and memory.
    :param checkpoint_every: steps between checkpoints; a rerun resumes from the newest one whose
        files match its manifest (sizes and SHA-256 digests, recorded while writing).
    :param defer_checkpoints: a checkpoint due while the one before is still being written (on
        any rank) is taken at the first step after that write commits, so that the loop never
        waits for the disk; ``false``: exactly every ``checkpoint_every`` steps, waiting.
    :param keep_checkpoints: complete checkpoints kept while the run trains, the newest ones: once
        a checkpoint is complete, all but the newest ``keep_checkpoints`` are deleted. A rerun
        whose newest checkpoint is damaged (a file missing, truncated, altered, or from another
        checkpoint) resumes from the one before and logs why, so ``1`` leaves nothing to fall
        back to. Once the run finishes, only its final checkpoint is kept.
    :param keep_optimizer_state: keep the optimizer state in the final checkpoint of a finished
        run. By default it is dropped once the run finishes (the checkpoint rewritten model-only,
        verified, with its manifest: it exports to the same weights, it does not resume), as are
        the other checkpoints: the stored result holds the model. GPT-2 124M with AdamW: a 1.5 GB
        checkpoint becomes 0.5 GB.
    :param pack_sequences: feed micro-batches (and validation batches) packed end to end instead
        of right-padded (:func:`~tango_fairscale.data.batches.packed_batch`): the same losses up
        to float rounding, far fewer positions on short data such as PIQA. ``null``: packed where
        the engine's model takes packed batches (``ModelWrapper.supports_packing``; never under
        the ``pipe`` engine), else padded; ``true`` is refused where it does not.
    :param eval_batch_size: queries per validation batch, of at most
        ``EvalOptions.max_batch_tokens`` (32,768) tokens: the scoring step's batches.
    :param distributed_port: the port the processes meet on; ``null``: a free one.
    :param preemption_signal: on this signal (``SIGTERM``, ``SIGUSR1``, ...) the ranks train on
        to the next log step (``log_every``; after that step's validation, if any), where every
        rank agrees to stop, a checkpoint is written (after the write in flight, if any) and the
        step fails with ``TrainingStopped``; rerunning the same command resumes. Give a scheduler's
        grace period room for ``log_every`` steps and two checkpoint writes.
    :param collective_timeout_s: a rank that hangs (without dying) makes the others fail after
        this many seconds in a collective, instead of waiting forever.
    """

    device_count: int = 1
    log_every: int = 10
    checkpoint_every: int = 100
    defer_checkpoints: bool = True
    keep_checkpoints: int = 2
    keep_optimizer_state: bool = False
    pack_sequences: bool | None = False
    eval_batch_size: int = EvalOptions.batch_size
    distributed_port: int | None = None
    preemption_signal: str = "SIGTERM"
    collective_timeout_s: int = 600

    def __post_init__(self) -> None:
        positive_ints(
            {
                "runtime.device_count": self.device_count,
                "runtime.log_every": self.log_every,
                "runtime.checkpoint_every": self.checkpoint_every,
                "runtime.keep_checkpoints": self.keep_checkpoints,
                "runtime.eval_batch_size": self.eval_batch_size,
                "runtime.collective_timeout_s": self.collective_timeout_s,
            }
        )
        positive_int("runtime.distributed_port", self.distributed_port, optional=True)
        if self.pack_sequences is not None:
            boolean("runtime.pack_sequences", self.pack_sequences)
        boolean("runtime.keep_optimizer_state", self.keep_optimizer_state)
        boolean("runtime.defer_checkpoints", self.defer_checkpoints)
        one_of("runtime.preemption_signal", self.preemption_signal, PREEMPTION_SIGNALS)

    @property
    def preemption(self) -> signal.Signals:
        """:attr:`preemption_signal` as a signal."""
        return signal.Signals[self.preemption_signal]


#: The training step's ``runtime`` when its config gives none.
DEFAULT_RUNTIME = TrainRuntime()


@dataclass
class TrainPlan:
    """Everything a training process needs, validated by the launching process."""

    config: TrainConfig
    model: Lazy[Model]
    engine: Lazy[TrainingEngine]
    #: (context, continuation) of each training example's correct choice.
    training_pairs: list[tuple[str, str]]
    validate_tasks: list[TaskSpec]
    batch_size: int
    #: How the run is carried out (its cadences and devices are in ``config`` too, Tango's form).
    runtime: TrainRuntime = DEFAULT_RUNTIME
    #: Modules that register the model's and engine's types: worker processes import them.
    component_modules: tuple[str, ...] = ()
    callbacks: list[Lazy[TrainCallback]] = field(default_factory=list)
    #: The Tango workspace the step runs in (for callbacks).
    workspace: Any = None
    #: The summary key handed to callbacks as ``val_metric`` (higher is better).
    val_metric: str | None = None
    #: The run's id, which every file of its checkpoints carries (made by the launching process,
    #: kept beside the checkpoints; ``None``: each process reads or makes it there).
    run_id: str | None = None
    #: How validation tasks that generate text decode (part of the step's cache key).
    generation: GenerationSettings = field(default_factory=GenerationSettings)
    #: Rank 0 writes the trained model to ``final_weights.pt`` (always when it is a spawned
    #: process); ``False``: it returns it to the launching process it runs in, which saves a
    #: write and a read of the whole model (the training step's plans).
    final_weights_to_file: bool = True
    #: Seconds the launching step took to read the training pairs and validation tasks (the run's
    #: ``data`` phase, :class:`~tango_fairscale.train.meter.PhaseClock`).
    data_seconds: float = 0.0

    @property
    def checkpoints(self) -> Path:
        return self.config.work_dir / "checkpoints"

    @property
    def train_steps(self) -> int:
        """The optimizer steps of the run (Tango's ``TrainConfig`` also allows epochs instead;
        a plan always has steps)."""
        assert self.config.train_steps is not None
        return self.config.train_steps

    @property
    def packed(self) -> bool:
        """Whether batches are packed (once :func:`build_engine` resolved ``None``)."""
        return bool(self.runtime.pack_sequences)
