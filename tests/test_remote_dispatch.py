"""remote_slurm end to end through the plugin: the dev cluster's sshd as the login node,
a bare git repository as origin, code synced (a tracked change and an untracked test),
tests run on the cluster and replayed here; the local repository is left unchanged."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from devcluster import child_pids
from devcluster import run as sh

EXAMPLES = Path(__file__).resolve().parent.parent / "conftest_examples"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=True).stdout


def snapshot(repo: Path) -> dict[str, str]:
    """What a user would notice if it changed: branch, HEAD, index, status, stash."""
    return {
        "head": git(repo, "rev-parse", "HEAD"),
        "branch": git(repo, "rev-parse", "--abbrev-ref", "HEAD"),
        "status": git(repo, "status", "--porcelain", "--untracked-files=all"),
        "index": (repo / ".git" / "index").read_bytes().hex(),
        "stash": git(repo, "stash", "list"),
        "branches": git(repo, "branch", "-a"),
    }


@pytest.fixture(scope="module")
def remote_setup(devcluster: dict, tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("remote")
    origin = base / "origin.git"
    subprocess.run(["git", "init", "-q", "--bare", str(origin)], check=True)
    local = base / "local"
    shutil.copytree(EXAMPLES, local, ignore=shutil.ignore_patterns("work_dirs", "__pycache__"))
    (local / ".gitignore").write_text("__pycache__/\n.pytest_cache/\nwork_dirs/\n")
    git(local, "init", "-q", "-b", "main")
    git(local, "-c", "user.name=t", "-c", "user.email=t@t", "add", "-A")
    git(local, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "base")
    git(local, "remote", "add", "origin", str(origin))
    git(local, "push", "-q", "origin", "main")
    # a tracked modification and a new untracked test: both must take effect remotely
    cpu = local / "test_cpu.py"
    cpu.write_text(cpu.read_text() + "\n\ndef test_tracked_change():\n    assert True\n")
    (local / "test_untracked_new.py").write_text(
        "import os, pytest\n\n@pytest.mark.skip_less_device(1)\n"
        "def test_untracked_on_cluster():\n"
        "    assert os.environ.get('SLURM_JOB_ID'), 'not inside a Slurm job'\n"
    )
    (local / ".env").write_text("HF_TOKEN=hf_not_for_the_cluster\n")  # untracked, not ignored
    ssh = devcluster["ssh"]
    remote_root = base / "cluster_home"
    (local / "trtllm-slurm.toml").write_text(
        "[clusters.devssh]\n"
        f'ssh_host = "{ssh["host"]}"\nssh_port = {ssh["port_key"]}\nuser = "{ssh["user"]}"\n'
        f'identity_file = "{ssh["identity_file"]}"\nknown_hosts = "{ssh["known_hosts"]}"\n'
        f'mfa = false\nsync = "git"\nuser_root_dir = "{remote_root}"\n'
        f'python = "{sys.executable}"\npartition = "batch"\n'
        "\n[clusters.devotp]\n"
        f'ssh_host = "{ssh["host"]}"\nssh_port = {ssh["port_otp"]}\nuser = "{ssh["user"]}"\n'
        f'identity_file = "{ssh["identity_file"]}"\nknown_hosts = "{ssh["known_hosts"]}"\n'
        f'mfa = true\nsync = "git"\nuser_root_dir = "{remote_root}"\n'
        f'python = "{sys.executable}"\npartition = "batch"\n'
        # no partition / gpus_per_node / device_type: sized by discovery over SSH
        "\n[clusters.devsize]\n"
        f'ssh_host = "{ssh["host"]}"\nssh_port = {ssh["port_key"]}\nuser = "{ssh["user"]}"\n'
        f'identity_file = "{ssh["identity_file"]}"\nknown_hosts = "{ssh["known_hosts"]}"\n'
        f'mfa = false\nsync = "git"\nuser_root_dir = "{base / "size_home"}"\n'
        f'python = "{sys.executable}"\n'
        "\n[clusters.strangehost]\n"
        f'ssh_host = "{ssh["host"]}"\nssh_port = {ssh["port_key"]}\nuser = "{ssh["user"]}"\n'
        f'identity_file = "{ssh["identity_file"]}"\nknown_hosts = "{base / "empty_known_hosts"}"\n'
        f'mfa = false\nsync = "none"\n'
    )
    (base / "empty_known_hosts").write_text("")
    before = snapshot(local)
    yield local, remote_root, before
    assert git(origin, "for-each-ref", "--format=%(refname)") == "refs/heads/main\n", \
        "a run pushed to origin"
    for home in (remote_root, base / "size_home"):  # (the state is kept on the cluster)
        state = home / ".trtllm-state" / "local" / ".slurm_alloc.json"
        if state.exists():  # never leave an allocation behind on the shared dev cluster
            sh(["scancel", json.loads(state.read_text())["job_id"]], check=False)


def run_pytest(local: Path, *args: str, extra_env: dict[str, str] | None = None,
               timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRTLLM_SLURM_")}
    env.update(extra_env or {})
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", *args],
        cwd=local, capture_output=True, text=True, timeout=timeout, env=env, check=False,
    )


def test_examples_run_remotely_over_ssh(remote_setup) -> None:
    local, remote_root, before = remote_setup
    proc = run_pytest(local, "--slurm-cluster=devssh", "--trtllm-dispatch=all",
                      "--trtllm-one-shot", "-k", "untracked or tracked_change or one_gpu")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for nodeid in ("test_untracked_new.py::test_untracked_on_cluster",
                   "test_cpu.py::test_tracked_change", "test_single_gpu.py::test_one_gpu[fp16]"):
        assert f"PASSED {nodeid}" in out, nodeid
    assert "scenario: remote_slurm" in out
    assert f"work dir: {remote_root}/local/work_dirs/" in out
    assert "re-run:   ssh -p" in out
    # the code really ran from the cluster's checkout, not from the local folder
    assert (remote_root / "local" / "test_untracked_new.py").exists()
    assert list((remote_root / "local" / "work_dirs").glob("*/reports.jsonl"))
    assert snapshot(local) == before, "the local repository changed"
    # untracked files are listed before they are shipped; a secret-looking one never is
    assert ("code sync: shipping 2 untracked file(s) to 127.0.0.1:"
            f"{remote_root}/local: test_untracked_new.py, trtllm-slurm.toml") in out, out
    assert "NOT shipped to 127.0.0.1 (1 file(s) that look like secrets" in out
    assert not (remote_root / "local" / ".env").exists()
    assert "hf_not_for_the_cluster" not in out


WORLD_OF_EIGHT = """\
import os, pytest


