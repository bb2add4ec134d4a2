"""What a run leaves on disk, in pure Python (no torch, no Tango): file names, the checkpoint
directory protocol and the fingerprints that cache keys hold.

``train/``, ``parallel/``, ``results/`` and the export command read and write a run's files through
this package, so that each name and each rule is written once; ``results`` imports nothing else of
the package.
"""
