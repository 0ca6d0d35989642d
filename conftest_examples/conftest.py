"""Autouse skips like TensorRT-LLM's integration conftest: count devices, skip when short.

These run where the test runs. pytest-trtllm-slurm reads the same markers before
the run and sends the test to hardware where the skip does not trigger.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess

import pytest


@functools.lru_cache(maxsize=1)
def _nvidia_smi(*args: str) -> list[str]:
    """Lines of ``nvidia-smi <args>``; none when the tool is missing or fails."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        proc = subprocess.run(
            ["nvidia-smi", *args], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return proc.stdout.splitlines() if proc.returncode == 0 else []


def get_device_count() -> int:
    return sum(1 for line in _nvidia_smi("-L") if line.startswith("GPU "))


def get_device_memory_mib() -> int:
    query = ("--query-gpu=memory.total", "--format=csv,noheader,nounits")
    values = [v.strip() for v in _nvidia_smi(*query)]
    return min((int(v) for v in values if v.isdigit()), default=0)


def get_device_names() -> list[str]:
    return [line.strip() for line in _nvidia_smi("--query-gpu=name", "--format=csv,noheader")]


def get_mpi_world_size() -> int:
    for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 1


@pytest.fixture(scope="session")
def device_count() -> int:
    return get_device_count()


@pytest.fixture(autouse=True)
def skip_by_device_count(request: pytest.FixtureRequest) -> None:
    mark = request.node.get_closest_marker("skip_less_device")
    if mark is not None and mark.args[0] > get_device_count():
        pytest.skip(f"needs {mark.args[0]} devices, found {get_device_count()}")


@pytest.fixture(autouse=True)
def skip_by_device_memory(request: pytest.FixtureRequest) -> None:
    mark = request.node.get_closest_marker("skip_less_device_memory")
    if mark is not None and mark.args[0] > get_device_memory_mib():
        pytest.skip(f"needs {mark.args[0]} MiB of device memory")


@pytest.fixture(autouse=True)
def skip_by_mpi_world_size(request: pytest.FixtureRequest) -> None:
    mark = request.node.get_closest_marker("skip_less_mpi_world_size")
    if mark is not None and mark.args[0] > get_mpi_world_size():
        pytest.skip(f"needs MPI world size {mark.args[0]}, found {get_mpi_world_size()}")


@pytest.fixture(autouse=True)
def skip_by_device_name(request: pytest.FixtureRequest) -> None:
    mark = request.node.get_closest_marker("skip_device_not_contain")
    if mark is None:
        return
    keywords = mark.args[0]
    if not any(k in name for name in get_device_names() for k in keywords):
        pytest.skip(f"needs a device whose name contains one of {keywords}")
