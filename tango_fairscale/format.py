"""How a trained model is stored in the workspace: Hugging Face's layout, no pickles."""

from __future__ import annotations

import json
from pathlib import Path

from tango import Format
from tango.common.aliases import PathOrStr

from .model import ModelWrapper

TRAINING_LOG = "training_log.jsonl"


@Format.register("tango_fairscale::model")
class ModelFormat(Format[ModelWrapper]):
    """Stores a :class:`~tango_fairscale.model.ModelWrapper` as ``save_pretrained`` output
    (safetensors weights, config, tokenizer) plus its ``training_log`` as JSON lines.

    Registered as a Tango ``Format`` under the name ``"tango_fairscale::model"``. The directory
    loads with ``AutoModelForCausalLM.from_pretrained(dir)``, and as ``-D model=dir`` in the config.
    """

    VERSION = "001"

    def write(self, artifact: ModelWrapper, dir: PathOrStr) -> None:
        directory = Path(dir)
        artifact.save(directory)
        log = getattr(artifact, "training_log", [])
        (directory / TRAINING_LOG).write_text("".join(json.dumps(r) + "\n" for r in log))

    def read(self, dir: PathOrStr) -> ModelWrapper:
        directory = Path(dir)
        model = ModelWrapper(str(directory))
        log_path = directory / TRAINING_LOG
        lines = log_path.read_text().splitlines() if log_path.is_file() else []
        model.training_log = [json.loads(line) for line in lines if line.strip()]
        return model
