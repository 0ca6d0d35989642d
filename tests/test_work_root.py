"""A run leaves the user's repository clean: work_dirs/ ignores itself when the plugin makes it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pytest_trtllm_slurm.execution.work_root import ensure_work_root

DISPATCH = ["--trtllm-remote", "--trtllm-dispatch=all", "--trtllm-scenario=local_direct"]


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=True).stdout


def test_a_dispatched_run_leaves_git_status_clean(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "test_one.py").write_text("def test_ok():\n    assert True\n")
    _git(repo, "init", "-q")
    _git(repo, "-c", "user.email=t@example.invalid", "-c", "user.name=t", "add", ".")
    _git(repo, "-c", "user.email=t@example.invalid", "-c", "user.name=t", "commit", "-qm", "x")
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *DISPATCH],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout
    assert (repo / "work_dirs").is_dir(), "the run wrote no work dir: the test checks nothing"
    assert _git(repo, "status", "--porcelain", "--untracked-files=all") == ""
    assert (repo / "work_dirs" / ".gitignore").read_text().splitlines()[-1] == "*"


def test_an_existing_work_root_is_left_as_the_user_has_it(tmp_path: Path) -> None:
    root = tmp_path / "work_dirs"
    root.mkdir()
    (root / "keep.txt").write_text("mine")
    assert ensure_work_root(root) == root
    assert sorted(p.name for p in root.iterdir()) == ["keep.txt"]


def test_a_new_nested_work_root_gets_the_gitignore(tmp_path: Path) -> None:
    root = ensure_work_root(tmp_path / "a" / "b" / "work")
    assert (root / ".gitignore").read_text().endswith("*\n")
    assert not list(root.glob("*.tmp"))
