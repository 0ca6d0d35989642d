"""A cluster's table in the clusters file mounts its ``mounts`` and ``models_root`` into every
container batch run there, and sets ``LLM_MODELS_ROOT`` (TensorRT-LLM's tests find their
models through it; a marker's env wins), for pyxis (the dev cluster's test double,
tests/cluster/spank) and podman-wrapped Slurm tasks, one-shot and persistent; a batch
without an image gets ``LLM_MODELS_ROOT`` too (its nodes see the host path itself). Each
mount reaches the container flags of a batch once, though the persistent allocation's pyxis
set-up mounts them as well. On the REAL dev cluster, batch partition."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_container_runtime_dispatch import SHIM
from test_pyxis_double import pyxis  # noqa: F401  (module fixture)

from pytest_trtllm_slurm.execution.render.containers import job_mounts
from pytest_trtllm_slurm.execution.slurm.alloc_containers import setup_mounts
from pytest_trtllm_slurm.planning.jobspec import JobSpec
from pytest_trtllm_slurm.planning.models import Scenario
from pytest_trtllm_slurm.planning.settings import ClusterConfig, mount_target, with_mounts

INI = "[pytest]\nmarkers =\n    trtllm_slurm: resources (pytest-trtllm-slurm)\n"

TESTS = '''import os
from pathlib import Path

import pytest

DATA = {data!r}
MODELS = {models!r}
EXTRA = {extra!r}
IN_IMAGE = {in_image!r}


def in_image():
    return os.path.exists("/etc/trtllm-test-image")


@pytest.mark.trtllm_slurm(devices=1)
def test_the_clusters_mounts_and_models_root():
    assert in_image() == IN_IMAGE
    assert os.environ.get("LLM_MODELS_ROOT") == MODELS
    assert Path(MODELS, "model.txt").read_text() == "weights\\n"
    assert Path(DATA, "hello.txt").read_text() == "from the cluster mount\\n"
    if IN_IMAGE:
        try:
            open(Path(MODELS, "written-in-the-container"), "w")
        except OSError as exc:
            assert exc.errno == 30  # EROFS: the models root is mounted read-only
        else:
            raise AssertionError("the models root is writable in the container")


@pytest.mark.trtllm_slurm(devices=1, env={{"LLM_MODELS_ROOT": "/from/the/marker"}},
                          mounts=[EXTRA + ":/extra:ro"])
def test_a_markers_env_wins_and_its_mounts_are_added():
    assert in_image() == IN_IMAGE
    assert os.environ.get("LLM_MODELS_ROOT") == "/from/the/marker"
    assert Path(DATA, "hello.txt").read_text() == "from the cluster mount\\n"
    if IN_IMAGE:
        assert Path("/extra/x.txt").read_text() == "from the marker mount\\n"
'''


def _host_dirs(tmp_path: Path) -> dict[str, str]:
    """Host folders outside the suite (the container sees them only if they are mounted)."""
    dirs = {"data": tmp_path / "cluster-data", "models": tmp_path / "models",
            "extra": tmp_path / "marker-data"}
    for d in dirs.values():
        d.mkdir()
    (dirs["data"] / "hello.txt").write_text("from the cluster mount\n")
    (dirs["models"] / "model.txt").write_text("weights\n")
    (dirs["extra"] / "x.txt").write_text("from the marker mount\n")
    return {k: str(v) for k, v in dirs.items()}


def _launch_texts(suite: Path) -> list[str]:
    """The batches' launch files (one-shot job.sbatch, a step's step.sh)."""
    return [p.read_text() for p in (suite / "work_dirs").rglob("*")
            if p.name in ("job.sbatch", "step.sh")]


def _mount_entries(text: str, runtime: str) -> list[str]:
    """The container mounts a launch file gives: pyxis --container-mounts entries, or the
    values of the engine's -v flags."""
    words = shlex.split(text, comments=False, posix=True) if runtime != "pyxis" else []
    if runtime == "pyxis":
        return [m for flags in re.findall(r"--container-mounts=(\S+)", text)
                for m in flags.strip("'\"").split(",")]
    return [words[i + 1] for i, w in enumerate(words[:-1]) if w == "-v"]


