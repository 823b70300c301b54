"""A long-lived server keeps the memory it freed (`long_lived.keep_freed_heap`): bodies of a
stream's reads made and freed again and again cost no page faults once the heap has grown."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHURN = """
import sys
from rollflow.runtime.long_lived import keep_freed_heap

if sys.argv[1] == "keep":
    assert keep_freed_heap()


def faults():
    return int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[7])


def churn():
    held = [bytes(100_000) for _ in range(200)]  # 20 MB of bodies, then freed
    del held


churn()
before = faults()
for _ in range(5):
    churn()
print(faults() - before)
"""


def _page_faults(mode: str) -> int:
    answer = subprocess.run([sys.executable, "-c", CHURN, mode], capture_output=True, text=True, check=True)
    return int(answer.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and /proc")
def test_memory_freed_at_the_top_of_the_heap_is_kept_for_the_next_bodies():
    kept, given_back = _page_faults("keep"), _page_faults("default")
    assert kept * 4 < given_back, (kept, given_back)
