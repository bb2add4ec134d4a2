"""The Tango model around a Hugging Face causal LM, its scored-position loss, pipeline stages."""
