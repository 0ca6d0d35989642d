"""Coverage measured where the tests ran, in every kind of target, reads as in a plain run.

The same small project (4 of mymod's 6 statements run: 67%) runs plainly and dispatched:
local_direct, local_docker, local Slurm with steps (warm workers are in the compatibility
table, tests/test_plugin_compat.py) and remote Slurm over SSH (one-shot sbatch jobs), whose
checkout lives under another path. pytest-cov's JSON report must list the same files with the same executed
lines, and ``--cov-fail-under`` must judge the same total.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from devcluster import run as sh
from test_remote_dispatch import remote_setup, run_pytest  # noqa: F401  (fixture)

DATA = Path(__file__).parent / "data" / "compat"
REPO = Path(__file__).resolve().parent.parent
FILES = ("mymod.py", "check_cov.py", "check_benchmark.py", "pytest.ini")
LOCAL_DIRECT = ["--trtllm-remote", "--trtllm-dispatch=all", "--trtllm-scenario=local_direct"]
LOCAL_SLURM = ["--trtllm-remote", "--trtllm-dispatch=all", "--trtllm-scenario=local_slurm",
               "--slurm-partition=batch"]


def _project(dest: Path) -> Path:
    dest.mkdir(parents=True)
    for name in FILES:
        shutil.copy(DATA / name, dest / name)
    return dest


def _pytest(project: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRTLLM_SLURM_")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "check_cov.py", *args],
        cwd=project, capture_output=True, text=True, timeout=900, env=env, check=False)


def _measured(report: Path, root: Path) -> dict[str, object]:
    """pytest-cov's JSON report: executed and missing lines per file (relative to root),
    and the total."""
    data = json.loads(report.read_text())
    files = {os.path.relpath(os.path.join(root, name), root) if not os.path.isabs(name)
             else os.path.relpath(name, root):
             (info["executed_lines"], info["missing_lines"])
             for name, info in data["files"].items()}
    return {"files": files, "total": data["totals"]["percent_covered_display"]}


def _coverage_run(project: Path, tag: str, *args: str) -> tuple[subprocess.CompletedProcess,
                                                                 dict[str, object]]:
    report = project / f"{tag}.cov.json"
    proc = _pytest(project, "--cov=mymod", f"--cov-report=json:{report}",
                   "--cov-fail-under=60", *args)
    assert report.exists(), proc.stdout + proc.stderr
    return proc, _measured(report, project)


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory):
    project = _project(tmp_path_factory.mktemp("artefacts") / "plain")
    proc, measured = _coverage_run(project, "plain")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert measured["total"] == "67", measured
    return measured


def test_local_direct_coverage_matches_and_stays_out_of_the_rootdir(plain, tmp_path: Path
                                                                    ) -> None:
    project = _project(tmp_path / "direct")
    proc, measured = _coverage_run(project, "direct", *LOCAL_DIRECT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert measured == plain
    assert "Required test coverage of 60% reached. Total coverage: 66.67%" in proc.stdout
    # the worker's own data files live in the batch's work dir, never beside the user's
    leftovers = sorted(p.name for p in project.glob(".coverage*"))
    assert leftovers in ([], [".coverage"]), leftovers
    assert list(project.glob("work_dirs/*/coverage.db"))


def test_a_threshold_above_the_total_fails_dispatched_as_plainly(tmp_path: Path) -> None:
    results = []
    for tag, extra in (("plain", []), ("direct", LOCAL_DIRECT)):
        project = _project(tmp_path / tag)
        proc = _pytest(project, "--cov=mymod", "--cov-fail-under=70", *extra)
        results.append((proc.returncode, "FAIL Required test coverage of 70% not reached. "
                        "Total coverage: 66.67%" in proc.stdout))
    assert results == [(1, True), (1, True)]


def test_a_source_path_relative_to_a_subdirectory_measures_the_same(tmp_path: Path) -> None:
    """``--cov=../src`` typed in a subdirectory: the worker (which runs elsewhere) measures
    the same directory."""
    results = []
    for tag, extra in (("plain", []), ("direct", LOCAL_DIRECT)):
        project = tmp_path / tag
        (project / "src").mkdir(parents=True)
        shutil.copy(DATA / "mymod.py", project / "src" / "mymod.py")
        (project / "pytest.ini").write_text("[pytest]\npythonpath = src\n")
        (project / "tests").mkdir()
        shutil.copy(DATA / "check_cov.py", project / "tests" / "test_cov.py")
        report = project / "cov.json"
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRTLLM_SLURM_")}
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--cov=../src",
             f"--cov-report=json:{report}", *extra],
            cwd=project / "tests", capture_output=True, text=True, timeout=300, env=env,
            check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        results.append(_measured(report, project))
    assert results[1] == results[0]
    assert results[0]["total"] == "67", results[0]


def test_a_batch_that_returns_no_coverage_is_named_once(tmp_path: Path) -> None:
    """A target where coverage is off (here: the batch's env disables it, as a missing
    pytest-cov would) must not silently lower the total: the run says so, once."""
    project = _project(tmp_path / "nocov")
    test = project / "check_cov.py"
    test.write_text(test.read_text().replace(
        "def test_covered", "import pytest\n\n\n"
        "@pytest.mark.trtllm_slurm(env={'PYTEST_ADDOPTS': '--no-cov'})\ndef test_covered"))
    proc = _pytest(project, "--cov=mymod", *LOCAL_DIRECT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if "returned no coverage data" in line]
    assert len(lines) == 1, proc.stdout
    assert "1 dispatched batch(es)" in lines[0] and "pytest-cov" in lines[0]
    assert str(project / "work_dirs") in lines[0]


def _site_mounts(*dists: str) -> list[str]:
    """Read-only mounts that put these installed distributions (package and metadata) into
    a container under /opt/compat-site: the test image itself has only pytest."""
    import importlib.metadata as md

    mounts = []
    for name in dists:
        dist = md.distribution(name)
        info = Path(dist._path)  # type: ignore[attr-defined]  # its .dist-info directory
        top = (dist.read_text("top_level.txt") or name.replace("-", "_")).split()[0]
        for path in (info, info.parent / top):
            mounts.append(f"{path}:/opt/compat-site/{path.name}:ro")
    return mounts


def test_local_docker_coverage_matches(plain, docker_engine, trtllm_image, tmp_path: Path
                                       ) -> None:
    from test_docker_dispatch import _engine_env

    project = _project(tmp_path / "docker")
    test = project / "check_cov.py"
    mounts = _site_mounts("pytest-cov", "coverage")
    test.write_text(test.read_text().replace(
        "def test_covered():\n", "import os\nimport pytest\n\n\n"
        f"@pytest.mark.trtllm_slurm(mounts={mounts!r}, env={{'PYTHONPATH': '/opt/compat-site'}})\n"
        "def test_covered():\n"
        f"    assert os.path.exists({trtllm_image.marker_path!r}), 'not in the image'\n"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRTLLM_SLURM_")}
    env.update(_engine_env(docker_engine))
    report = project / "docker.cov.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "check_cov.py",
         "--trtllm-remote", "--trtllm-dispatch=all", "--trtllm-scenario=local_docker",
         "--trtllm-container-engine=docker", f"--trtllm-container-image={trtllm_image.name}",
         "--cov=mymod", f"--cov-report=json:{report}", "--cov-fail-under=60"],
        cwd=project, capture_output=True, text=True, timeout=300, env=env, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "returned no coverage data" not in out, out
    assert _measured(report, project) == plain, out


@pytest.fixture
def slurm_project(devcluster: dict, tmp_path: Path):
    """A project whose allocation (if its run makes one) is released right after the test:
    held until the module ends, it could keep the next test's job waiting behind it."""
    project = _project(tmp_path / "slurm")
    yield project
    state = project / "work_dirs" / ".slurm_alloc.json"
    if state.exists():  # never leave our allocation behind on the shared dev cluster
        sh(["scancel", json.loads(state.read_text())["job_id"]], check=False)


