"""Access to the REAL dev Slurm cluster of the test suite (brought up by tests/cluster/up).

`devcluster` (session fixture, registered in tests/conftest.py) runs tests/cluster/up once per
session -- idempotent, ~0.1 s when the cluster is already up -- and returns its JSON description
(a dict; see the keys `up` prints: cluster_name, partitions, accounts, default_account, user, ssh,
state_dir, fake_bin, slurm_conf, ...). If the cluster cannot be brought up the test FAILS (it is
never skipped) with the tail of up's output and the command to run by hand.

Slurm's config lives in /etc/slurm, so plain `sbatch`/`srun`/`sacct` in any shell (SSH sessions
included) talk to this cluster; no environment variables are needed.
"""
import contextlib
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest
from filelock import FileLock

REPO = pathlib.Path(__file__).resolve().parent.parent
UP = REPO / "tests" / "cluster" / "up"
STATE_FILE = REPO / ".devcluster" / "cluster.json"

#: sacct states after which a job never changes again
TERMINAL_STATES = {
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
    "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT", "REVOKED",
}

_cluster = None


def bring_up(timeout=1800):
    """Run tests/cluster/up (serialised across xdist workers) and return the parsed JSON."""
    global _cluster
    if _cluster is not None:
        return _cluster
    lock_dir = REPO / ".devcluster"
    lock_dir.mkdir(exist_ok=True)
    cmd = [sys.executable, str(UP)]
    with FileLock(str(lock_dir / "up.lock")):
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                               stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            _fail(f"timed out after {timeout}s", e.stdout, e.stderr)
        except OSError as e:
            _fail(f"could not run it: {e}", "", "")
    if r.returncode != 0:
        _fail(f"exit status {r.returncode}", r.stdout, r.stderr)
    try:
        _cluster = json.loads(r.stdout)
    except ValueError:
        _fail("it printed no JSON", r.stdout, r.stderr)
    return _cluster


def _fail(what, out, err):
    def _s(x):
        return x.decode(errors="replace") if isinstance(x, bytes) else (x or "")
    lines = (_s(err) + _s(out)).splitlines()[-40:]
    hint = "sudo " if os.geteuid() != 0 else ""
    pytest.fail(
        f"the dev Slurm cluster could not be brought up: {UP} {what}\n"
        + "\n".join(lines)
        + f"\n\nStart it by hand (needs root; installs its apt packages when missing):\n"
        f"    {hint}{UP}\n",
        pytrace=False,
    )


@pytest.fixture(scope="session")
def devcluster():
    """The running dev cluster's description (dict parsed from tests/cluster/up's JSON)."""
    return bring_up()


