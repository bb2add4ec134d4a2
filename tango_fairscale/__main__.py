"""``python -m tango_fairscale COMMAND``: the ``tango-fairscale`` command (see :mod:`.cli`)."""

import sys

from .cli import main

if __name__ == "__main__":  # Tango imports every submodule of an included package
    sys.exit(main())
