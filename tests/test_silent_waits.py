"""A scheduler that stops answering is said, not waited for in silence (issue 22 item 8).

The outage is real as far as the client can tell: the executor's scheduler commands run
with a ``SLURM_CONF`` whose controller port nobody listens on, so every squeue fails as it
does while slurmctld restarts. (The shared dev cluster's slurmctld is not stopped.)
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from test_slurm_executor import make_spec

from pytest_trtllm_slurm.execution.slurm.executor import SlurmExecutor, SlurmSettings
from pytest_trtllm_slurm.transport.shell import LocalShell


class UnreachableController(LocalShell):
    """The local machine, its Slurm commands pointed at a controller port that is closed."""

    def __init__(self, conf: Path) -> None:
        self.conf = conf

    def run(self, argv, **kw):  # type: ignore[no-untyped-def]
        kw["env"] = {**(kw.get("env") or {}), "SLURM_CONF": str(self.conf)}
        return super().run(argv, **kw)


def test_a_scheduler_outage_is_said_with_since_when(devcluster: dict, tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    text = Path("/etc/slurm/slurm.conf").read_text()
    text = re.sub(r"(?m)^SlurmctldPort=\d+", "SlurmctldPort=1", text)
    # a client tries to reach the controller once a second for MessageTimeout seconds (10 by
    # default) before it fails; 2 here: each squeue fails the same way, after ~1 s, not ~10 s
    text = re.sub(r"(?m)^MessageTimeout=.*\n", "", text) + "MessageTimeout=2\n"
    conf.write_text(text)
    said: list[str] = []
    executor = SlurmExecutor(LocalShell(), SlurmSettings(persistent=False, min_interval=0.1, max_interval=0.2, fail_grace=600), warn=said.append)
    handle = executor.submit(make_spec(tmp_path, "sleeps", "time.sleep(120)\n"))
    try:
        executor.jobs.shell = UnreachableController(conf)
        end = time.monotonic() + 120
        while not any("The scheduler has not answered since" in s for s in said):
            assert time.monotonic() < end, said
            executor.poll([handle])
            time.sleep(0.2)
        line = next(s for s in said if "The scheduler has not answered since" in s)
        assert re.search(r"since \d\d:\d\d:\d\d \(\d+ tries; last: .*squeue", line), line
        assert "still waiting for it" in line
    finally:
        executor.jobs.shell = LocalShell()
        executor.close()
