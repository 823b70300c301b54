"""Partial rollout: a full batch stops the other groups, which carry over with their tokens."""

import itertools

import pytest

from rollflow.policy import oversample
from rollflow.policy.resources import StaticScheduler
from rollflow.sim.build import build_groups
from rollflow.sim.rl.accounting import summarize_run
from rollflow.sim.rl.costs import StepCosts
from rollflow.sim.rl.partial import resume_order
from rollflow.sim.rl.runner import simulate_steps
from rollflow.sim.rl.step import StepSimulator
from tests.sim.rl.factories import DISAGGREGATED, rl_config

GROUP = 4  # samples_per_prompt of the small config


def _step(config, index, start, carried=(), sync_ends=()):
    simulator = StepSimulator(
        config,
        index,
        start,
        StepCosts.from_config(config),
        StaticScheduler(),
        groups=build_groups(config.rollout_sim_config()),
        sync_ends=sync_ends,
        carried=carried,
    )
    return simulator, simulator.run()


def test_a_full_batch_carries_the_other_groups_whole_with_the_tokens_they_made():
    config = rl_config("partial_rollout=4")
    first, result = _step(config, 0, 0.0)
    assert result.num_samples == 64 and result.carried_samples == 16  # 16 prompts trained, 4 carried
    groups = {}
    for sample in first.carried_out:
        groups.setdefault(sample.group, []).append(sample)
    assert len(groups) == 4 and all(len(g) == GROUP for g in groups.values())
    stopped = [s for s in first.carried_out if not s.request.completed]
    assert stopped and any(sum(s.versions.values()) > 0 for s in stopped)  # generated before the stop
    for sample in stopped:
        made = sum(sample.versions.values())
        assert set(sample.versions) <= {0}  # step 0's tokens: weights version 0
        # resumed from prompt + generated tokens, the rest still to generate
        assert sample.request.num_prefill == sample.request.prompt_tokens + made
        assert sample.request.num_prefill + sample.request.num_decode == (
            sample.request.prompt_tokens + sample.request.output_tokens
        )

    handed_on = result.tokens_carried
    second, result = _step(config, 1, result.end, first.carried_out, sync_ends=(result.end,))
    assert (
        handed_on == sum(sum(v.values()) for v in second.partial.earlier_versions.values()) > 0
    )  # the next step gets them
    carried_in = second.progress.requests[:16]
    assert [r.id for r in carried_in] == list(range(16))  # carried groups come first
    trained = {r.id for ids in result.minibatches for r in (second.progress.requests[i] for i in ids)}
    assert len(trained) == 64
    # every trained token has its version; the carried ones keep step 0's (1 version stale)
    expected = sum(second.progress.requests[i].output_tokens for i in trained)
    assert sum(result.tokens_by_staleness.values()) == expected
    stale = sum(
        sum(second.partial.earlier_versions[i].values())
        for i in trained
        if i in second.partial.earlier_versions
    )
    assert result.tokens_by_staleness.get(1, 0) >= stale > 0


@pytest.mark.parametrize("placement", [[], [*DISAGGREGATED, "placement.pipelining=true"]])
def test_partial_rollout_cuts_the_long_tail_of_every_step(placement):
    whole = rl_config("steps=4", *placement)
    whole_run = summarize_run(whole, simulate_steps(whole), 0.0)
    partial = rl_config("steps=4", "partial_rollout=4", *placement)
    steps = simulate_steps(partial)
    partial_run = summarize_run(partial, steps, 0.0)
    assert all(s.num_samples == 64 for s in steps) and partial_run["carried_samples"] == 4 * 16
    assert partial_run["throughput_tokens_per_s"] > whole_run["throughput_tokens_per_s"]
    assert partial_run["max_sample_staleness"] >= 1 and whole_run["max_sample_staleness"] == 0
    assert partial_run["reprefill_tokens"] > 0  # resumed samples re-prefill prompt + generated tokens


def test_partial_rollout_composes_with_off_policy():
    config = rl_config("steps=4", "partial_rollout=4", "off_policy=1", *DISAGGREGATED)
    steps = simulate_steps(config)
    assert all(b.start < a.end for a, b in itertools.pairwise(steps))  # rollouts overlap training
    assert summarize_run(config, steps, 0.0)["max_sample_staleness"] >= 2


def _short_lived_spot(tmp_path) -> str:
    """Instance 0 lives throughout; instance 1 is preempted every 10 s (no notice), back at once."""
    path = tmp_path / "spot.csv"
    lives = [f"1,{t},{t + 9}" for t in range(0, 400, 10)]
    path.write_text("\n".join(["instance,start_s,end_s", "0,0,100000", *lives]) + "\n")
    return f"spot.availability={{kind: trace, file: {path}, notice_s: 0}}"


@pytest.mark.parametrize("extra", [[], ["off_policy=1"], ["spot.on_preemption=restart"]])
def test_partial_rollout_composes_with_preemptible_instances(tmp_path, extra):
    spot = [
        "spot.instances=2",
        "spot.startup_s=0",
        _short_lived_spot(tmp_path),
        "spot.offload.initial_budget_s=1000",
    ]
    whole = rl_config("steps=4", *spot, *extra)
    whole_run = summarize_run(whole, simulate_steps(whole), 0.0)
    config = rl_config("steps=4", "partial_rollout=4", *spot, *extra)
    steps = simulate_steps(config)  # a step raises if a sample was neither trained nor carried
    run = summarize_run(config, steps, 0.0)
    assert all(s.num_samples == 64 for s in steps) and run["carried_samples"] == 4 * 16
    assert run["preemptions"] > 0 and run["preempted_sequences"] > 0  # preempted mid-rollout
    assert run["throughput_tokens_per_s"] > whole_run["throughput_tokens_per_s"]
    assert run["max_sample_staleness"] >= 1