@pytest.mark.devcluster
@pytest.mark.parametrize("runtime,mode", [
    ("pyxis", "--trtllm-one-shot"),
    ("pyxis", "--trtllm-warm-workers"),  # persistent, the default
    ("podman", "--trtllm-one-shot"),
    ("podman", "--trtllm-warm-workers"),
    ("none", "--trtllm-one-shot"),  # no image: LLM_MODELS_ROOT on the host
    ("none", "--trtllm-warm-workers"),  # ... and in the warm workers' forks
])
def test_the_clusters_mounts_and_models_root_reach_the_batch(
        request, devcluster: dict[str, Any], trtllm_image, runtime: str, mode: str,
        tmp_path: Path) -> None:
    dirs = _host_dirs(tmp_path)
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "pytest.ini").write_text(INI)
    (suite / "test_mounts.py").write_text(TESTS.format(in_image=runtime != "none", **dirs))
    name = devcluster["cluster_name"]
    (suite / "trtllm-slurm.toml").write_text(
        f'[clusters.{name}]\ncontainer_runtime = "{runtime}"\n'
        # the repo as well: it is mounted anyway, and must not be twice (docker refuses)
        f"mounts = [{dirs['data'] + ':' + dirs['data']!r}, {f'{suite}:{suite}'!r}]\n"
        f"models_root = {dirs['models']!r}\n")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TRTLLM_SLURM_") and k not in ("PYTEST_ADDOPTS", "LLM_MODELS_ROOT")}
    env["HOME"] = str(suite)  # no clusters file of the machine's user
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "--trtllm-remote",
            "--trtllm-scenario=local_slurm", "--slurm-partition=batch", mode]
    if runtime == "pyxis":
        image = request.getfixturevalue("pyxis")["image"]
        argv.append(f"--trtllm-container-image={image}")
    elif runtime == "podman":
        engine = request.getfixturevalue("podman_engine")
        shims = tmp_path / "bin"
        shims.mkdir()
        shim = shims / "podman"  # drops the GPU flags the test engine cannot honour
        shim.write_text(SHIM.format(engine="podman", log=tmp_path / "gpu-flags.log",
                                    real=shlex.join(engine.cli)))
        shim.chmod(0o755)
        env.update(engine.env)
        env["PATH"] = f"{shims}:{env['PATH']}"
        argv.append(f"--trtllm-container-image={trtllm_image.name}")
    try:
        proc = subprocess.run(argv, cwd=suite, env=env, capture_output=True, text=True,
                              timeout=600, check=False)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out
        assert "2 passed" in out, out
        if runtime == "none":
            return
        texts = _launch_texts(suite)
        assert texts, f"no launch file under {suite / 'work_dirs'}"
        for text in texts:  # each mount once in each batch's container flags
            mounts = _mount_entries(text, runtime)
            assert mounts.count(f"{dirs['data']}:{dirs['data']}") == 1, mounts
            assert mounts.count(f"{dirs['models']}:{dirs['models']}:ro") == 1, mounts
            assert [mount_target(m) for m in mounts].count(str(suite)) == 1, mounts
    finally:
        if mode != "--trtllm-one-shot":
            subprocess.run([sys.executable, "-m", "pytest_trtllm_slurm.cli.main", "alloc",
                            "release", "--rootdir", str(suite)], cwd=suite, env=env,
                           capture_output=True, text=True, timeout=120, check=False)


# --------------------------------------------------------------------------- pure

def test_a_batchs_own_mounts_and_env_win_and_each_container_path_is_mounted_once() -> None:
    cluster = ClusterConfig(mounts=["/lustre/data:/data", "/repo:/repo"], models_root="/models",
                            env={"HF_HOME": "/h"})
    assert cluster.container_mounts == ["/lustre/data:/data", "/repo:/repo",
                                        "/models:/models:ro"]
    assert cluster.job_env == {"LLM_MODELS_ROOT": "/models", "HF_HOME": "/h"}
    # the table's env may set it itself; without a models root nothing is added
    assert ClusterConfig(models_root="/models", env={"LLM_MODELS_ROOT": "/x"}).job_env == {
        "LLM_MODELS_ROOT": "/x"}
    assert ClusterConfig().job_env == {} and ClusterConfig().container_mounts == []

    # a marker's mount at /data wins over the cluster's
    mounts = with_mounts(["/mine:/data:ro"], cluster.container_mounts)
    assert mounts == ("/mine:/data:ro", "/repo:/repo", "/models:/models:ro")
    spec = JobSpec(scenario=Scenario.LOCAL_SLURM, name="b", job_name="a.b", rootdir="/repo",
                   invocation_dir="/repo/tests", work_dir="/repo/work_dirs/b",
                   log_path="/repo/work_dirs/b/job.log", reports_path="/repo/work_dirs/b/r",
                   container_image="img:1", mounts=list(mounts))
    rendered = job_mounts(spec, models_root="/models")  # the repo and models root once
    assert rendered[:3] == ["/repo:/repo", "/mine:/data:ro", "/models:/models:ro"], rendered
    assert len(rendered) == 4 and rendered[3].endswith(":/opt/trtllm-slurm/pytest_trtllm_slurm:ro")
    targets = [mount_target(m) for m in rendered]
    assert len(targets) == len(set(targets)), rendered
    # the persistent allocation's pyxis set-up mounts the repo once too
    assert setup_mounts("/repo", cluster.mounts, cluster.models_root) == [
        "/repo:/repo", "/lustre/data:/data", "/models:/models:ro"]
