"""remote_slurm end to end through the plugin: the dev cluster's sshd as the login node,
a bare git repository as origin, code synced (a tracked change and an untracked test),
tests run on the cluster and replayed here; the local repository is left unchanged."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from devcluster import run as sh

EXAMPLES = Path(__file__).resolve().parent.parent / "conftest_examples"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=True).stdout


def snapshot(repo: Path) -> dict[str, str]:
    """What a user would notice if it changed: branch, HEAD, index, status, stash."""
    return {
        "head": git(repo, "rev-parse", "HEAD"),
        "branch": git(repo, "rev-parse", "--abbrev-ref", "HEAD"),
        "status": git(repo, "status", "--porcelain", "--untracked-files=all"),
        "index": (repo / ".git" / "index").read_bytes().hex(),
        "stash": git(repo, "stash", "list"),
        "branches": git(repo, "branch", "-a"),
    }


@pytest.fixture(scope="module")
def remote_setup(devcluster: dict, tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("remote")
    origin = base / "origin.git"
    subprocess.run(["git", "init", "-q", "--bare", str(origin)], check=True)
    local = base / "local"
    shutil.copytree(EXAMPLES, local, ignore=shutil.ignore_patterns("work_dirs", "__pycache__"))
    (local / ".gitignore").write_text("__pycache__/\n.pytest_cache/\nwork_dirs/\n")
    git(local, "init", "-q", "-b", "main")
    git(local, "-c", "user.name=t", "-c", "user.email=t@t", "add", "-A")
    git(local, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "base")
    git(local, "remote", "add", "origin", str(origin))
    git(local, "push", "-q", "origin", "main")
    # a tracked modification and a new untracked test: both must take effect remotely
    cpu = local / "test_cpu.py"
    cpu.write_text(cpu.read_text() + "\n\ndef test_tracked_change():\n    assert True\n")
    (local / "test_untracked_new.py").write_text(
        "import os, pytest\n\n@pytest.mark.skip_less_device(1)\n"
        "def test_untracked_on_cluster():\n"
        "    assert os.environ.get('SLURM_JOB_ID'), 'not inside a Slurm job'\n"
    )
    ssh = devcluster["ssh"]
    remote_root = base / "cluster_home"
    (local / "trtllm-slurm.toml").write_text(
        "[clusters.devssh]\n"
        f'ssh_host = "{ssh["host"]}"\nssh_port = {ssh["port_key"]}\nuser = "{ssh["user"]}"\n'
        f'identity_file = "{ssh["identity_file"]}"\nknown_hosts = "{ssh["known_hosts"]}"\n'
        f'mfa = false\nsync = "git"\nuser_root_dir = "{remote_root}"\n'
        f'python = "{sys.executable}"\npartition = "batch"\n'
    )
    before = snapshot(local)
    yield local, remote_root, before
    state_dir = local / "work_dirs" / ".remote-devssh" / "work_dirs" / ".slurm_alloc.json"
    if state_dir.exists():
        import json

        sh(["scancel", json.loads(state_dir.read_text())["job_id"]], check=False)


def test_examples_run_remotely_over_ssh(remote_setup) -> None:
    local, remote_root, before = remote_setup
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRTLLM_SLURM_")}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA",
         "--slurm-cluster=devssh", "--trtllm-dispatch=all", "--trtllm-one-shot",
         "-k", "untracked or tracked_change or one_gpu"],
        cwd=local, capture_output=True, text=True, timeout=300, env=env, check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for nodeid in ("test_untracked_new.py::test_untracked_on_cluster",
                   "test_cpu.py::test_tracked_change", "test_single_gpu.py::test_one_gpu[fp16]"):
        assert f"PASSED {nodeid}" in out, nodeid
    assert "scenario: remote_slurm" in out
    assert f"work dir: {remote_root}/local/work_dirs/" in out
    assert "re-run:   ssh -p" in out
    # the code really ran from the cluster's checkout, not from the local folder
    assert (remote_root / "local" / "test_untracked_new.py").exists()
    assert list((remote_root / "local" / "work_dirs").glob("*/reports.jsonl"))
    assert snapshot(local) == before, "the local repository changed"
