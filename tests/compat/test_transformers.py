"""``compat/transformers.py``: within :func:`unpacked_sequences` transformers never looks for
packed sequences (no host read), and its own detection is back afterwards, even after an error."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from transformers import masking_utils

from tango_fairscale.compat.transformers import unpacked_sequences


def test_packed_sequences_are_not_looked_for_within_the_block() -> None:
    detect = masking_utils.find_packed_sequence_indices
    packed = torch.tensor([[0, 1, 2, 0, 1]])  # two sequences in one row
    assert detect(packed) is not None
    with unpacked_sequences():
        assert masking_utils.find_packed_sequence_indices(packed) is None
    assert masking_utils.find_packed_sequence_indices is detect
    with pytest.raises(RuntimeError), unpacked_sequences():
        raise RuntimeError("a failed forward")
    assert masking_utils.find_packed_sequence_indices is detect


@pytest.mark.slow  # two fresh interpreters importing transformers: ~15 s on 2 cores
def test_the_training_code_imports_no_scikit_learn_nor_scipys_optimizer_nor_torchao() -> None:
    """Every component registered and transformers' generation and modeling code imported:
    scikit-learn (transformers imports it for assisted generation only) stays out of the
    process, and so do scipy's optimizer (for its object-detection losses) and torchao (for its
    quantized checkpoints), while transformers still finds both installed and its torchao
    quantizer saves through torchao's own function; without the fixes all three are there."""
    pytest.importorskip("torchao")  # the dev extra installs it (for float8)
    code = (
        "import sys, torch\n"
        "from tango.common.util import import_module_and_submodules\n"
        "import_module_and_submodules('tango_fairscale')\n"
        "import transformers.generation.candidate_generator, transformers.modeling_utils\n"
        "from transformers.utils import is_scipy_available\n"
        "from transformers.quantizers import quantizer_torchao as quantizer\n"
        "print(sorted(name for name in sys.modules if name.split('.')[0] == 'sklearn')[:1],\n"
        "      'scipy.optimize' in sys.modules, is_scipy_available(),\n"
        "      'torchao' in sys.modules, quantizer.is_torchao_available())\n"
        "state = {'w': torch.arange(4.0)}\n"
        "flat, metadata = quantizer.flatten_tensor_state_dict(state)\n"
        "from torchao.prototype.safetensors import safetensors_support as torchaos\n"
        "expected = torchaos.flatten_tensor_state_dict(state)\n"
        "print(sorted(flat) == sorted(expected[0]) and metadata == expected[1]\n"
        "      and all(torch.equal(flat[k], expected[0][k]) for k in flat))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.split() == ["[]", "False", "True", "False", "True", "True"], run.stdout
    control = (
        "import transformers.generation.candidate_generator, transformers.modeling_utils, sys\n"
        "print('sklearn' in sys.modules, 'scipy.optimize' in sys.modules, 'torchao' in sys.modules)"
    )
    unfixed = subprocess.run([sys.executable, "-c", control], capture_output=True, text=True)
    assert unfixed.stdout.strip() == "True True True", unfixed.stderr[-2000:]
