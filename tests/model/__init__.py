"""Tests of ``tango_fairscale.model`` (a package: ``test_fingerprint`` is also a module name in
``tests/records``)."""
