"""This machine's Slurm discovery (sinfo, scontrol: 0.2 s on the dev cluster) is cached for
five minutes; a dispatching run whose cache has gone stale (any run more than five minutes
after the last) made it again at planning, after the suite's import, on its critical path.
The early start now makes it in a thread beside the import, and planning reads the cache it
wrote. Against the REAL dev cluster's Slurm, which this machine's tools answer for."""

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
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_ADDOPTS")}
    proc = subprocess.run(  # no cache yet: the first run of this checkout, as a stale one
        [sys.executable, "-m", "pytest", "-p", "recorder", "-p", "no:cacheprovider", "-q",
         "--trtllm-remote", "--trtllm-dispatch=all", "--trtllm-scenario=local_direct",
         "test_x.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**env, "PYTHONPATH": str(tmp_path), "RECORD": str(record),
             "IMPORTED": str(imported)})
    assert record.exists() and imported.exists(), proc.stdout + proc.stderr
    calls = json.loads(record.read_text())
    began = json.loads(imported.read_text())["begin"]
    # once, in the early start's thread, while the suite imported; planning read its cache
    assert [c["thread"] for c in calls] == ["trtllm-slurm-discovery"], calls
    assert calls[0]["at"] < began + 1, (calls, began)
    cache = json.loads((tmp_path / "work_dirs" / ".cache" / "slurm_env.json").read_text())
    assert cache["env"]["partitions"], cache  # what planning routed with
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout + proc.stderr
