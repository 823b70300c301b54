"""The rollout manager: one service between a trainer and a fleet of rollout engines.

It splits batches into samples, routes each through a `rollflow.policy` router, streams
tokens from the engines and records every one of them, so that a sample whose engine dies,
hangs, is preempted or is offloaded resumes elsewhere from prompt + generated tokens with
nothing thrown away. Finished samples are packed into micro-batches for a streaming trainer.
"""
