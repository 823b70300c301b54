"""Live executor of the resource policy's plans (drain, sleep, wake, grow, shrink)."""
