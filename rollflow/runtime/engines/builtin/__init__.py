"""The built-in engine: transformers on CPU or a GPU behind a subset of SGLang's HTTP API."""

DEFAULT_MAX_RUNNING_REQUESTS = 64
"""Requests decoding at once (SGLang's --max-running-requests); later ones wait their turn in the
engine, first come, first served."""

DEFAULT_PREFIX_CACHE_TOKENS = 32768
"""Tokens of prompt-prefix KV the engine keeps for later requests (0 turns the cache off)."""
