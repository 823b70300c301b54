"""The PPO critic starts from the policy's checkpoint without a load report of unexpected keys."""

import subprocess
import sys

from tests.runtime.processes import ENV, REPO


def test_critic_loads_the_causal_lm_body_without_an_unexpected_keys_report(tiny_model):
    # a subprocess, so transformers' once-per-process warnings and its stderr handler are fresh
    script = (
        "import sys, torch\n"
        "from rollflow.runtime.trainer.models import Critic, load_policy\n"
        "critic, policy = Critic(sys.argv[1]), load_policy(sys.argv[1])\n"
        "body = policy.base_model.state_dict()\n"
        "assert all(torch.equal(v, body[k]) for k, v in critic.body.state_dict().items())\n"
        "print(sorted(critic.state_dict())[-2:])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tiny_model)], cwd=REPO, env=ENV, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "UNEXPECTED" not in done.stderr and "LOAD REPORT" not in done.stderr, done.stderr[-3000:]
    assert "['value_head.bias', 'value_head.weight']" in done.stdout
