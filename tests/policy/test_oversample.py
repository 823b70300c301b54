"""The over-sampling policy of `partial_rollout: auto`: more extra groups for heavier tails, none for uniform."""

import math
import random

import pytest

from rollflow.policy.oversample import (
    LengthSnapshot,
    Oversampler,
    OversampleSettings,
    choose_extra_groups,
    quantile,
)

BATCH = 16


def _lognormal_lengths(sigma: float, count: int = 4 * BATCH, seed: int = 0) -> tuple[int, ...]:
    rng = random.Random(seed)
    return tuple(max(1, round(256 * math.exp(rng.gauss(0.0, sigma)))) for _ in range(count))


def _extra(lengths: tuple[int, ...], **settings) -> int:
    return choose_extra_groups(LengthSnapshot(lengths, BATCH), OversampleSettings(**settings)).num_extra


def test_uniform_lengths_need_no_extra_groups():
    assert _extra((512,) * 64) == 0
    assert _extra(_lognormal_lengths(0.0)) == 0


def test_heavier_tails_get_more_extra_groups_and_never_more_than_the_batch():
    extras = [_extra(_lognormal_lengths(sigma)) for sigma in (0.1, 0.5, 1.0, 2.0)]
    assert extras[0] == 0
    assert extras == sorted(extras) and extras[-1] > extras[1] > 0
    assert all(extra <= BATCH for extra in extras)


def test_the_chosen_n_is_the_smallest_that_brings_the_batch_end_near_the_median():
    lengths = _lognormal_lengths(1.0)
    extra = _extra(lengths)
    ordered = sorted(lengths)
    target = 1.25 * quantile(ordered, 0.5)
    assert quantile(ordered, BATCH / (BATCH + extra + 1)) <= target
    assert quantile(ordered, BATCH / (BATCH + extra)) > target  # one fewer would not do
    assert _extra(lengths, slack=1.0) < extra  # a looser bound needs fewer groups


def test_the_cap_bounds_the_choice():
    assert _extra(_lognormal_lengths(2.0), max_extra=2) == 2


def test_no_lengths_seen_yet_gives_none_and_a_fixed_n_is_kept():
    assert Oversampler("auto", BATCH).plan().num_extra == 0
    fixed = Oversampler(5, BATCH)
    fixed.observe(_lognormal_lengths(2.0))
    assert fixed.plan().num_extra == 5


def test_the_oversampler_reads_the_last_window_of_groups():
    sampler = Oversampler("auto", BATCH, OversampleSettings(window_steps=2))
    sampler.observe(_lognormal_lengths(2.0, count=2 * BATCH))  # a heavy tail, then uniform lengths
    assert sampler.plan().num_extra > 0
    sampler.observe((300,) * (2 * BATCH))
    assert sampler.snapshot().group_lengths == (300,) * (2 * BATCH)
    assert sampler.plan().num_extra == 0


@pytest.mark.parametrize(
    ("settings", "message"),
    [({"window_steps": 0}, "window_steps"), ({"slack": -0.1}, "slack"), ({"max_extra": -1}, "max_extra")],
)
def test_bad_settings_name_the_setting(settings, message):
    with pytest.raises(ValueError, match=message):
        OversampleSettings(**settings)
