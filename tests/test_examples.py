"""README's main command: conftest_examples through the plugin on local_direct."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "conftest_examples"


def test_examples_dispatched_to_local_direct(tmp_path: Path) -> None:
    suite = tmp_path / "examples"
    shutil.copytree(EXAMPLES, suite, ignore=shutil.ignore_patterns("work_dirs", "__pycache__"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRTLLM_SLURM_")}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "--trtllm-remote",
         "--trtllm-dispatch=all", "--trtllm-scenario=local_direct"],
        cwd=suite, capture_output=True, text=True, timeout=300, env=env, check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "PASSED test_cpu.py::test_json_round_trip" in out
    assert "6 passed, 15 skipped" in out
    # the suite's own fixture skips GPU tests where they run: here, with no GPUs
    assert "SKIPPED [3] test_single_gpu.py:10: needs 1 devices, found 0" in out
    assert "scenario: local_direct" in out
    specs = list((suite / "work_dirs").glob("*/job_spec.json"))
    assert specs, "nothing was dispatched"
