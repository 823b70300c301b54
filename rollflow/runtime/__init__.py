"""The live half of rollflow: rollout manager, engine clients, weights, trainer, launchers."""
