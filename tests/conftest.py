"""Shared fixtures of the test suite. Keep this file small: put fixture code in helper modules."""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # tests/ helpers importable in any import mode

from containers_fixture import docker_engine, podman_engine, trtllm_image  # noqa: E402,F401  (local docker/podman + test image; see tests/containers_fixture.py)
from devcluster import _cancel_jobs_left_in_tmp_path, devcluster, wait_for_job  # noqa: E402,F401  (the REAL dev Slurm cluster; see tests/devcluster.py)

# suites the tests run in pytest subprocesses (some have test_*.py files and conftests with
# options of their own): never part of this session's collection
collect_ignore = ["data"]


def pytest_collection_modifyitems(items: list) -> None:
    """Tests marked ``last`` run after every other test of the session (in their collected
    order): each checks the end of something a fixture started long before (a Slurm time
    limit), so the rest of the suite runs meanwhile instead of waiting for it."""
    last = [item for item in items if item.get_closest_marker("last")]
    if last:
        items[:] = [item for item in items if not item.get_closest_marker("last")] + last
