"""The live system: rollout manager, engines, weight transfer and trainer."""
