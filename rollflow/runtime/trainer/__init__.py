"""The RL trainer: GRPO or PPO on micro-batches streamed from the rollout manager, weights pushed back."""
