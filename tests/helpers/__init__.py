"""Test helpers importable from test modules and from spawned training processes (``tests/`` is on
``sys.path``); modules here import no test fixtures, so a spawned process imports only what it
trains with."""
