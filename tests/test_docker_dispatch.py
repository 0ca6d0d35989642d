"""local_docker through the plugin: conftest_examples dispatched into a container of the
locally built test image (the engine and image come from tests/containers_fixture.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "conftest_examples"


def _engine_env(engine) -> dict[str, str]:
    """The test dockerd listens on its own socket: tell the plugin's docker CLI where."""
    env = dict(engine.env)
    if "-H" in engine.cli:
        env["DOCKER_HOST"] = engine.cli[engine.cli.index("-H") + 1]
    return env


def test_examples_dispatched_into_docker(docker_engine, trtllm_image, tmp_path: Path) -> None:
    suite = tmp_path / "examples"
    shutil.copytree(EXAMPLES, suite, ignore=shutil.ignore_patterns("work_dirs", "__pycache__"))
    (suite / "test_where.py").write_text(
        "import os\n\ndef test_runs_in_the_image():\n"
        f"    assert os.path.exists({trtllm_image.marker_path!r})\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRTLLM_SLURM_")}
    env.update(_engine_env(docker_engine))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "--trtllm-remote",
         "--trtllm-dispatch=all", "--trtllm-scenario=local_docker",
         "--trtllm-container-engine=docker", f"--trtllm-container-image={trtllm_image.name}",
         "-k", "cpu or where or no_device"],
        cwd=suite, capture_output=True, text=True, timeout=300, env=env, check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "PASSED test_where.py::test_runs_in_the_image" in out
    assert "PASSED test_cpu.py::test_json_round_trip" in out
    assert "scenario: local_docker" in out
    left = docker_engine.run("ps", "-aq", "--filter", "label=trtllm-slurm", check=False).stdout
    assert not left.strip(), f"containers left behind: {left}"


def test_missing_image_is_a_clear_error(docker_engine, tmp_path: Path) -> None:
    suite = tmp_path / "examples"
    shutil.copytree(EXAMPLES, suite, ignore=shutil.ignore_patterns("work_dirs", "__pycache__"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRTLLM_SLURM_")}
    env.update(_engine_env(docker_engine))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--trtllm-remote",
         "--trtllm-dispatch=all", "--trtllm-scenario=local_docker",
         "--trtllm-container-engine=docker", "--trtllm-container-image=nosuch/image:1",
         "-k", "cpu"],
        cwd=suite, capture_output=True, text=True, timeout=120, env=env, check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 4, out
    assert "nosuch/image:1" in out and "Traceback" not in out
