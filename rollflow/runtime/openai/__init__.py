"""OpenAI-compatible routes (`/v1/completions`, `/v1/chat/completions`) shared by the manager and the built-in engine."""
