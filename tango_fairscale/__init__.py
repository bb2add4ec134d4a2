"""tango_fairscale: sharded training and lm-eval-exact evaluation of causal LMs as Tango steps.

``include_package: [tango_fairscale]`` (in ``tango.yml``) registers every component: Tango imports
each submodule. Importing this package alone imports nothing heavy (no torch), so that
``tango_fairscale.results`` and the ``tango-fairscale`` command start fast; import the module of a
component to use it from Python (e.g. ``tango_fairscale.train.step``).
"""

__version__ = "0.1.0"
