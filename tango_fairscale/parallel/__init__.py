"""Engines (DDP, FairScale FSDP, torch FSDP2, FairScale Pipe), their precision and sharding."""
