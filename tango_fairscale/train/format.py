"""How a trained model is stored in the workspace: Hugging Face's layout and the training log, no
pickles."""

from __future__ import annotations

from pathlib import Path

from tango import Format
from tango.common.aliases import PathOrStr

from .. import compat  # noqa: F401  (Tango fixes)
from ..model.causal_lm import ModelWrapper
from ..records.training_log import TRAINING_LOG, read_training_log, write_records


@Format.register("tango_fairscale::model")
class ModelFormat(Format[ModelWrapper]):
    """Stores a :class:`~tango_fairscale.model.causal_lm.ModelWrapper` as ``save_pretrained``
    output (safetensors weights, config, tokenizer) plus its ``training_log`` as JSON lines.

    Registered as a Tango ``Format`` under the name ``"tango_fairscale::model"``. The directory
    loads with ``AutoModelForCausalLM.from_pretrained(dir)``, and as ``-D model=dir`` in the config.
    """

    VERSION = "001"

    def write(self, artifact: ModelWrapper, dir: PathOrStr) -> None:
        directory = Path(dir)
        artifact.save(directory)
        write_records(directory / TRAINING_LOG, getattr(artifact, "training_log", []))

    def read(self, dir: PathOrStr) -> ModelWrapper:
        directory = Path(dir)
        model = ModelWrapper(str(directory))
        model.training_log = read_training_log(directory / TRAINING_LOG)
        return model
