"""Which samples the trainer accepts, and how they become tensors."""

import pytest

from rollflow.config import ConfigError, validate_config
from rollflow.runtime.trainer.config import TrainConfig
from rollflow.runtime.trainer.rollouts import filter_stale, to_tensors


def sample(versions, prompt=(5, 6), output=(7, 8, 9), logprobs=(-0.1, -0.2, -0.3)):
    spans = [{"weight_version": v, "start": 0, "end": 1, "engine_id": 0, "attempt": 1} for v in versions]
    return {
        "prompt_ids": list(prompt),
        "output_ids": list(output),
        "output_logprobs": list(logprobs),
        "spans": spans,
    }


def test_staleness_bound_rejects_samples_with_any_token_too_old_and_counts_them():
    groups = [
        [sample([3]), sample([2, 3]), sample([1, 3])],  # last: its first tokens are 2 versions behind
        [sample([1]), sample([1])],  # whole group too old: the group disappears
        [sample([None])],  # version unknown: kept
    ]
    kept, dropped = filter_stale(groups, trainer_version=3, max_staleness=1)
    assert dropped == 3
    assert [len(g) for g in kept] == [2, 1]


def test_on_policy_bound_zero_accepts_only_the_current_version():
    kept, dropped = filter_stale([[sample([4]), sample([3, 4])]], trainer_version=4, max_staleness=0)
    assert dropped == 1 and len(kept[0]) == 1


def test_tensors_align_recorded_logprobs_with_output_tokens_and_pad():
    groups = [[sample([0]), sample([0], output=(7,), logprobs=(-0.5,))]]
    rollout = to_tensors(groups, pad_id=0)
    assert rollout.input_ids.tolist() == [[5, 6, 7, 8, 9], [5, 6, 7, 0, 0]]
    # position t predicts token t+1: outputs are predicted from positions 1..3 (row 0) and 1 (row 1)
    assert rollout.mask.tolist() == [[0, 1, 1, 1], [0, 1, 0, 0]]
    assert rollout.old_logprobs[0].tolist() == pytest.approx([0, -0.1, -0.2, -0.3])
    assert rollout.last_index.tolist() == [3, 1]
    assert rollout.group_ids.tolist() == [0, 0]


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="algorithm"):
        validate_config(TrainConfig, {"model": "m", "algorithm": "dpo"})
    with pytest.raises(ConfigError, match="n_samples"):
        validate_config(TrainConfig, {"model": "m", "n_samples": 1})
    with pytest.raises(ConfigError, match="did you mean 'kl_coef'"):
        validate_config(TrainConfig, {"model": "m", "kl_coeff": 0.1})
