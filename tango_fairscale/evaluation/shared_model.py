"""One loaded model for all the evaluation steps of a command: a model given as a config is loaded
when the first step that scores with it runs (a step found in the cache loads nothing), moved to
the device and cast once, and shared by every later step of the command that asks for the same
model (its Tango hash), device and weight dtype; it is released when the command's steps are.

Tango builds every step's arguments before it runs any: a ``model`` annotated ``Model`` would be
loaded once per step, cached or not (``configs/mc_suite.jsonnet``: nine copies of the model for
nine tasks). :class:`~tango_fairscale.evaluation.steps.TaskScoresStep` takes it as a ``Lazy``
instead and turns it into a :class:`ModelSource` (:meth:`ModelSource.of`), whose cache key is the
loaded model's.
"""

from __future__ import annotations

import copy
import itertools
import time
import weakref
from typing import Any, cast

import torch
from tango.common import Lazy, Params
from tango.common.det_hash import CustomDetHash, det_hash
from tango.common.from_params import _params_contain_step, create_kwargs
from tango.common.logging import cli_logger
from tango.integrations.torch import Model

from ..model.causal_lm import ModelWrapper, model_origin

#: Loaded models by (Tango hash, device, dtype), alive while a :class:`ModelSource` holds them.
_LOADED: weakref.WeakValueDictionary[tuple[str, str, str], ModelWrapper] = (
    weakref.WeakValueDictionary()
)


class ModelSource(CustomDetHash):
    """A ``tango_fairscale::causal_lm`` model's construction arguments, loaded on first use.

    :meth:`load` gives the model on a device in a dtype: loaded once per process for every
    ``ModelSource`` of the same model (the same :attr:`origin`: arguments and the fingerprints of
    their files), device and dtype, and held by each source that asked for it, so that it lives
    as long as the steps holding those sources (a command's step graph) and no longer.
    """

    def __init__(self, kwargs: dict[str, Any]) -> None:
        #: :class:`~tango_fairscale.model.causal_lm.ModelWrapper`'s constructor arguments.
        self.kwargs = kwargs
        #: The loaded model's :attr:`~tango_fairscale.model.causal_lm.ModelWrapper.origin`.
        self.origin = model_origin(**kwargs)
        self._held: dict[tuple[str, str, str], ModelWrapper] = {}

    @classmethod
    def of(cls, lazy: Lazy) -> ModelSource | None:
        """The source of a ``Lazy`` ``tango_fairscale::causal_lm`` model, its arguments read as
        Tango would construct it (refusing the same unknown keys); ``None`` for another model
        type or parameters that hold a step's result (constructed when the step runs)."""
        params = lazy._params
        if isinstance(params, str):
            params = Params({"type": params})
        params = Params(copy.deepcopy(Params(params).as_dict(quiet=True)))
        if _params_contain_step(params) or "type" not in params:
            return None
        subclass, constructor = Model.resolve_class_name(params.pop("type"))
        if subclass is not ModelWrapper or constructor is not None:
            return None
        kwargs = create_kwargs(
            cast(Any, ModelWrapper.__init__), ModelWrapper, params, lazy._constructor_extras
        )
        params.assert_empty(ModelWrapper.__name__)
        return cls(kwargs)

    def det_hash_object(self) -> Any:
        return self.origin

    def hash_stand_in(self) -> ModelWrapper:
        """An empty ``ModelWrapper`` whose Tango hash is the loaded model's: a step's cache key
        stays what it was when Tango loaded the model to build the step. Only for hashing."""
        stand_in = ModelWrapper.__new__(ModelWrapper)
        stand_in.__dict__["origin"] = self.origin
        return stand_in

    def load(self, device: torch.device, dtype: torch.dtype) -> ModelWrapper:
        """The model on ``device`` with ``dtype`` weights, in evaluation mode: the one already
        loaded in this process if there is one (see the class docstring)."""
        key = (det_hash(self.origin), str(device), str(dtype))
        model = self._held.get(key) or _LOADED.get(key)
        if model is None:
            start = time.perf_counter()
            model = ModelWrapper(**self.kwargs)
            if probes_on(model, device, dtype):  # else in fp32 on the CPU
                model.to(device)
            model.probe()
            model = model.to(device=device, dtype=dtype).eval()
            _LOADED[key] = model
            cli_logger.info(  # on the console: one line a command
                "loaded %s on %s (%s) in %.1f s, shared by this command's evaluation steps",
                self.kwargs.get("model") or "a model from config",
                device,
                str(dtype).removeprefix("torch."),
                time.perf_counter() - start,
            )
        self._held[key] = model
        return model


def probes_on(model: ModelWrapper, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the fp32 ``model`` runs its load probes (:meth:`ModelWrapper.probe`) on ``device``
    before its cast to ``dtype``: where it goes whole anyway (fp32, or the CPU), and on a GPU
    where its fp32 weights take at most a quarter of the free memory (milliseconds there against
    ~0.6 s of CPU forwards at 124M). A larger model is probed on the CPU, so that the cast on the
    way keeps the device's peak at the smaller dtype's size."""
    if dtype == torch.float32 or device.type == "cpu":
        return True
    if device.type != "cuda":
        return False
    free_bytes, _ = torch.cuda.mem_get_info(device)
    tensors = itertools.chain(model.parameters(), model.buffers())
    return 4 * sum(tensor.numel() * tensor.element_size() for tensor in tensors) <= free_bytes


def evaluation_model(
    model: ModelWrapper | ModelSource, device: torch.device, dtype: torch.dtype
) -> ModelWrapper:
    """``model`` on ``device`` with ``dtype`` weights, in evaluation mode, for scoring.

    A :class:`ModelSource` is loaded once for every step of the command
    (:meth:`ModelSource.load`). A ``ModelWrapper`` (a trained model's step result, which Tango
    shares between the steps that read it) is moved in place in fp32; any other dtype scores on a
    cast copy, so that the shared model keeps its fp32 weights for the next step."""
    if isinstance(model, ModelSource):
        return model.load(device, dtype)
    if dtype == torch.float32:  # probed on the device, at its first use
        return model.to(device=device, dtype=dtype).eval()
    model.probe()  # in fp32, before the cast: the copy keeps the result
    return cast_copy(model, device, dtype).eval()


def cast_copy(model: ModelWrapper, device: torch.device, dtype: torch.dtype) -> ModelWrapper:
    """A copy of ``model`` with its floating-point weights and buffers cast to ``dtype`` on
    ``device`` as ``Module.to`` casts them, tied weights still tied and the tokenizer shared;
    never a second full-precision copy of the weights."""
    memo: dict[int, Any] = {id(model.tokenizer): model.tokenizer}
    for tensor in itertools.chain(model.parameters(), model.buffers()):
        if tensor.is_floating_point():
            cast = tensor.detach().to(device=device, dtype=dtype)
        else:
            cast = tensor.detach().to(device=device)
        if isinstance(tensor, torch.nn.Parameter):
            cast = torch.nn.Parameter(cast, requires_grad=tensor.requires_grad)
        memo[id(tensor)] = cast
    return copy.deepcopy(model, memo)
