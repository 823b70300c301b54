"""The manager's bearer token, which travels in the environment: never in a flag, so `ps` does not
show it. The default of `rollflow manager serve --token` and `relay --token`, read by the trainer;
set by the launcher for the trainer and the relays it starts."""

from __future__ import annotations

TOKEN_ENV = "ROLLFLOW_MANAGER_TOKEN"
