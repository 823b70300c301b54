"""The live half of rollflow: the rollout manager, engine clients and the built-in engine."""
