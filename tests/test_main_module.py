"""``python -m pytest_trtllm_slurm`` is the ``trtllm-slurm`` command line (issue 19, part 7)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=120, env=env,
                          check=False, stdin=subprocess.DEVNULL)


def test_help_lists_the_commands() -> None:
    proc = run(sys.executable, "-m", "pytest_trtllm_slurm", "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: trtllm-slurm ")
    for command in ("env", "alloc", "run"):
        assert f"\n    {command} " in proc.stdout, proc.stdout


def test_usage_error_exits_2_naming_the_command() -> None:
    proc = run(sys.executable, "-m", "pytest_trtllm_slurm", "nosuch")
    assert proc.returncode == 2
    assert "trtllm-slurm: error: argument COMMAND: invalid choice: 'nosuch'" in proc.stderr


def test_same_entry_point_as_the_console_script() -> None:
    """pyproject's ``trtllm-slurm`` script names the function ``__main__`` runs (an
    installed script may be older than the checkout: it is not what is checked)."""
    import importlib

    import tomllib

    import pytest_trtllm_slurm.__main__ as module

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    target, _, name = scripts["trtllm-slurm"].partition(":")
    assert getattr(importlib.import_module(target), name) is module.main


@pytest.mark.devcluster
def test_env_through_the_module(devcluster: dict) -> None:
    """A real command: what this machine and the dev cluster's Slurm offer."""
    proc = run(sys.executable, "-m", "pytest_trtllm_slurm", "env")
    assert proc.returncode == 0, proc.stderr
    assert "Slurm:            yes, cluster devcluster" in proc.stdout
    assert "batch" in proc.stdout and "gb200" in proc.stdout
