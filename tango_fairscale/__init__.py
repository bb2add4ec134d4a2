"""tango_fairscale: sharded training and lm-eval-exact evaluation of causal LMs as Tango steps.

Importing the package registers its components (``include_package: [tango_fairscale]`` in
``tango.yml`` does this for ``tango run``).
"""

from . import compat

compat.apply()

from . import data, engines, evaluation, format, model, train  # noqa: E402

__all__ = ["data", "engines", "evaluation", "format", "model", "train"]
