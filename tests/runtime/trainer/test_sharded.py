"""Which checkpoints a run may resume: FSDP shards only under fsdp, a whole model only without it."""

from __future__ import annotations

import pytest

from rollflow.errors import UserError
from rollflow.runtime.trainer.learner import _check_checkpoint_kind
from rollflow.runtime.trainer.sharded import SHARDS_DIR, is_sharded


def test_a_sharded_checkpoint_resumes_only_under_fsdp_and_a_whole_one_only_without(tmp_path):
    whole, sharded = tmp_path / "step_1", tmp_path / "step_2"
    whole.mkdir()
    (sharded / SHARDS_DIR).mkdir(parents=True)
    assert (is_sharded(whole), is_sharded(sharded)) == (False, True)
    _check_checkpoint_kind(whole, sharded=False)
    _check_checkpoint_kind(sharded, sharded=True)
    with pytest.raises(
        UserError, match=r"holds a whole model .* resume it that way, or start over with --resume never"
    ):
        _check_checkpoint_kind(whole, sharded=True)
    with pytest.raises(UserError, match=r"holds FSDP shards .* under torchrun with parallelism: fsdp"):
        _check_checkpoint_kind(sharded, sharded=False)
