"""Secrets given as options stay in memory (issue 29, item 5): PYTEST_ADDOPTS reaches the
worker as the variable it was (not as argv: ``ps`` on the node, job_spec.json and the
"re-run:" line would show it); option values are masked by the option's name; what may be
shown of an environment is an allow-list; cloud credential files are not shipped."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from pytest_trtllm_slurm.execution.remote.secret_files import looks_secret
from pytest_trtllm_slurm.planning.jobspec import JobSpec
from pytest_trtllm_slurm.planning.masking import is_secret, mask_argv, mask_env
from pytest_trtllm_slurm.planning.models import Scenario
from pytest_trtllm_slurm.transport.command_log import masked_argv

TOKEN = "s3cr3t-0ption-value"
DISPATCH = ["--trtllm-remote", "--trtllm-dispatch=all", "--trtllm-scenario=local_direct"]

CONFTEST = '''
def pytest_addoption(parser):
    parser.addoption("--api-token", default=None)
'''
SUITE = '''
import json, os

def test_sees_the_token(request):
    with open(os.environ["SEEN_FILE"], "a") as fh:
        fh.write(json.dumps({"option": request.config.getoption("--api-token"),
                             "cmdline": open("/proc/self/cmdline").read(),
                             "addopts": os.environ.get("PYTEST_ADDOPTS")}) + "\\n")
    assert False, "fails, so that the run prints its re-run line"
'''


def test_pytest_addopts_reaches_the_worker_as_a_variable_not_argv(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(CONFTEST)
    (suite / "test_tok.py").write_text(SUITE)
    seen = tmp_path / "seen.jsonl"
    env = {**os.environ, "PYTEST_ADDOPTS": f"--api-token={TOKEN} -x", "SEEN_FILE": str(seen)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                           "-rA", *DISPATCH], cwd=suite, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    (record,) = [json.loads(line) for line in seen.read_text().splitlines()]
    assert record["option"] == TOKEN  # the test got the option, as in a plain run
    assert TOKEN not in record["cmdline"]  # but not as argv of the worker (ps)
    assert record["addopts"] == f"--api-token={TOKEN}"  # -x is the controller's
    assert "re-run" in out and TOKEN not in out
    specs = list(suite.rglob("job_spec.json"))
    assert specs and all(TOKEN not in p.read_text() for p in specs)


def test_option_values_are_masked_by_the_option_name(tmp_path: Path) -> None:
    argv = ["pytest", "--password", "hunter2", "--api-token=tok-1", "--hf_token", "tok-2",
            "-k", "visible", "--key-file", "/keys/id", "-o", "cache_dir=/c"]
    shown = mask_argv(argv)
    assert shown == ["pytest", "--password", "***", "--api-token=***", "--hf_token", "***",
                     "-k", "visible", "--key-file", "/keys/id", "-o", "cache_dir=/c"]
    line = masked_argv(argv)
    assert "hunter2" not in line and "tok-1" not in line and "tok-2" not in line
    spec = JobSpec(scenario=Scenario.LOCAL_DIRECT, name="b", job_name="t.b",
                   rootdir=str(tmp_path), work_dir=str(tmp_path / "w"),
                   log_path=str(tmp_path / "w/log"), reports_path=str(tmp_path / "w/r.jsonl"),
                   command=argv, rerun_argv=argv)
    text = spec.write().read_text()
    assert "hunter2" not in text and "tok-1" not in text and "tok-2" not in text


@pytest.mark.parametrize("name", ["SSHPASS", "MYSQL_PWD", "CI_JOB_JWT", "SENTRY_DSN",
                                  "SLACK_WEBHOOK_URL", "DATABASE_URL", "SOME_NEW_THING"])
def test_only_what_is_allowed_is_shown(name: str) -> None:
    """What the name rule misses is still hidden: only allowed names are shown."""
    assert mask_env({name: "value-1", "CUDA_VISIBLE_DEVICES": "0,1"}) == {
        name: "***", "CUDA_VISIBLE_DEVICES": "0,1"}


@pytest.mark.parametrize("name", ["SSHPASS", "MYSQL_PWD", "CI_JOB_JWT", "SENTRY_DSN",
                                  "SLACK_WEBHOOK_URL"])
def test_secret_names_the_old_rule_missed(name: str) -> None:
    """Never written to a file (mailboxes): the name rule knows them now."""
    assert is_secret(name, "x")


@pytest.mark.parametrize("path", ["gha-creds-1a2b3c.json", "application_default_credentials.json",
                                  "client_secret_1234.apps.googleusercontent.com.json",
                                  "key.json", "deploy/sa-key.json"])
def test_cloud_credential_files_are_not_shipped(path: str) -> None:
    assert looks_secret(path)


# -- values of the job's environment never reach a file (end to end, warm allocation) -----

OPT_VALUE = "opt-Q7vJx2-value"  # in PYTEST_ADDOPTS (an option of the suite's own)
TABLE_VALUE = "tbl-K3mWp9-value"  # in the clusters file's env
MARK_VALUE = "mrk-Z8rTq4-value"  # in a marker's env (the source holds it reversed)
STEP_VALUE = "stp-H5nYc6-value"  # another marker's env: that batch runs as a step
VALUES = (OPT_VALUE, TABLE_VALUE, MARK_VALUE, STEP_VALUE)

WARM_TESTS = f'''import os
import pytest

MARK = "".join(reversed({MARK_VALUE[::-1]!r}))
STEP = "".join(reversed({STEP_VALUE[::-1]!r}))
OPT = "".join(reversed({OPT_VALUE[::-1]!r}))
TABLE = "".join(reversed({TABLE_VALUE[::-1]!r}))


def _check(request, marker_value):
    assert request.config.getoption("--api-token") == OPT
    assert os.environ.get("TABLE_SETTING") == TABLE
    assert os.environ.get("MARKER_SETTING") == marker_value
    assert os.environ.get("SLURM_JOB_ID")  # on the cluster, not here


@pytest.mark.trtllm_slurm(devices=1, env={{"MARKER_SETTING": MARK}})
def test_served(request):
    _check(request, MARK)


@pytest.mark.trtllm_slurm(devices=1, env={{"MARKER_SETTING": MARK}})
def test_served_too(request):
    _check(request, MARK)


@pytest.mark.trtllm_slurm(devices=1, env={{"MARKER_SETTING": STEP}})
def test_other_marker_env(request):
    _check(request, STEP)
'''

WARM_TABLE = f'''
[clusters.{{name}}.env]
TABLE_SETTING = "{TABLE_VALUE}"
'''


def _files_holding(root: Path, values: tuple[str, ...]) -> list[str]:
    """Files under ``root`` that hold one of ``values``, less the user's own: the suite's
    sources (the values are in them reversed) and clusters file, and git's objects."""
    found = []
    for path in root.rglob("*"):
        if (path.is_symlink() or not path.is_file() or path.name == "trtllm-slurm.toml"
                or ".git" in path.parts or "__pycache__" in path.parts or path.suffix == ".py"):
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        found += [f"{path}: {v}" for v in values if v.encode() in data]
    return found


