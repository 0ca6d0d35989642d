"""probe.py: device-type names, nvidia-smi parsing, and the real probes on this machine.

The probes run real commands through LocalShell: the machine's own tools, the dev
cluster's fake nvidia-smi (tests/cluster/up, key ``fake_bin``), and tiny scripts on a
temporary PATH for the absent / hung / daemon-down cases.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from pytest_trtllm_slurm.execution.probe import (
    normalize_device_type,
    parse_nvidia_smi,
    probe_local_env,
)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("NVIDIA H200", "H200"),
        ("NVIDIA GB200", "GB200"),
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA B200", "B200"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA H100 PCIe", "H100"),
        ("NVIDIA H100 NVL", "H100"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("NVIDIA B300 SXM6 AC", "B300"),
        ("NVIDIA GB300", "GB300"),
        ("Tesla V100-SXM2-16GB", "V100"),
        ("NVIDIA A10G", "A10G"),
        ("NVIDIA L4", "L4"),
        ("Tesla T4", "T4"),
        ("NVIDIA GeForce RTX 4090", "RTX4090"),
        ("NVIDIA RTX 6000 Ada Generation", "RTX6000"),
        ("h200", "H200"),  # a Slurm gres type
        ("gb200", "GB200"),
        ("H200", "H200"),  # idempotent
        ("  NVIDIA   H200  ", "H200"),
        ("", None),
        (None, None),
    ],
)
def test_normalize_device_type(name: str | None, expected: str | None) -> None:
    assert normalize_device_type(name) == expected
    if expected:
        assert normalize_device_type(expected) == expected


def test_parse_nvidia_smi() -> None:
    out = "NVIDIA H200, 143771 MiB\nNVIDIA H200, 143771 MiB\n\n"
    assert parse_nvidia_smi(out) == (["NVIDIA H200", "NVIDIA H200"], [143771, 143771])
    a100 = "NVIDIA A100-SXM4-80GB"
    assert parse_nvidia_smi(f"{a100}, 81920\n") == ([a100], [81920])
    assert parse_nvidia_smi("") == ([], [])


# --------------------------------------------------------------------------- real probes


def _script(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def test_probe_this_machine() -> None:
    """Without nvidia-smi: 0 GPUs and a note why; with it (a GPU machine): its GPUs."""
    env = probe_local_env()
    assert env.arch in ("x86_64", "aarch64")
    if shutil.which("nvidia-smi") is None:
        assert (env.gpu_count, env.device_type) == (0, None)
        assert any(n.startswith("gpu:") and "not found" in n for n in env.notes), env.notes
    else:
        assert env.gpu_count > 0, env.notes
        assert env.device_type == normalize_device_type(env.gpu_names[0])


def test_probe_with_no_tools_at_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: nothing is found
    env = probe_local_env()
    assert (env.gpu_count, env.container_engine, env.slurm_available) == (0, None, False)
    text = "\n".join(env.notes)
    assert "nvidia-smi not found" in text
    assert "docker not found" in text and "podman not found" in text
    assert "scontrol not found" in text


def test_probe_times_out_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _script(tmp_path, "nvidia-smi", "exec sleep 30")
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    env = probe_local_env(timeout=0.5)
    assert env.gpu_count == 0
    assert any("nvidia-smi" in n and "timed out" in n for n in env.notes), env.notes


def test_container_engine_needs_an_answering_daemon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _script(tmp_path, "docker", 'echo "Cannot connect to the Docker daemon" >&2; exit 1')
    _script(tmp_path, "podman", '[ "$1" = info ] && echo "{}" && exit 0; exit 3')
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    env = probe_local_env(timeout=5)
    assert env.container_engine == "podman"
    assert any("docker does not answer" in n and "Cannot connect" in n for n in env.notes)

    _script(tmp_path, "docker", '[ "$1" = info ] && echo "{}" && exit 0; exit 3')
    assert probe_local_env(timeout=5).container_engine == "docker"


# --------------------------------------------------------------------------- dev cluster


@pytest.fixture
def fake_gpus(devcluster: dict, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The dev cluster's fake nvidia-smi first on PATH (it lists CUDA_VISIBLE_DEVICES)."""
    fake_bin = Path(devcluster["fake_bin"])
    assert (fake_bin / "nvidia-smi").is_file(), f"no fake nvidia-smi in {fake_bin}"
    monkeypatch.setenv("PATH", f"{fake_bin}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    return fake_bin


def test_probe_finds_fake_gb200s(fake_gpus: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    monkeypatch.setenv("FAKE_GPU_NAME", "NVIDIA GB200")
    env = probe_local_env()
    assert env.gpu_count == 4
    assert env.device_type == "GB200"
    assert env.gpu_names == ["NVIDIA GB200"] * 4
    assert env.gpu_memory_mib == 189471
    assert not any(n.startswith("gpu:") for n in env.notes), env.notes


def test_probe_finds_fake_h200s_by_node(
    devcluster: dict, fake_gpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch = next(p for p in devcluster["partitions"] if p["name"] == "batch")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    monkeypatch.delenv("FAKE_GPU_NAME", raising=False)
    monkeypatch.setenv("SLURMD_NODENAME", batch["nodes"][0])
    env = probe_local_env()
    assert (env.gpu_count, env.device_type) == (2, "H200")
    assert env.gpu_memory_mib == batch["gpu_memory_mib"]


def test_probe_fake_without_visible_devices(
    fake_gpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    env = probe_local_env()
    assert env.gpu_count == 0
    assert any("No devices were found" in n for n in env.notes), env.notes


def test_probe_sees_the_local_slurm(devcluster: dict) -> None:
    env = probe_local_env()
    assert env.slurm_available is True
    assert env.cluster_name == devcluster["cluster_name"] == "devcluster"
