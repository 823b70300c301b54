"""The weight server's publish token, which travels in the environment: never in a flag, so `ps`
does not show it. Read by `rollflow weights serve` and `publish` and the trainer; set by the
launcher and the demos for the trainer they start."""

from __future__ import annotations

import os

TOKEN_ENV = "ROLLFLOW_WEIGHTS_TOKEN"


def publish_token() -> str | None:
    """The token in $ROLLFLOW_WEIGHTS_TOKEN; None when it is unset or empty."""
    return os.environ.get(TOKEN_ENV) or None
