"""Containers inside Slurm jobs through the plugin: container_runtime = "pyxis" on the dev
cluster, whose srun loads the pyxis test double (tests/cluster/spank). The test sees the
image's marker file and what the allocation's install step (container_install_command, run
once with --container-writable) put into the named container; a second run in the same
persistent allocation imports nothing; a run with another image sets it up in the SAME
allocation (no release, no new salloc)."""

from __future__ import annotations

import json
import os
import re
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
    (suite / "trtllm-slurm.toml").write_text(
        '[clusters.devcluster]\ncontainer_runtime = "pyxis"\n'
        "container_install_command = 'mkdir -p /opt && pwd > /opt/installed-by-setup'\n")
    (suite / "test_in_image.py").write_text(
        "import os, pytest\n\n@pytest.mark.skip_less_device(1)\n"
        "def test_in_image():\n"
        "    assert os.environ.get('SLURM_JOB_ID')\n"
        f"    assert os.path.exists({trtllm_image.marker_path!r})\n"
        "    # the allocation's install step ran in the repo, in THIS named container\n"
        f"    assert open('/opt/installed-by-setup').read() == {str(suite) + chr(10)!r}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRTLLM_SLURM_")}
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "--trtllm-remote",
            "-k", "in_image"]
    state_file = suite / "work_dirs" / ".slurm_alloc.json"
    try:
        for attempt, image in ((1, pyxis["image"]), (2, pyxis["image"]), (3, pyxis["alias"])):
            proc = subprocess.run([*argv, f"--trtllm-container-image={image}"], cwd=suite,
                                  capture_output=True, text=True, timeout=300, env=env,
                                  check=False)
            out = proc.stdout + proc.stderr
            assert proc.returncode == 0, out
            assert "PASSED test_in_image.py::test_in_image" in out
            assert "--container-image=" in out and "--container-name=" in out
            state = json.loads(state_file.read_text())
            if attempt == 1:
                job_id = state["job_id"]
                first = imports(pyxis, job_id)
                assert len(first) == 1, first  # one node, one import (by the setup step)
                assert [c["installed"] for c in state["containers"]] == [True]
            assert state["job_id"] == job_id, f"run {attempt} used another allocation"
            if attempt == 2:
                assert imports(pyxis, job_id) == first, "the second run imported the image again"
        # run 3, a changed image: one new import, under a new name, in the same allocation
        new = [line for line in imports(pyxis, job_id) if line not in first]
        names = {re.search(r" name=(\S+)", line).group(1) for line in first + new}
        assert len(new) == 1 and len(names) == 2, new
        assert [c["image"] for c in state["containers"]] == [pyxis["image"], pyxis["alias"]]
    finally:
        if state_file.exists():
            sh(["scancel", json.loads(state_file.read_text())["job_id"]], check=False)

