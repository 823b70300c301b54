"""A one-node Ray cluster for the tests, every port on 127.0.0.1, its node labelled preemptible.

Started with `ray start --head --block` so that ending that one process (which we started)
stops the cluster; `ray stop` would stop every Ray cluster of this user on the machine.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rollflow.runtime.launch.process import wait_or_kill
from tests.runtime.processes import descendants, free_port

# Ray reads these when it is imported: with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 it keeps 127.0.0.1
# instead of swapping in the machine's address, in the head and in this test process (the driver).
RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
os.environ.update(RAY_ENV)
PREEMPTIBLE_LABEL = "rollflow.io/preemptible"


class RayHead:
    def __init__(self) -> None:
        self.temp_dir = tempfile.mkdtemp(prefix="rf-ray-", dir="/tmp")  # short: Ray's socket paths
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        ray_cli = str(Path(sys.executable).with_name("ray"))
        argv = [ray_cli, "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={self.port}"]
        argv += [
            "--include-dashboard=false",
            "--disable-usage-stats",
            "--num-cpus=4",  # the 3 actors a test asks for, and no more idle workers prestarted on 2 cores
            f"--temp-dir={self.temp_dir}",
        ]
        # the agent's HTTP port is the one Ray fixes by default (52365): two heads would share it
        argv += [f"--ray-client-server-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}"]
        argv += [f"--labels={PREEMPTIBLE_LABEL}=true"]
        argv += ['--resources={"engine_slot": 4}']
        self.log_path = Path(self.temp_dir) / "head.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(argv, env={**os.environ, **RAY_ENV}, stdout=self._log, stderr=self._log)
        deadline = time.monotonic() + 120
        while b"Ray runtime started" not in self.log_path.read_bytes():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"ray head did not start:\n{self.log_path.read_text()[-3000:]}")
            time.sleep(0.2)

    def descendants(self) -> set[int]:
        """Every process started under the head (its daemons, workers and what actors started)."""
        return descendants(self.proc.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            wait_or_kill(self.proc, 60)
        self._log.close()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def listening_addresses(pids: set[int]) -> list[str]:
    """Local addresses of the TCP listeners owned by `pids` (from `ss -ltnpH`)."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    addresses = []
    for line in out.splitlines():
        owners = {int(pid) for pid in re.findall(r"pid=(\d+)", line)}
        if owners & pids:
            addresses.append(line.split()[3])
    return addresses