DYNAMIC = [*DISAGGREGATED, "placement.pipelining=true", "scheduling.kind=dynamic"]


@pytest.mark.parametrize(
    "extra",
    [[], ["scheduling.pre_process=true", "scheduling.wait_before_last_iter=true"], ["off_policy=1"]],
    ids=["dynamic", "pre-process-wait-last", "off-policy"],
)
def test_partial_rollout_composes_with_dynamic_scheduling(monkeypatch, extra):
    """Instances released mid-rollout hand their samples on, the batch-full stop carries the rest:
    every step trains exactly its batch in whole groups and carries the other groups whole."""
    stepped = []
    run = StepSimulator.run

    def recording(self):
        stepped.append(self)
        return run(self)

    monkeypatch.setattr(StepSimulator, "run", recording)
    config = rl_config("steps=4", "partial_rollout=4", *DYNAMIC, *extra)
    steps = simulate_steps(config)  # a step raises if a sample was neither trained nor carried
    summary = summarize_run(config, steps, 0.0)
    assert summary["carried_samples"] == 4 * 4 * GROUP and summary["max_sample_staleness"] >= 1
    assert summary["migrated_sequences"] > 0  # the scheduler moved samples off released instances
    for step, result in zip(stepped, steps, strict=True):
        trained = sorted(i for batch in result.minibatches for i in batch)
        groups = {i // GROUP for i in trained}
        assert len(trained) == 64 and trained == [
            i for g in sorted(groups) for i in range(g * GROUP, (g + 1) * GROUP)
        ]
        carried = {c.group for c in step.carried_out}
        assert len(carried) == 4 and not carried & groups
        assert all(sum(1 for c in step.carried_out if c.group == g) == GROUP for g in carried)


@pytest.mark.parametrize("extra", [[], ["off_policy=1", *DISAGGREGATED]], ids=["on-policy", "off-policy"])
def test_partial_rollout_auto_chooses_each_steps_n_from_the_groups_trained_before(monkeypatch, extra):
    """`partial_rollout: auto`: the runner asks the shared policy (the one `rollflow train` asks) for
    each step's N, with the lengths of the groups trained in the steps before (off-policy, as live, all
    but the last: its groups are trained after the next rollout is submitted)."""
    stepped, asked = [], []
    run, choose = StepSimulator.run, oversample.choose_extra_groups

    def recording_run(self):
        stepped.append(self)
        return run(self)

    def recording_choice(snapshot, settings):
        plan = choose(snapshot, settings)
        asked.append((snapshot, plan.num_extra))
        return plan

    monkeypatch.setattr(StepSimulator, "run", recording_run)
    monkeypatch.setattr(oversample, "choose_extra_groups", recording_choice)
    config = rl_config("steps=5", "partial_rollout=auto", *extra)
    steps = simulate_steps(config)
    assert [s.extra_groups for s in steps] == [n for _, n in asked]
    assert steps[0].extra_groups == 0 and all(s.extra_groups > 0 for s in steps[2:])  # a long tail
    lag = 1 if extra else 0
    for index, (snapshot, _) in enumerate(asked):
        seen = [
            max(step.progress.requests[i].output_tokens for i in range(g * GROUP, (g + 1) * GROUP))
            for step in stepped[: max(0, index - lag)]
            for g in step.progress.trained_groups
        ]
        assert snapshot.group_lengths == tuple(seen) and snapshot.num_prompts == 16
    for step, result in zip(stepped, steps, strict=True):  # each step ran its N: carried N groups
        assert result.num_samples == 64 and result.carried_samples == result.extra_groups * GROUP
        assert len(step.progress.requests) >= (16 + result.extra_groups) * GROUP


def test_partial_rollout_auto_carries_nothing_for_uniform_lengths():
    config = rl_config("steps=4", "partial_rollout=auto", "workload.output_sigma=0")
    run = summarize_run(config, simulate_steps(config), 0.0)
    assert [s["extra_groups"] for s in run["steps"]] == [0] * 4 and run["carried_samples"] == 0


def test_carried_samples_reach_the_instances_first_in_no_group_order():
    """As live, where each carried sample's resume is a request of its own, all sent at once."""
    config = rl_config("partial_rollout=4")
    first, _ = _step(config, 0, 0.0)
    submitted = []
    second = StepSimulator(
        config,
        1,
        0.0,
        StepCosts.from_config(config),
        StaticScheduler(),
        groups=build_groups(config.rollout_sim_config()),
        carried=first.carried_out,
    )
    carried = [i for i in range(16) if not second.progress.requests[i].completed]
    again = resume_order([second.progress.requests[i] for i in carried], 16, config.seed, 1)
    submit = second.pool.submit
    second.pool.submit = lambda request: (submitted.append(request.id), submit(request))
    second.run()
    assert sorted(submitted[: len(carried)]) == carried and submitted[: len(carried)] != carried
    assert submitted[len(carried) :] == sorted(submitted[len(carried) :])  # then the new groups, in order
    assert [r.id for r in again] == submitted[: len(carried)]  # the run's seed and the step's index
