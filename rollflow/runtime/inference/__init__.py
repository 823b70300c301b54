"""Inference between the rollout manager and the actor: reference log-prob workers (RLinf's rollout -> inference -> actor)."""
