"""Environment check of this machine (GPUs, container engine, Slurm, CPU arch) for routing;
each probe is bounded and leaves a note saying why it came back empty."""

from __future__ import annotations

import platform
import re

from pytest_trtllm_slurm.execution.slurm.parse import parse_scontrol_config
from pytest_trtllm_slurm.planning.models import LocalEnv
from pytest_trtllm_slurm.planning.resolve import normalize_device_type
from pytest_trtllm_slurm.transport.shell import LocalShell, Shell

__all__ = ["normalize_device_type", "parse_nvidia_smi", "probe_local_env"]
_MACHINES = {"arm64": "aarch64", "amd64": "x86_64", "x64": "x86_64"}  # onto one name each


def parse_nvidia_smi(text: str) -> tuple[list[str], list[int]]:
    """``name, memory.total`` CSV lines (``NVIDIA H200, 143771 MiB``) -> (names, MiB list)."""
    names: list[str] = []
    memories: list[int] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        name, _, mem = line.rpartition(",") if "," in line else (line, "", "")
        names.append(name.strip())
        m = re.search(r"(\d+)", mem)
        if m:
            memories.append(int(m.group(1)))
    return names, memories


def probe_gpus(shell: Shell, timeout: float, env: LocalEnv) -> None:
    """Fill GPU count, names, normalized type and smallest memory from nvidia-smi."""
    res = shell.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                    timeout=timeout)
    if res.returncode == 127 and not res.timed_out:
        env.notes.append("gpu: nvidia-smi not found on PATH; assuming no GPUs")
        return
    if not res.ok:
        env.notes.append(f"gpu: {res.describe()}; assuming no GPUs")
        return
    names, memories = parse_nvidia_smi(res.stdout)
    if not names:
        env.notes.append("gpu: nvidia-smi listed no GPUs")
        return
    types = {normalize_device_type(n) for n in names}
    env.gpu_count = len(names)
    env.gpu_names = names
    env.device_type = normalize_device_type(names[0])
    env.gpu_memory_mib = min(memories) if memories else None
    if len(types) > 1:
        env.notes.append(f"gpu: mixed GPU types {sorted(t or '?' for t in types)}; using the first")


def probe_container_engine(shell: Shell, timeout: float, env: LocalEnv) -> None:
    """First engine whose daemon answers ``info`` (docker, then podman); a CLI is not enough."""
    for engine in ("docker", "podman"):
        res = shell.run([engine, "info", "--format", "{{json .}}"], timeout=timeout)
        if res.ok:
            env.container_engine = engine
            return
        if res.returncode == 127 and not res.timed_out:
            env.notes.append(f"container: {engine} not found on PATH")
        else:
            env.notes.append(f"container: {engine} does not answer: {res.describe()}")


def probe_slurm(shell: Shell, timeout: float, env: LocalEnv) -> None:
    """Slurm is available when its controller answers ``scontrol show config`` (ClusterName)."""
    res = shell.run(["scontrol", "show", "config"], timeout=timeout)
    if res.returncode == 127 and not res.timed_out:
        env.notes.append("slurm: scontrol not found on PATH (no Slurm client tools)")
        return
    if not res.ok:
        env.notes.append("slurm: client tools present but the controller does not answer: "
                         + res.describe())
        return
    env.slurm_available = True
    env.cluster_name = parse_scontrol_config(res.stdout).get("ClusterName") or None
    if env.cluster_name is None:
        env.notes.append("slurm: scontrol show config has no ClusterName")


def probe_local_env(shell: Shell | None = None, timeout: float = 10, *,
                    engines: bool = True, slurm: bool = True) -> LocalEnv:
    """What routing needs to know about this machine; ``engines=False``: no container engines,
    ``slurm=False``: no Slurm (the run cannot use it: ``Settings.uses_local_slurm``)."""
    shell = shell or LocalShell()
    machine = platform.machine().lower()
    env = LocalEnv(arch=_MACHINES.get(machine, machine or "x86_64"))
    probe_gpus(shell, timeout, env)
    if engines:
        probe_container_engine(shell, timeout, env)
    else:
        env.notes.append("container: not probed (no container image asked for)")
    if slurm:
        probe_slurm(shell, timeout, env)
    else:
        env.notes.append("slurm: not probed (every test runs on this machine: "
                         "--trtllm-scenario)")
    return env
