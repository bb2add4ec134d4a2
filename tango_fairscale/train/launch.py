"""A training plan run on every device: in this process, in one process per device spawned from
here, or on the processes of an external launcher (torchrun, SLURM), which join rank 0's run."""

from __future__ import annotations

from typing import Any

import torch
from tango.common import Lazy, Registrable

from ..model.causal_lm import ModelWrapper
from ..model.loading import MODEL_CODE
from ..parallel.fsdp2 import FSDP2_CODE, FSDP2Engine
from ..records.checkpoints import run_id
from ..runtime import launcher
from ..runtime.collector import collect_cycles
from ..runtime.process_group import hosted_store
from ..runtime.spawn import WorkerFailed, run_workers
from .checkpoints import TrainingStopped, resume_hint
from .loop import TrainPlan, spawned_worker, train_worker

#: The costly modules a component's module imports only when the component is used (transformers'
#: model code, FSDP2's and DCP's torch modules), by that module: a fork server imports them with
#: it, once for its workers.
DEFERRED_IMPORTS = {ModelWrapper.__module__: MODEL_CODE, FSDP2Engine.__module__: FSDP2_CODE}


def run_training(plan: TrainPlan) -> dict[str, torch.Tensor] | None:
    """Train in ``plan.config.work_dir`` (resuming from its newest checkpoint) on every device.

    One device trains in this process; several are spawned processes, to which the preemption
    signal received here is passed on (a worker that dies or fails stops the others at once).
    Under an external launcher (:mod:`tango_fairscale.runtime.launcher`) the processes already
    exist: this one (rank 0) hands the plan to the others and trains as rank 0.

    Returns the trained model where this process trained as rank 0; ``None`` where a spawned
    rank 0 wrote it to ``final_weights.pt``.
    """
    plan.config.work_dir.mkdir(parents=True, exist_ok=True)
    plan.run_id = run_id(plan.checkpoints)  # made once; every rank's files carry it
    launch = launcher.current()
    if launch is not None:
        job = launch.publish(plan.config.work_dir, plan)
        return _engine_freed(train_worker(launch.rank, plan, launch.job_store(job)))
    if plan.config.world_size == 1:
        return _engine_freed(train_worker(0, plan))
    try:
        with hosted_store(plan.config):
            run_workers(
                spawned_worker,
                (plan,),
                plan.config.world_size,
                plan.runtime.preemption,
                preload=plan.component_modules,
            )
    except WorkerFailed as error:
        raise TrainingStopped(f"{error}{_hint(error, plan)}") from error  # the log keeps
        # the worker's traceback
    return None


def _engine_freed(trained: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor] | None:
    """``trained``, once the engine this process trained with is collected: its wrapper's hooks
    hold it in reference cycles (FairScale's flat parameter on the device, say), which a
    ``tango run`` process, going on to score the trained model, collects rarely."""
    collect_cycles()
    return trained


def _hint(error: WorkerFailed, plan: TrainPlan) -> str:
    """What to do about a worker's failure: resume after a death; after a collective's timeout
    (gloo says "Timed out" or "timeout caused pair closure", NCCL "Watchdog caught collective
    operation timeout"), what the timeout was."""
    message = str(error)
    if "died" in message:
        return f"; {resume_hint(plan.checkpoints)}"
    if "timed out" in message.lower() or "timeout" in message.lower():
        return (
            f"; a collective timed out after {plan.runtime.collective_timeout_s:g} s "
            "(collective_timeout_s): another process hung or stopped"
        )
    return ""


def join_training(launch: launcher.Launch, job: int, plan: TrainPlan) -> None:
    """A launched rank other than 0: train ``plan`` (published by rank 0) on this node's device."""
    plan.config.devices = [launch.environment.local_device()] * plan.config.world_size
    train_worker(launch.rank, plan, launch.job_store(job))


def component_modules(*components: Lazy) -> tuple[str, ...]:
    """The modules that register the types ``components`` (``Lazy``) name, theirs and their
    parameters' (an engine's optimizer and scheduler, ...), for processes that start without
    them: every module defining a registered class whose name appears as a ``type``, each
    followed by the modules it imports only when used (:data:`DEFERRED_IMPORTS`: the model's
    transformers code, FSDP2's torch modules), so that a fork server imports them once."""
    names: set[str] = set()

    def collect(value: Any) -> None:
        if isinstance(value, dict):
            if isinstance(value.get("type"), str):
                names.add(value["type"])
            for item in value.values():
                collect(item)
        elif isinstance(value, list):
            for item in value:
                collect(item)

    for component in components:
        collect(component._params.as_dict(quiet=True))
    modules = []
    for registry in Registrable._registry.values():
        for name, (cls, _) in registry.items():
            if name in names:
                modules.append(cls.__module__)
    for module in list(modules):
        modules.extend(DEFERRED_IMPORTS.get(module, ()))
    return tuple(dict.fromkeys(modules))
