"""Rollout engines: clients for SGLang and vLLM servers, and the built-in CPU engine."""
