"""Containers inside Slurm jobs through the plugin: container_runtime = "pyxis" on the dev
cluster, whose srun loads the pyxis test double (tests/cluster/spank). The test sees the
image's marker file; a second run in the same persistent allocation imports nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from devcluster import run as sh
from test_pyxis_double import imports, pyxis  # noqa: F401  (module fixture)

EXAMPLES = Path(__file__).resolve().parent.parent / "conftest_examples"


def test_gpu_test_runs_in_the_image_and_reuses_the_container(
    pyxis, trtllm_image, tmp_path: Path  # noqa: F811
) -> None:
    suite = tmp_path / "examples"
    shutil.copytree(EXAMPLES, suite, ignore=shutil.ignore_patterns("work_dirs", "__pycache__"))
    (suite / "trtllm-slurm.toml").write_text('[clusters.devcluster]\ncontainer_runtime = "pyxis"\n')
    (suite / "test_in_image.py").write_text(
        "import os, pytest\n\n@pytest.mark.skip_less_device(1)\n"
        "def test_in_image():\n"
        "    assert os.environ.get('SLURM_JOB_ID')\n"
        f"    assert os.path.exists({trtllm_image.marker_path!r})\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRTLLM_SLURM_")}
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "--trtllm-remote",
            f"--trtllm-container-image={pyxis['image']}", "-k", "in_image"]
    state_file = suite / "work_dirs" / ".slurm_alloc.json"
    try:
        for attempt in (1, 2):
            proc = subprocess.run(argv, cwd=suite, capture_output=True, text=True, timeout=300,
                                  env=env, check=False)
            out = proc.stdout + proc.stderr
            assert proc.returncode == 0, out
            assert "PASSED test_in_image.py::test_in_image" in out
            assert "--container-image=" in out and "--container-name=" in out
            job_id = json.loads(state_file.read_text())["job_id"]
            if attempt == 1:
                first = imports(pyxis, job_id)
                assert len(first) == 1, first  # one node used, one import
        assert imports(pyxis, job_id) == first, "the second run imported the image again"
    finally:
        if state_file.exists():
            sh(["scancel", json.loads(state_file.read_text())["job_id"]], check=False)

