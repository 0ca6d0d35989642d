"""This machine's Slurm discovery (sinfo, scontrol: 0.2 s on the dev cluster) is cached for
five minutes; a dispatching run whose cache has gone stale (any run more than five minutes
after the last) made it again at planning, after the suite's import, on its critical path.
The early start now makes it in a thread beside the import, and planning reads the cache it
wrote, and uses the thread's probe of this machine (``scontrol show config``: 10 s when the
controller does not answer) instead of probing again. A run whose every test is forced to
run here probes no Slurm. Against the REAL dev cluster's Slurm, which this machine's tools
answer for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.devcluster

# records each Slurm discovery: which thread made it, and when relative to the suite's import
RECORDER = '''import json, os, threading, time
import pytest_trtllm_slurm.execution.slurm.client as client

_discover = client.SlurmClient.discover
calls = []


def discover(self, *args, **kwargs):
    calls.append({"thread": threading.current_thread().name, "at": time.time()})
    with open(os.environ["RECORD"], "w") as fh:
        json.dump(calls, fh)
    return _discover(self, *args, **kwargs)


client.SlurmClient.discover = discover

import pytest_trtllm_slurm.execution.probe as probe

_probe_slurm = probe.probe_slurm
probes = []


def probe_slurm(*args, **kwargs):
    probes.append(threading.current_thread().name)
    with open(os.environ["PROBES"], "w") as fh:
        json.dump(probes, fh)
    return _probe_slurm(*args, **kwargs)


probe.probe_slurm = probe_slurm
'''
CONFTEST = '''import json, os, time
with open(os.environ["IMPORTED"], "w") as fh:  # the suite's import: begins, lasts 1 s
    json.dump({"begin": time.time()}, fh)
time.sleep(1)
'''


def test_a_stale_discovery_is_made_beside_the_suites_import(
        devcluster: dict[str, Any], tmp_path: Path) -> None:
    (tmp_path / "recorder.py").write_text(RECORDER)
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_x.py").write_text(
        "def test_x():\n    pass\n")
    record, imported = tmp_path / "record.json", tmp_path / "imported.json"
    # no cache yet: the first run of this checkout, as a stale one; the scenario auto, so
    # routing reads this machine's Slurm
    proc = _run(tmp_path, "--trtllm-remote", "--trtllm-dispatch=all", "test_x.py")
    assert record.exists() and imported.exists(), proc.stdout + proc.stderr
    calls = json.loads(record.read_text())
    began = json.loads(imported.read_text())["begin"]
    # once, in the early start's thread, while the suite imported; planning read its cache
    assert [c["thread"] for c in calls] == ["trtllm-slurm-discovery"], calls
    assert calls[0]["at"] < began + 1, (calls, began)
    # this machine's probe too: once, in that thread; planning used what it found
    assert json.loads((tmp_path / "probes.json").read_text()) == ["trtllm-slurm-discovery"]
    cache = json.loads((tmp_path / "work_dirs" / ".cache" / "slurm_env.json").read_text())
    assert cache["env"]["partitions"], cache  # what planning routed with
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout + proc.stderr


def test_a_run_forced_to_this_machine_asks_no_slurm(
        devcluster: dict[str, Any], tmp_path: Path) -> None:
    _one_test_suite(tmp_path)
    proc = _run(tmp_path, "--trtllm-remote", "--trtllm-dispatch=all",
                "--trtllm-scenario=local_direct", "test_x.py")
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout + proc.stderr
    # neither probed (scontrol waits 10 s for a controller that does not answer) nor
    # discovered: nothing in this run could use it
    assert not (tmp_path / "probes.json").exists(), (tmp_path / "probes.json").read_text()
    assert not (tmp_path / "record.json").exists(), (tmp_path / "record.json").read_text()


def test_a_forced_run_naming_a_cluster_still_asks_it(
        devcluster: dict[str, Any], tmp_path: Path) -> None:
    """--slurm-cluster is checked against this machine's cluster: Slurm is probed then."""
    _one_test_suite(tmp_path)
    proc = _run(tmp_path, "--trtllm-remote", "--trtllm-dispatch=all",
                "--trtllm-scenario=local_direct", f"--slurm-cluster={devcluster['cluster_name']}",
                "test_x.py")
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout + proc.stderr
    assert json.loads((tmp_path / "probes.json").read_text()) == ["trtllm-slurm-discovery"]


def _one_test_suite(tmp_path: Path) -> None:
    (tmp_path / "recorder.py").write_text(RECORDER)
    (tmp_path / "conftest.py").write_text("")
    (tmp_path / "test_x.py").write_text("def test_x():\n    pass\n")


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_ADDOPTS")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "recorder", "-p", "no:cacheprovider", "-q",
         *args], cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**env, "PYTHONPATH": str(tmp_path), "RECORD": str(tmp_path / "record.json"),
             "PROBES": str(tmp_path / "probes.json"),
             "IMPORTED": str(tmp_path / "imported.json")})
