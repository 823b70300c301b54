"""rollflow: scheduling for LLM RL post-training, planned in simulation and run live."""

__version__ = "0.1.0"
