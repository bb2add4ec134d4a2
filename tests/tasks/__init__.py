"""Tests of ``tango_fairscale.tasks`` (a package: ``test_lm_eval`` is also a module name in
``tests/compat``)."""
