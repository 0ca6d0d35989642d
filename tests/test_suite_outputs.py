"""A TensorRT-LLM-shaped suite's own output files and time limits, plain against dispatched.

The suite (tests/data/trtllm_outputs) writes under ``--output-dir``, and its conftest keeps
a periodic JUnit file (``--periodic-junit-xmlpath``) and a CSV (``--csv``) from
``pytest_runtest_logreport``, as TensorRT-LLM's does. Dispatched to the dev cluster's
Slurm (locally, and over its sshd as a remote cluster), the output folder must read as
after a plain run: the same results.xml (all tests, not the last batch's), the same CSV,
the same files the tests wrote. Two batches writing one file are reported, and a test
that pytest-timeout's thread method kills is reported as that test's timeout while the
rest of its batch runs again. Both clusters are real (the dev cluster, its sshd); nothing
is faked but the GPUs.
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

DATA = Path(__file__).parent / "data" / "trtllm_outputs"
# TensorRT-LLM's stage options (jenkins/scripts/slurm_run.sh), relative to the suite
STAGE = ["--output-dir=out", "--csv=out/report.csv", "--periodic-junit",
         "--periodic-junit-xmlpath", "out/results.xml", "--periodic-batch-size=1",
         "--periodic-save-unfinished-test", "-o", "junit_logging=out-err"]
LOCAL_SLURM = ["--trtllm-remote", "--trtllm-dispatch=all", "--trtllm-scenario=local_slurm",
               "--slurm-partition=batch"]
_TIME = re.compile(r' time="[0-9.]+"')


def _suite(dest: Path) -> Path:
    shutil.copytree(DATA, dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def _pytest(project: Path, *args: str, env: dict[str, str] | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items()
            if not k.startswith("TRTLLM_SLURM_") and k != "PYTEST_ADDOPTS"}
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA",
                           *args], cwd=project, capture_output=True, text=True,
                          timeout=timeout, env=full, check=False)


def _tree(folder: Path) -> dict[str, str]:
    """Every file below ``folder`` (relative path -> text); a JUnit file's testcases in
    name order with their timings blanked (batches end in any order)."""
    tree = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            text = path.read_text(errors="replace")
            if path.suffix == ".xml":
                lines = text.splitlines()
                cases = sorted(_TIME.sub(' time="?"', line) for line in lines
                               if "<testcase" in line)
                text = "\n".join([*[line for line in lines if "<testcase" not in line], *cases])
            tree[str(path.relative_to(folder))] = text
    return tree


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    project = _suite(tmp_path_factory.mktemp("plain") / "suite")
    proc = _pytest(project, "check_outputs.py", *STAGE)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # one test fails on purpose
    tree = _tree(project / "out")
    assert sorted(tree) == ["one_a/log.txt", "one_b/log.txt", "one_fails/log.txt",
                            "report.csv", "results.xml", "two/nested/log.txt"], tree
    assert tree["results.xml"].count("<testcase") == 5
    return tree


def test_local_slurm_output_dir_reads_as_a_plain_run(plain, devcluster: dict, tmp_path: Path
                                                     ) -> None:
    """Two batches (1 and 2 GPUs) in the dev cluster's allocation: results.xml and the CSV
    hold every test (the controller's writer, not a batch's), the tests' files are there."""
    project = _suite(tmp_path / "suite")
    proc = _pytest(project, "check_outputs.py", *STAGE, *LOCAL_SLURM)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    batches = int(re.search(r"(\d+) batch\(es\), 5 dispatched test\(s\)", out).group(1))
    assert batches >= 2, out
    assert _tree(project / "out") == plain, out
    assert "conflict" not in out, out
    # each batch wrote a place of its own, under its work dir
    assert len(list(project.glob("work_dirs/*/outputs/**/out/results.xml"))) == batches
    # again, in the allocation the first run left (its warm workers are alive): sessions
    # started early with the run's options would write (truncate) the user's files
    shutil.rmtree(project / "out")
    again = _pytest(project, "check_outputs.py", *STAGE, *LOCAL_SLURM)
    assert again.returncode == 1, again.stdout + again.stderr
    assert _tree(project / "out") == plain, again.stdout + again.stderr