@pytest.mark.trtllm_slurm(launch="mpi")  # one pytest per rank: the world size check passes
@pytest.mark.skip_less_mpi_world_size(8)
def test_world_of_eight():
    \"\"\"TensorRT-LLM's shape: 8 ranks, which may span nodes.\"\"\"
    assert os.environ["SLURM_JOB_NUM_NODES"] == "2"
    assert os.environ["SLURM_NTASKS"] == "8"
    assert len(os.environ["CUDA_VISIBLE_DEVICES"].split(",")) == 4
"""


def _world_of_eight(local: Path) -> Path:
    test = local / "test_untracked_world8.py"
    test.write_text(WORLD_OF_EIGHT)
    return test


def test_remote_cluster_without_sizing_keys_is_planned_from_discovery(remote_setup) -> None:
    """The clusters-file entry names no partition and no gpus_per_node: the plan comes from
    Slurm discovery over SSH (4 GPUs per node on the dev cluster), so 8 ranks = 2 x 4."""
    local, _, _ = remote_setup
    test = _world_of_eight(local)
    cache = local / "work_dirs" / ".cache" / "slurm_env-remote-devsize.json"
    cache.unlink(missing_ok=True)
    try:
        plan = local / "work_dirs" / "plan-devsize.json"
        proc = run_pytest(local, "--slurm-cluster=devsize", "--trtllm-plan",
                          f"--trtllm-plan-json={plan}", "test_untracked_world8.py",
                          "test_multi_gpu.py")
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out
        assert ("test_untracked_world8.py::test_world_of_eight: 8 x any GPU = 2 node(s) x 4 "
                "-> remote_slurm partition=batch") in out, out
        assert "test_multi_gpu.py::test_eight_gpus: 8 x any GPU = 1 node(s) x 8 -> not served" \
            in out, out
        # cached like the local discovery, keyed by the cluster, private
        data = json.loads(cache.read_text())
        assert data["key"].startswith("remote|devsize|")
        assert {p["name"]: p["gpus_per_node"] for p in data["env"]["partitions"]} == {
            "batch": 4, "gb200": 4}
        assert oct(cache.stat().st_mode & 0o777) == "0o600"
    finally:
        test.unlink()


# records each Slurm discovery's thread (the early start's, the early connection's, or not)
DISCOVERY_RECORDER = """import json, os, threading
import pytest_trtllm_slurm.execution.slurm.client as client

