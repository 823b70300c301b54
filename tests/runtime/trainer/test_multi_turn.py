"""Multi-turn episodes in the trainer: the environment's tokens are context, never trained on."""

from __future__ import annotations

import types

import torch
from torch import nn

from rollflow.runtime.trainer.algorithm import LossSettings, backward_micro_batch
from rollflow.runtime.trainer.episodes import episode_sample
from rollflow.runtime.trainer.rollouts import model_output, to_tensors
from rollflow.runtime.trainer.tasks import arithmetic_reward, calculator
from tests.runtime.processes import http
from tests.runtime.trainer.test_train_e2e import base_config, engine_versions, rows, train

VOCAB = 16


class PositionLogits(nn.Module):
    """A policy whose logits at position t are a parameter row of its own: the gradient of row t is
    non-zero exactly when the loss reads the prediction made at t."""

    def __init__(self, length: int) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(length, VOCAB))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        return types.SimpleNamespace(logits=self.table[None].expand(len(input_ids), -1, -1))


def episode(rewards_differ: int) -> dict:
    # prompt [1, 2]; turn 1 [3, 4]; the tool's [9, 9, 9]; turn 2 [5 + rewards_differ]
    return {
        "prompt_ids": [1, 2],
        "output_ids": [3, 4, 9, 9, 9, 5 + rewards_differ],
        "output_logprobs": [-1.0, -1.0, 0.0, 0.0, 0.0, -1.0],
        "loss_mask": [1, 1, 0, 0, 0, 1],
        "spans": [],
    }


def test_the_loss_mask_leaves_environment_tokens_out_of_the_tensors():
    rollout = to_tensors([[episode(0)]], pad_id=0)
    # position t predicts token t+1: turn 1 from positions 1, 2; the tool's tokens (3..5) masked; turn 2 from 6
    assert rollout.mask.tolist() == [[0, 1, 1, 0, 0, 0, 1]]
    assert model_output(episode(0)) == [3, 4, 5]


def test_no_gradient_flows_from_the_environments_tokens():
    torch.manual_seed(0)
    groups = [[episode(0), episode(1)]]  # two samples of one group, so GRPO's advantage is non-zero
    rollout = to_tensors(groups, pad_id=0)
    policy = PositionLogits(rollout.input_ids.shape[1])
    reference = PositionLogits(rollout.input_ids.shape[1])
    settings = LossSettings("grpo", 0.2, 0.1, 1.0, 1.0, 0.95, 0.5)
    backward_micro_batch(policy, reference, None, rollout, torch.tensor([1.0, 0.0]), settings, 1.0)
    grad_by_position = policy.table.grad.abs().sum(-1)
    trained = [1, 2, 6]  # the positions that predict the model's own tokens
    environment = [3, 4, 5]  # the positions that predict the tool's tokens
    assert all(grad_by_position[t] > 0 for t in trained), grad_by_position
    assert all(grad_by_position[t] == 0 for t in environment), grad_by_position


def test_an_episode_record_becomes_a_sample_whose_spans_lie_in_its_output():
    record = {
        "session_id": "s",
        "context_ids": [1, 2, 3, 4, 9, 5],
        "logprobs": [0.0, 0.0, -0.5, -0.5, 0.0, -0.25],
        "loss_mask": [0, 0, 1, 1, 0, 1],
        "weight_version": 0,
        "turns": [
            {"spans": [{"start": 2, "end": 4, "weight_version": 0}], "finish_reason": "length", "resumes": 0},
            {"spans": [{"start": 5, "end": 6, "weight_version": 1}], "finish_reason": "stop", "resumes": 1},
        ],
    }
    sample = episode_sample(record, num_prompt=2)
    assert sample["prompt_ids"] == [1, 2] and sample["output_ids"] == [3, 4, 9, 5]
    assert sample["loss_mask"] == [1, 1, 0, 1]
    assert [(s["start"], s["end"], s["weight_version"]) for s in sample["spans"]] == [(0, 2, 0), (3, 4, 1)]
    assert sample["resumes"] == 1 and sample["finish_reason"] == "stop"


class DigitTokenizer:
    """One token per character: enough to check the arithmetic task's rules."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)


def test_the_calculator_answers_a_call_and_ends_the_episode_on_the_answer():
    tok = DigitTokenizer()
    prompt = tok.encode("12+30=")
    assert tok.decode(calculator(prompt, [tok.encode("let me see 6*7")], tok)) == " [=42] "
    assert tok.decode(calculator(prompt, [tok.encode("no idea")], tok)) == " [?] "
    assert calculator(prompt, [tok.encode("it is 42")], tok) is None
    assert arithmetic_reward(prompt, tok.encode("42"), tok) == 1.0
    assert 0 < arithmetic_reward(prompt, tok.encode("4x"), tok) < 1


def test_rollflow_train_runs_the_arithmetic_tool_task_as_multi_turn_sessions(processes, tiny_model, tmp_path):
    engines = [processes.engine() for _ in range(2)]
    manager = processes.manager(engines=[{"url": e.url} for e in engines])
    output = tmp_path / "run"
    config = base_config(
        manager,
        tiny_model,
        output,
        n_samples=2,
        prompts_per_step=2,
        micro_batch_groups=1,
        max_new_tokens=8,
        prompts="rollflow.runtime.trainer.tasks:arithmetic_prompts",
        reward="rollflow.runtime.trainer.tasks:arithmetic_reward",
        environment="rollflow.runtime.trainer.tasks:calculator",
        max_turns=3,
    )
    train(config, tmp_path)
    steps = rows(output)
    assert [int(r["step"]) for r in steps] == [1, 2]
    # every episode trained; `tokens` counts the model's own tokens only: at most 3 turns of 8
    assert all(int(r["samples"]) == 4 and 0 < int(r["tokens"]) <= 4 * 3 * 8 for r in steps)
    assert engine_versions(manager) == [2, 2]
    # the turns after the first found their context in the engine's prefix cache
    hit_rates = [http("GET", e.url + "/v1/loads")[1]["loads"][0]["cache_hit_rate"] for e in engines]
    assert max(hit_rates) > 0, hit_rates