@pytest.fixture(autouse=True)
def _cancel_jobs_left_in_tmp_path(request):
    """After a test that used the dev cluster: cancel the jobs it left running in its own
    tmp_path (a persistent allocation its suite made, or the jobs of a run the test gave up
    on). Another test's jobs live in another tmp_path; module-scoped allocations live in
    folders of tmp_path_factory, never in a test's tmp_path. Without this, a failed or
    timed-out test keeps whole nodes until its allocation's time limit and every later test
    waits for them."""
    if "devcluster" not in request.fixturenames or "tmp_path" not in request.fixturenames:
        yield
        return
    root = str(request.getfixturevalue("tmp_path"))  # now: it is torn down after this one
    yield
    try:
        out = subprocess.run(["squeue", "-h", "-u", str(os.getuid()), "-o", "%i|%Z"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return
    left = [job for job, _, workdir in (line.partition("|") for line in out.splitlines())
            if workdir == root or workdir.startswith(root + "/")]
    if left:
        subprocess.run(["scancel", *left], capture_output=True, timeout=30)


def run(cmd, check=True, timeout=60, **kw):
    """subprocess.run with text capture; on check failure the output is in the error."""
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       stdin=kw.pop("stdin", subprocess.DEVNULL), **kw)
    if check and r.returncode != 0:
        raise AssertionError(f"{cmd} failed with {r.returncode}:\nstdout: {r.stdout}\nstderr: {r.stderr}")
    return r


def sbatch(*args, **kw):
    """`sbatch --parsable ARGS`; returns the job id (str)."""
    r = run(["sbatch", "--parsable", *args], **kw)
    return r.stdout.strip().split(";")[0]


def sacct_state(job_id):
    """(State, ExitCode) of the job allocation as sacct has it, or None if sacct does not know it yet."""
    r = run(["sacct", "-X", "-n", "-P", "-j", str(job_id), "--format=State,ExitCode"], check=False)
    lines = [line for line in r.stdout.splitlines() if line.strip()]
    if r.returncode != 0 or not lines:
        return None
    state, _, code = lines[0].partition("|")
    return state.split()[0], code  # "CANCELLED by 0" -> "CANCELLED"


def wait_for_job(job_id, timeout=120.0, poll=0.5):
    """Poll `sacct -X -n -P -j ID --format=State,ExitCode` until the job reaches a terminal state.

    Returns (state, exitcode), e.g. ("FAILED", "3:0"); "CANCELLED by 0" is returned as "CANCELLED".
    Raises TimeoutError (with the last state seen) after `timeout` seconds.
    """
    end = time.monotonic() + timeout
    last = None
    while True:
        last = sacct_state(job_id)
        if last and last[0] in TERMINAL_STATES:
            return last
        if time.monotonic() >= end:
            raise TimeoutError(f"job {job_id} not finished after {timeout}s (last sacct state: {last})")
        time.sleep(poll)


def squeue_state(job_id):
    """(state, reason) from squeue, or None once the job left the queue."""
    r = run(["squeue", "-h", "-j", str(job_id), "-o", "%T|%r"], check=False)
    line = r.stdout.strip()
    if r.returncode != 0 or not line:
        return None
    state, _, reason = line.partition("|")
    return state, reason


def wait_for_squeue(job_id, pred, timeout=60.0, poll=0.2):
    """Poll squeue until pred((state, reason)) is true; returns that (state, reason)."""
    end = time.monotonic() + timeout
    while True:
        st = squeue_state(job_id)
        if st is not None and pred(st):
            return st
        if time.monotonic() >= end:
            raise TimeoutError(f"job {job_id}: squeue state {st} did not match after {timeout}s")
        time.sleep(poll)


def child_pids(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (from /proc), e.g. the sshd processes serving
    connections under the dev cluster's sshd listener."""
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = pathlib.Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                kids.append(int(entry))
    return kids


def publish_ssh_suite(suite, base, ssh, *, partition="batch", message="suite"):
    """Point ``suite`` at the dev sshd as cluster ``devssh`` (git sync into
    ``base/cluster_home``), commit it and push it to a bare origin beside it."""
    import sys as _sys
    (suite / "trtllm-slurm.toml").write_text(
        "[clusters.devssh]\n"
        f'ssh_host = "{ssh["host"]}"\nssh_port = {ssh["port_key"]}\nuser = "{ssh["user"]}"\n'
        f'identity_file = "{ssh["identity_file"]}"\nknown_hosts = "{ssh["known_hosts"]}"\n'
        f'mfa = false\nsync = "git"\nuser_root_dir = "{base / "cluster_home"}"\n'
        f'python = "{_sys.executable}"\npartition = "{partition}"\n')
    origin = base / "origin.git"
    subprocess.run(["git", "init", "-q", "--bare", str(origin)], check=True)
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", message],
                 ["remote", "add", "origin", str(origin)], ["push", "-q", "origin", "main"]):
        subprocess.run(["git", *args], cwd=suite, check=True, capture_output=True)
    return suite


def cancel_allocation(home) -> None:
    """The allocations a test's remote runs made (their state files under the "cluster"
    home ``home``), cancelled."""
    for state in pathlib.Path(home).glob(".trtllm-state/**/*.json"):
        try:
            job_id = str(json.loads(state.read_text())["job_id"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        subprocess.run(["scancel", job_id], check=False, capture_output=True)


@contextlib.contextmanager
def example_suite(folder, tests: str, conftest_extra: str = ""):
    """``conftest_examples``' conftest (plus ``conftest_extra``) and pytest.ini with ``tests``
    as test_warm.py in ``folder``; the persistent allocation its runs made is cancelled
    afterwards (never left behind on the shared dev cluster)."""
    suite = pathlib.Path(folder)
    suite.mkdir()
    examples = REPO / "conftest_examples"
    (suite / "conftest.py").write_text((examples / "conftest.py").read_text() + conftest_extra)
    (suite / "pytest.ini").write_text((examples / "pytest.ini").read_text())
    (suite / "test_warm.py").write_text(tests)
    try:
        yield suite
    finally:
        state = suite / "work_dirs" / ".slurm_alloc.json"
        if state.exists():
            run(["scancel", json.loads(state.read_text())["job_id"]], check=False)