def _warm_run(suite: Path, *args: str, xdg: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TRTLLM_SLURM_") and k not in ("TABLE_SETTING", "MARKER_SETTING")}
    if xdg:
        env["XDG_RUNTIME_DIR"] = xdg  # where the ControlMaster's socket is found
    env["HOME"] = str(suite)  # no clusters file of the machine's user
    env["PYTEST_ADDOPTS"] = f"--api-token={OPT_VALUE}"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA",
                           "--log-cli-level=DEBUG", *args], cwd=suite, capture_output=True,
                          text=True, timeout=900, env=env, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "3 passed" in out, out
    return out


def _warm_suite(base: Path) -> Path:
    suite = base / "suite"
    suite.mkdir()
    (suite / "pytest.ini").write_text(
        "[pytest]\nmarkers =\n    trtllm_slurm: resources (pytest-trtllm-slurm)\n")
    (suite / "conftest.py").write_text(CONFTEST)
    (suite / "test_values.py").write_text(WARM_TESTS)
    (suite / ".gitignore").write_text("__pycache__/\n.pytest_cache/\nwork_dirs/\n")
    return suite


@pytest.mark.devcluster
def test_job_env_values_reach_warm_workers_and_steps_but_no_file_locally(
        devcluster: dict, tmp_path: Path) -> None:
    """A persistent allocation with warm workers on the local Slurm: the marker's, the
    clusters file's and PYTEST_ADDOPTS' values reach the tests (served by an agent, and as
    a step for a batch whose marker env differs), and none of them is in a launcher
    script, a mailbox request, job_spec.json, a log or the terminal."""
    suite = _warm_suite(tmp_path)
    name = devcluster["cluster_name"]
    (suite / "trtllm-slurm.toml").write_text(f"[clusters.{name}]\n"
                                             + WARM_TABLE.format(name=name))
    try:
        out = _warm_run(suite, f"--slurm-cluster={name}", "--slurm-partition=gb200")
        assert [v for v in VALUES if v in out] == []
        assert _files_holding(suite, VALUES) == []
        assert "Starting a warm worker on" in out, out
        # served by the agent, and (another marker env) as a step of the allocation
        assert list(suite.rglob("agent.sh")) and list(suite.rglob("step.sh")), out
    finally:
        state = suite / "work_dirs" / ".slurm_alloc.json"
        if state.exists():
            subprocess.run(["scancel", json.loads(state.read_text())["job_id"]], check=False)


