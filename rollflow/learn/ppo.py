"""PPO for discrete actions, anchored to a behaviour-cloned reference.

One iteration: collect `rollout_steps` decisions at the scheduled temperature, compute GAE
advantages, then `epochs` passes of minibatch updates of

    loss = -clipped surrogate + value_weight * value error - entropy_weight(t) * entropy
           + kl_weight(t) * KL(policy || reference)

The KL weight decays linearly from kl_start to kl_end over kl_decay_steps (Vidur-Arc2's anchor);
the entropy weight holds for entropy_warmup_steps then decays; the temperature decays to
min_temperature. An env that reports `info["credit"]` (the routing env) has each request's reward
moved back to the step that routed it, when that step is still in the buffer. With kl weights at 0 and temperature 1 this is SB3's PPO (clip, GAE,
per-minibatch advantage normalisation, gradient clipping), which benchmarks/ppo_vs_sb3.py checks.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rollflow.learn.config import PPOConfig


def linear(start: float, end: float, progress: float) -> float:
    return start + (end - start) * min(max(progress, 0.0), 1.0)


@dataclass(frozen=True)
class Schedule:
    """The knobs that move with the step count."""

    kl_weight: float
    entropy_weight: float
    temperature: float


def schedule_at(settings: PPOConfig, step: int) -> Schedule:
    s = settings
    entropy_progress = (step - s.entropy_warmup_steps) / max(1, s.total_steps - s.entropy_warmup_steps)
    return Schedule(
        kl_weight=linear(s.kl_start, s.kl_end, step / s.kl_decay_steps),
        entropy_weight=linear(s.entropy_start, s.entropy_end, entropy_progress),
        temperature=max(
            s.min_temperature, linear(s.temperature_start, s.min_temperature, step / s.total_steps)
        ),
    )


def _move_credit(
    rewards: np.ndarray, t: int, credit: list[tuple[int, float]], step_of_decision: dict[int, int]
) -> None:
    """Move each (decision, amount) from step t back to the step that made the decision, if buffered."""
    for decision, amount in credit:
        owner = step_of_decision.pop(decision, None)
        if owner is not None:
            rewards[owner] += amount
            rewards[t] -= amount


class PPO:
    def __init__(
        self,
        policy: nn.Module,
        env: gym.Env,
        settings: PPOConfig,
        reference: nn.Module | None = None,
        seed: int = 0,
    ) -> None:
        self.policy = policy
        self.env = env
        self.settings = settings
        self.reference = copy.deepcopy(reference).eval() if reference is not None else None
        self.optimizer = torch.optim.Adam(policy.parameters(), lr=settings.learning_rate, eps=1e-5)
        self.generator = torch.Generator().manual_seed(seed)
        self.step = 0
        self._obs, _ = env.reset(seed=seed)
        self._episode_return = 0.0
        self.episode_returns: list[float] = []

    def iterate(self) -> dict[str, float]:
        """One rollout and its updates; returns the metrics of this iteration."""
        sched = schedule_at(self.settings, self.step)
        batch = self._collect(sched.temperature)
        metrics = self._update(batch, sched)
        finished = self.episode_returns
        self.episode_returns = []
        metrics.update(
            step=float(self.step),
            kl_weight=sched.kl_weight,
            entropy_weight=sched.entropy_weight,
            temperature=sched.temperature,
            episodes=float(len(finished)),
            episode_return=float(np.mean(finished)) if finished else float("nan"),
            reward_per_step=float(batch["rewards"].mean()),
        )
        return metrics

    def state_dict(self) -> dict:
        return {
            "policy": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "reference": self.reference.state_dict() if self.reference is not None else None,
            "step": self.step,
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.reference is not None and state["reference"] is not None:
            self.reference.load_state_dict(state["reference"])
        self.step = state["step"]
        self.generator.set_state(state["generator"])

    # -- phases -----------------------------------------------------------------------------------
    def _collect(self, temperature: float) -> dict[str, torch.Tensor]:
        n = self.settings.rollout_steps
        obs_buf = np.zeros((n, *self.env.observation_space.shape), dtype=np.float32)
        actions = np.zeros(n, dtype=np.int64)
        rewards = np.zeros(n, dtype=np.float32)
        dones = np.zeros(n, dtype=np.float32)
        logps = np.zeros(n, dtype=np.float32)
        values = np.zeros(n + 1, dtype=np.float32)
        step_of_decision: dict[int, int] = {}  # this episode's decision index -> buffer index
        with torch.no_grad():
            for t in range(n):
                obs = torch.as_tensor(self._obs)[None]
                dist = torch.distributions.Categorical(logits=self.policy.logits(obs)[0] / temperature)
                action = torch.multinomial(dist.probs, 1, generator=self.generator)[0]
                obs_buf[t], actions[t] = self._obs, int(action)
                logps[t], values[t] = float(dist.log_prob(action)), float(self.policy.value(obs)[0])
                self._obs, reward, terminated, truncated, info = self.env.step(int(action))
                rewards[t] = reward
                if "decision" in info:
                    step_of_decision[info["decision"]] = t
                    _move_credit(rewards, t, info["credit"], step_of_decision)
                self._episode_return += reward
                if terminated or truncated:
                    if truncated and not terminated:  # bootstrap a cut-off episode, as SB3 does
                        rewards[t] += self.settings.gamma * float(
                            self.policy.value(torch.as_tensor(self._obs)[None])[0]
                        )
                    dones[t] = 1.0
                    self.episode_returns.append(self._episode_return)
                    self._episode_return = 0.0
                    self._obs, _ = self.env.reset()
                    step_of_decision = {}
            values[n] = float(self.policy.value(torch.as_tensor(self._obs)[None])[0])
        self.step += n
        advantages = np.zeros(n, dtype=np.float32)
        gae = 0.0
        s = self.settings
        for t in reversed(range(n)):
            nonterminal = 1.0 - dones[t]
            delta = rewards[t] + s.gamma * values[t + 1] * nonterminal - values[t]
            gae = delta + s.gamma * s.gae_lambda * nonterminal * gae
            advantages[t] = gae
        return {
            "obs": torch.as_tensor(obs_buf),
            "actions": torch.as_tensor(actions),
            "logps": torch.as_tensor(logps),
            "advantages": torch.as_tensor(advantages),
            "returns": torch.as_tensor(advantages + values[:n]),
            "rewards": torch.as_tensor(rewards),
        }

    def _update(self, batch: dict[str, torch.Tensor], sched: Schedule) -> dict[str, float]:
        s = self.settings
        n = len(batch["actions"])
        totals = {
            "policy_loss": 0.0,
            "value_loss": 0.0,
            "entropy": 0.0,
            "kl_to_reference": 0.0,
            "clip_fraction": 0.0,
        }
        count = 0
        with torch.no_grad():
            ref_logp = (
                torch.log_softmax(self.reference.logits(batch["obs"]) / sched.temperature, dim=-1)
                if self.reference is not None
                else None
            )
        for _ in range(s.epochs):
            order = torch.randperm(n, generator=self.generator)
            for start in range(0, n, s.minibatch_size):
                idx = order[start : start + s.minibatch_size]
                logp_all = torch.log_softmax(
                    self.policy.logits(batch["obs"][idx]) / sched.temperature, dim=-1
                )
                logp = logp_all.gather(1, batch["actions"][idx, None])[:, 0]
                adv = batch["advantages"][idx]
                if len(idx) > 1:
                    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                ratio = torch.exp(logp - batch["logps"][idx])
                policy_loss = -torch.min(ratio * adv, ratio.clamp(1 - s.clip, 1 + s.clip) * adv).mean()
                value_loss = ((self.policy.value(batch["obs"][idx]) - batch["returns"][idx]) ** 2).mean()
                probs = logp_all.exp()
                entropy = -(probs * logp_all).sum(-1).mean()
                kl = (
                    (probs * (logp_all - ref_logp[idx])).sum(-1).mean()
                    if ref_logp is not None
                    else torch.zeros(())
                )
                loss = (
                    policy_loss
                    + s.value_weight * value_loss
                    - sched.entropy_weight * entropy
                    + sched.kl_weight * kl
                )
                self.optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(self.policy.parameters(), s.max_grad_norm)
                self.optimizer.step()
                totals["policy_loss"] += policy_loss.item()
                totals["value_loss"] += value_loss.item()
                totals["entropy"] += entropy.item()
                totals["kl_to_reference"] += kl.item()
                totals["clip_fraction"] += float(((ratio - 1).abs() > s.clip).float().mean())
                count += 1
        return {k: v / count for k, v in totals.items()}
