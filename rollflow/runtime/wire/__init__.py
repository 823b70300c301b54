"""Wire types: what travels between trainers, the manager and engines, below all of them (as
SGLang's io_struct.py keeps them): sampling parameters and the one request-body base (base.py),
and the bodies of SGLang's API (sglang.py), OpenAI's (openai.py) and the built-in engine's own
routes (builtin.py)."""
