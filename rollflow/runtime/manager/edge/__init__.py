"""The manager's HTTP face: its server, the route modules of each API it speaks (SGLang's,
sgl-router's, vLLM's, OpenAI's, its own sessions), their bodies, and the lean path for the
hottest requests. Handlers validate and hand over to `core`; nothing here decides."""
