"""Engines (DDP, FairScale FSDP, torch FSDP2, FairScale Pipe), their precision and sharding."""

#: The precision settings, by Lightning's names (:mod:`.precision` resolves them); kept here, in a
#: module that imports nothing, for the command line, which parses without torch.
PRECISIONS = ("auto", "32-true", "bf16-mixed", "16-mixed", "bf16-true")
