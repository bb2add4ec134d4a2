"""Scoring (one device or every rank) and the cached evaluation steps."""

#: Queries a scoring batch holds at most by default (also prompts a generation batch holds,
#: within its cache's memory budget), and its tokens: on a GPU a forward of GPT-2 124M over a
#: few hundred short queries is mostly the host's launch time, so batches are large (the tokens
#: bound their memory: ``docs/PERFORMANCE.md``). Imported by the command line without torch.
DEFAULT_BATCH_SIZE = 1024
DEFAULT_MAX_BATCH_TOKENS = 32768