@pytest.mark.devcluster
@pytest.mark.parametrize("transport", ["paramiko", "openssh"])
def test_job_env_values_reach_warm_workers_and_steps_but_no_file_over_ssh(
        devcluster: dict, tmp_path: Path, transport: str) -> None:
    """The same over the dev sshd: nothing under the cluster-side tree (checkout, work
    dirs, agents' mailboxes, state) nor here holds a value."""
    from devcluster import cancel_allocation, publish_ssh_suite

    suite = _warm_suite(tmp_path)
    publish_ssh_suite(suite, tmp_path, devcluster["ssh"], partition="gb200")
    with (suite / "trtllm-slurm.toml").open("a") as toml:
        if transport == "openssh":
            toml.write('transport = "openssh"\n')
        toml.write(WARM_TABLE.format(name="devssh"))
    subprocess.run(["git", "-C", str(suite), "-c", "user.name=t", "-c", "user.email=t@t",
                    "commit", "-qam", "table"], check=True)
    home = tmp_path / "cluster_home"
    ssh = devcluster["ssh"]
    xdg = tempfile.mkdtemp(prefix="x", dir="/tmp")  # 0700; socket paths stay short
    sock = f"{xdg}/ssh-trtllm-%r@%h:%p"
    try:
        if transport == "openssh":  # the user's ControlMaster, at the private default
            subprocess.run(["ssh", "-fNM", "-o", f"ControlPath={sock}", "-i",
                            ssh["identity_file"], "-o", f"UserKnownHostsFile={ssh['known_hosts']}",
                            "-p", str(ssh["port_key"]), f"{ssh['user']}@{ssh['host']}"],
                           check=True, timeout=30, stdin=subprocess.DEVNULL, capture_output=True)
        out = _warm_run(suite, "--slurm-cluster=devssh", xdg=xdg)
        assert [v for v in VALUES if v in out] == []
        assert _files_holding(home, VALUES) == []
        assert _files_holding(suite, VALUES) == []
        assert list(home.rglob("agent.sh")) and list(home.rglob("step.sh")), out
        assert list(home.rglob("inbox")), out
    finally:
        cancel_allocation(home)
        subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-p", str(ssh["port_key"]),
                        "-O", "exit", f"{ssh['user']}@{ssh['host']}"], capture_output=True,
                       check=False)
        shutil.rmtree(xdg, ignore_errors=True)


def test_over_ssh_without_the_relay_env_values_go_through_stdin(tmp_path: Path) -> None:
    """OpenSSH (and paramiko without its relay): the command string is the argv of the
    local ``ssh`` and of the login node's shell, both in ``ps``; the values go ahead of
    the command's input, and the command still gets all of its own input."""
    from pytest_trtllm_slurm.transport.ssh.commands import piped_env_command

    value = "it's $(not run) `either`\nsecond line"
    cmd, ahead = piped_env_command(["sh", "-c", 'printf "%s|%s|" "$V" "$PWD"; cat'],
                                   {"V": value}, cwd=str(tmp_path))
    assert "second line" not in cmd and "not run" not in cmd
    proc = subprocess.run(["sh", "-c", cmd], input=ahead + b"the input", capture_output=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode() == f"{value}|{tmp_path}|the input"
