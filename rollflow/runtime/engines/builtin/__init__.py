"""The built-in engine: transformers on CPU behind a subset of SGLang's HTTP API."""