def test_two_batches_writing_one_file_are_reported_and_both_kept(devcluster: dict,
                                                                 tmp_path: Path) -> None:
    project = _suite(tmp_path / "suite")
    proc = _pytest(project, "check_outputs.py", *STAGE, *LOCAL_SLURM, "--trtllm-one-shot",
                   env={"OUTPUT_CONFLICT": "1"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    lines = [line for line in out.splitlines() if "output file conflict" in line]
    assert len(lines) == 1, out
    shared = project / "out" / "shared.txt"
    assert f"{shared} was written by batch " in lines[0], lines[0]
    copies = sorted(p.read_text() for p in (project / "out").glob("shared.txt*"))
    assert copies == ["written by one_a\n", "written by two_a\n"], out


def test_thread_timeout_is_the_tests_and_the_rest_runs_again(devcluster: dict, tmp_path: Path
                                                             ) -> None:
    """CI's ``--timeout=3600 --timeout-method=thread``: the test that runs past its own
    ``timeout(3)`` ends the worker with ``os._exit``; it is reported as a timeout of that
    test, its neighbours pass (not CRASHED), and the batch's walltime counts the limits."""
    project = _suite(tmp_path / "suite")
    # (--order-dependencies: pytest-order keeps the tests in one batch, in their order)
    proc = _pytest(project, "check_timeouts.py", *STAGE, *LOCAL_SLURM, "--trtllm-one-shot",
                   "--order-dependencies", "--timeout=3600", "--timeout-method=thread",
                   env={"TIMEOUT_MODE": "1"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    summary = sorted(line[:60] for line in out.splitlines()
                     if line.startswith(("PASSED ", "FAILED ")))
    assert summary == sorted([
        "PASSED check_timeouts.py::test_long_limit_one",
        "PASSED check_timeouts.py::test_long_limit_two",
        "PASSED check_timeouts.py::test_t_before",
        "PASSED check_timeouts.py::test_t_after_one",
        "PASSED check_timeouts.py::test_t_after_two",
        "FAILED check_timeouts.py::test_t_sleeper - Failed: Timeout ("]), out
    # one batch, whose tests after the sleeper ran again in a retry
    assert "2 batch(es), 6 dispatched test(s)" in out, out
    assert "batch-0gpu-1n-0-retry1" in out, out
    assert "CRASHED" not in out, out
    assert "time.sleep(60)" in out, out  # where the test was when its time ran out
    results = (project / "out" / "results.xml").read_text()
    assert results.count("<testcase") == 6 and results.count("<failure") == 1, results
    assert 'name="test_t_sleeper"' in results and "Timeout" in results, results
    # the first batch's walltime: 2 x 2400 s (markers) + 4 x 3600 s (--timeout, 3 s for the
    # sleeper) + 300 s start-up, as Slurm got it
    specs = [json.loads(p.read_text()) for p in project.glob("work_dirs/*/job_spec.json")]
    first = next(s for s in specs if "retry" not in s["name"])
    assert first["time_limit"] == "04:25:03", first["time_limit"]
    assert first["monitor_timeout_seconds"] == 15903
    job = re.search(r"job (\d+) \[" + re.escape(first["name"]) + r"\]", out)
    assert job, out
    limit = sh(["sacct", "-n", "-X", "-j", job.group(1), "-o", "Timelimit"]).stdout.strip()
    assert limit == "04:25:00" or limit == "04:26:00", limit  # Slurm rounds up to minutes


# -- over SSH: the dev sshd as a remote cluster's login node -----------------------------
def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                   capture_output=True, text=True, check=True)


@pytest.fixture
def remote_suite(devcluster: dict, tmp_path: Path):
    """The suite in a git checkout whose clusters file names the dev sshd (git sync)."""
    origin = tmp_path / "origin.git"
    subprocess.run(["git", "init", "-q", "--bare", str(origin)], check=True)
    local = _suite(tmp_path / "local")
    (local / ".gitignore").write_text("__pycache__/\nwork_dirs/\nout/\n")
    _git(local, "init", "-q", "-b", "main")
    _git(local, "add", "-A")
    _git(local, "commit", "-q", "-m", "base")
    _git(local, "remote", "add", "origin", str(origin))
    _git(local, "push", "-q", "origin", "main")
    ssh = devcluster["ssh"]
    home = tmp_path / "cluster_home"
    (local / "trtllm-slurm.toml").write_text(
        "[clusters.devssh]\n"
        f'ssh_host = "{ssh["host"]}"\nssh_port = {ssh["port_key"]}\nuser = "{ssh["user"]}"\n'
        f'identity_file = "{ssh["identity_file"]}"\nknown_hosts = "{ssh["known_hosts"]}"\n'
        f'mfa = false\nsync = "git"\nuser_root_dir = "{home}"\n'
        f'python = "{sys.executable}"\npartition = "batch"\n')
    yield local, home
    state = home / ".trtllm-state" / "local" / ".slurm_alloc.json"
    if state.exists():  # never leave an allocation behind on the shared dev cluster
        sh(["scancel", json.loads(state.read_text())["job_id"]], check=False)


def test_remote_output_dir_comes_back_over_ssh(plain, remote_suite) -> None:
    """The batches run in the cluster's checkout (another path); what they wrote comes
    back through the SSH shell, and nothing is written to the user's path over there."""
    local, home = remote_suite
    proc = _pytest(local, "check_outputs.py", *STAGE, "--slurm-cluster=devssh",
                   "--trtllm-dispatch=all", "--trtllm-one-shot", timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "scenario: remote_slurm" in out, out
    assert _tree(local / "out") == plain, out
    assert list(home.glob("local/work_dirs/*/outputs/**/out/one_a/log.txt")), out
