"""--trtllm-release-allocation after a run on a remote cluster releases that cluster's
allocation (over the run's SSH connection), not only the local one (issue 17 item 8)."""

from __future__ import annotations

import re
import time

from devcluster import squeue_state
from test_remote_dispatch import remote_setup, run_pytest  # noqa: F401  (the remote repo + sshd)


def test_release_allocation_releases_the_remote_clusters_allocation(remote_setup) -> None:  # noqa: F811
    local, remote_root, _ = remote_setup
    proc = run_pytest(local, "--slurm-cluster=devssh", "--trtllm-dispatch=all",
                      "--trtllm-release-allocation", "-k", "one_gpu")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    found = re.search(r"Allocation (\d+) released\.", out)
    assert found, out
    assert "No allocation to release" not in out
    state = remote_root / ".trtllm-state" / "local" / ".slurm_alloc.json"
    assert not state.exists()
    end = time.monotonic() + 30
    while (squeue_state(found.group(1)) or ("GONE",))[0] == "RUNNING":
        assert time.monotonic() < end, squeue_state(found.group(1))
        time.sleep(0.5)