def test_local_slurm_steps_coverage_matches(plain, slurm_project: Path) -> None:
    """Batches as Slurm steps of the allocation (warm workers are in the compatibility
    table; a one-shot sbatch job is the remote test's)."""
    proc, measured = _coverage_run(slurm_project, "steps", *LOCAL_SLURM,
                                   "--trtllm-no-warm-workers")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # it ran as a Slurm job in partition batch (a quick step may end between two looks
    # that would have shown it RUNNING: any state it was seen in says so)
    assert re.search(r"job \d+\S* \[batch-[^]]+\] on batch: [A-Z]", proc.stdout), proc.stdout
    assert measured == plain, proc.stdout


def test_remote_slurm_coverage_is_mapped_to_the_local_checkout(plain, remote_setup  # noqa: F811
                                                               ) -> None:
    local, remote_root, _ = remote_setup
    for name in FILES[:2]:
        shutil.copy(DATA / name, local / name)
    # the cluster runs the plugin under test (an SSH job does not inherit our PYTHONPATH;
    # the machine's installed copy may be another checkout)
    test = local / "check_cov.py"
    test.write_text(test.read_text().replace(
        "def test_covered", "import pytest\n\n\n"
        f"@pytest.mark.trtllm_slurm(env={{'PYTHONPATH': {str(REPO)!r}}})\ndef test_covered"))
    report = local / "remote.cov.json"
    proc = run_pytest(local, "--slurm-cluster=devssh", "--trtllm-dispatch=all",
                      "--trtllm-one-shot", "check_cov.py", "-o", "python_files=check_*.py",
                      "--cov=mymod", f"--cov-report=json:{report}", "--cov-fail-under=60",
                      timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    # the batch really measured the cluster's checkout, then its paths were mapped here
    assert list((remote_root / "local" / "work_dirs").glob("*/coverage.db")), out
    assert _measured(report, local) == plain, out
