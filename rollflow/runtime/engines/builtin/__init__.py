"""The built-in engine: transformers on CPU behind a subset of SGLang's HTTP API."""

DEFAULT_MAX_RUNNING_REQUESTS = 64
"""Requests decoding at once (SGLang's --max-running-requests); later ones wait their turn in the
engine, first come, first served."""