_discover = client.SlurmClient.discover
threads = []


def discover(self, *args, **kwargs):
    threads.append(threading.current_thread().name)
    with open(os.environ["RECORD"], "w") as fh:
        json.dump(threads, fh)
    return _discover(self, *args, **kwargs)


client.SlurmClient.discover = discover
"""


def test_stale_discoveries_are_made_beside_the_suites_import(remote_setup,
                                                             tmp_path: Path) -> None:
    """Both caches stale (a run more than five minutes after the last): this machine's Slurm
    is discovered by the early start's thread and the remote cluster's by the early
    connection's, while the suite imports; planning reads what they cached (it discovered
    both itself, after the import, 0.2 s each on the dev cluster)."""
    local, _, _ = remote_setup
    for stale in (local / "work_dirs" / ".cache").glob("slurm_env*.json"):
        stale.unlink()
    (tmp_path / "recorder.py").write_text(DISCOVERY_RECORDER)
    record = tmp_path / "record.json"
    proc = run_pytest(local, "--slurm-cluster=devsize", "--trtllm-dispatch=all",
                      "--trtllm-one-shot", "-k", "tracked_change",
                      extra_env={"PYTHONPATH": str(tmp_path), "RECORD": str(record),
                                 "PYTEST_PLUGINS": "recorder"})  # here only: not forwarded
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "PASSED test_cpu.py::test_tracked_change" in out, out
    assert sorted(json.loads(record.read_text())) == [
        "ssh-early-devsize", "trtllm-slurm-discovery"], out
    assert (local / "work_dirs" / ".cache" / "slurm_env-remote-devsize.json").exists()


def test_remote_world_of_eight_runs_on_two_nodes_of_four(remote_setup) -> None:
    """End to end: sbatch accepts the discovered shape and the test passes on 2 nodes."""
    local, remote_root, _ = remote_setup
    test = _world_of_eight(local)
    try:
        proc = run_pytest(local, "--slurm-cluster=devsize", "--trtllm-one-shot",
                          "test_untracked_world8.py", timeout=420)
    finally:
        test.unlink()
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "PASSED test_untracked_world8.py::test_world_of_eight" in out, out
    specs = [json.loads(p.read_text()) for p in (
        remote_root.parent / "size_home" / "local" / "work_dirs").glob("*/job_spec.json")]
    spec = next(s for s in specs  # (other tests' batches ran on this cluster too)
                if any("test_world_of_eight" in n for n in s["nodeids"]))
    assert (spec["partition"], spec["account"]) == ("batch", "acct_a")
    assert (spec["total_devices"], spec["devices_per_node"], spec["node_count"]) == (8, 4, 2)


def test_unknown_host_key_is_refused_with_a_clear_error(remote_setup) -> None:
    local, _, before = remote_setup
    proc = run_pytest(local, "--slurm-cluster=strangehost", "-k", "one_gpu")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 4, out
    assert "Traceback" not in out
    assert "accept_new_host_key" in out and "127.0.0.1" in out


def test_wrong_one_time_code_is_a_clear_error(remote_setup) -> None:
    local, _, _ = remote_setup
    proc = run_pytest(local, "--slurm-cluster=devotp", "-k", "one_gpu",
                      extra_env={"TRTLLM_SLURM_OTP": "000000"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 4, out
    assert "Traceback" not in out and "000000" not in out


def _listener_children(state_dir: str) -> list[int]:
    return child_pids(int(Path(state_dir, "ssh", "sshd.pid").read_text()))


def test_persistent_over_mfa_survives_a_cut_connection(remote_setup, devcluster: dict) -> None:
    """Key + one-time code, a persistent allocation, and the SSH connection killed while
    a test runs on the cluster: the run reconnects and every test is reported once."""
    local, remote_root, _ = remote_setup
    (local / "test_untracked_slow.py").write_text(
        "import time, pytest\n\n@pytest.mark.skip_less_device(1)\n"
        "def test_slow_remote():\n    print('remote-started', flush=True)\n"
        "    time.sleep(6)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRTLLM_SLURM_")}
    env["TRTLLM_SLURM_OTP"] = devcluster["ssh"]["otp_static"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA",
         "--slurm-cluster=devotp", "-k", "slow_remote or one_gpu"],
        cwd=local, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )
    deadline = time.monotonic() + 90
    killed: list[int] = []
    while time.monotonic() < deadline and not killed:
        logs = list((remote_root / "local" / "work_dirs").glob("*/job.log"))
        if any("remote-started" in p.read_text(errors="replace") for p in logs):
            for pid in _listener_children(devcluster["state_dir"]):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        time.sleep(0.2)
    out, _ = proc.communicate(timeout=180)
    (local / "test_untracked_slow.py").unlink()
    assert killed, "the slow test never started on the cluster:\n" + out
    assert proc.returncode == 0, out
    assert out.count("PASSED test_untracked_slow.py::test_slow_remote") == 1, out
    assert "PASSED test_single_gpu.py::test_one_gpu[fp16]" in out
    assert devcluster["ssh"]["otp_static"] not in out
    state = remote_root / ".trtllm-state" / "local" / ".slurm_alloc.json"
    assert json.loads(state.read_text())["job_id"]


def _with_build(local: Path, build_cmd: str) -> None:
    text = (local / "trtllm-slurm.toml").read_text()
    start = text.index("[clusters.devssh]")
    end = text.index("[clusters.devotp]")
    table = text[start:end].rstrip() + f"\nbuild_project = true\nbuild_cmd = {json.dumps(build_cmd)}\n\n"
    (local / "trtllm-slurm.toml").write_text(text[:start] + table + text[end:])


def test_failed_build_fails_every_test_and_dispatches_nothing(remote_setup) -> None:
    local, remote_root, _ = remote_setup
    original = (local / "trtllm-slurm.toml").read_text()
    try:
        _with_build(local, "echo compiling for {arch}; echo 'error: missing symbol' >&2; exit 3")
        proc = run_pytest(local, "--slurm-cluster=devssh", "--trtllm-one-shot", "-k", "one_gpu")
        out = proc.stdout + proc.stderr
        assert proc.returncode == 1, out
        assert out.count(" - [BUILD_FAILED]") == 3, out  # the three one_gpu tests
        assert "compiling for 90-real" in out and "error: missing symbol" in out, out
        assert "nothing was dispatched" in out
        # no test batch was created on the cluster after the build
        batches = [p for p in (remote_root / "local" / "work_dirs").glob("batch-*")
                   if p.stat().st_mtime > (local / "trtllm-slurm.toml").stat().st_mtime]
        assert not batches, batches

        (local / "trtllm-slurm.toml").write_text(original)
        _with_build(local, "echo built-for-{arch} > built.txt")
        proc = run_pytest(local, "--slurm-cluster=devssh", "--trtllm-one-shot", "-k", "one_gpu")
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out
        assert (remote_root / "local" / "built.txt").read_text().strip() == "built-for-90-real"
    finally:
        (local / "trtllm-slurm.toml").write_text(original)

