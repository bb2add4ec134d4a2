"""Engines (DDP, FairScale FSDP, torch FSDP2, FairScale Pipe), their precision and sharding."""

# Both names below are kept in this module, which imports nothing, for the command line, which
# parses without torch.

#: The engines' short names: each is registered as ``tango_fairscale::NAME``.
ENGINES = ("ddp", "fairscale", "fsdp2", "pipe")

#: The precision settings, by Lightning's names (:mod:`.precision` resolves them).
PRECISIONS = ("auto", "32-true", "bf16-mixed", "16-mixed", "bf16-true")
