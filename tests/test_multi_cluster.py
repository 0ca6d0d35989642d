"""Several clusters in one run, on the real dev cluster reached two ways.

The clusters file names two clusters: ``devcluster`` (this machine's own Slurm, its
``batch`` partition: H200 nodes n1, n2) and ``gbssh`` (the same Slurm over the dev sshd on
127.0.0.1:2222, its ``gb200`` partition: GB200 nodes g1, g2). Each test goes to the one
that serves its device type; both run at once, each with its own allocation; one summary
covers them. The GPUs are the dev cluster's FAKE ones (``FAKE_GPU_NAME``, set by its task
prolog per node); Slurm, SSH and the plugin are real.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

SUITE = '''\
import json, os, pathlib, time
import pytest

SEEN = pathlib.Path(__file__).parent / "seen"


def _record(name, other=None):
    """Write where and when this test ran; with ``other`` (a run that pairs them) wait,
    at most five minutes, until that test has started too: run one after the other, the
    first of them fails here."""
    start = time.time()
    SEEN.mkdir(exist_ok=True)
    (SEEN / (name + ".start")).write_text(str(start))
    if other and (SEEN / "pair").exists():
        deadline = time.monotonic() + 300  # the other cluster's queue (a shared dev cluster)
        while not (SEEN / (other + ".start")).exists():
            assert time.monotonic() < deadline, other + " never ran while " + name + " did"
            time.sleep(0.2)
    (SEEN / (name + ".json")).write_text(json.dumps({
        "start": start, "stop": time.time(), "node": os.environ.get("SLURMD_NODENAME"),
        "partition": os.environ.get("SLURM_JOB_PARTITION"),
        "gpu": os.environ.get("FAKE_GPU_NAME")}))


@pytest.mark.trtllm_slurm(device_type="H200")
@pytest.mark.skip_less_device(1)
def test_on_h200():
    _record("h200", "gb200")


@pytest.mark.trtllm_slurm(device_type="GB200")
@pytest.mark.skip_less_device(1)
def test_on_gb200():
    _record("gb200", "h200")


@pytest.mark.trtllm_slurm(device_type="GB200")
@pytest.mark.skip_less_device(1)
def test_fails_on_gb200():
    assert os.environ.get("FAKE_GPU_NAME") == "no such GPU", "fails on purpose"


@pytest.mark.trtllm_slurm(device_type="GB200")
@pytest.mark.skip_less_device(8)
def test_eight_gb200_on_one_node():
    pass
'''


def _cancel_jobs_under(folder: Path) -> None:
    """This module's jobs only, never another's: those whose work dir is under its folder,
    and the allocations its state files name (over SSH a job's work dir is the login's
    home directory)."""
    out = subprocess.run(["squeue", "-h", "-u", str(os.getuid()), "-o", "%i|%Z"],
                         capture_output=True, text=True, timeout=30).stdout
    mine = [job for job, _, wd in (line.partition("|") for line in out.splitlines())
            if wd == str(folder) or wd.startswith(f"{folder}/")]
    for state in folder.rglob(".slurm_alloc.json"):
        try:
            mine.append(str(json.loads(state.read_text())["job_id"]))
        except (OSError, ValueError, KeyError):
            continue
    if mine:
        subprocess.run(["scancel", *mine], capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def two_clusters(devcluster: dict, tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("multi")
    suite = base / "suite"
    suite.mkdir()
    (suite / "test_where.py").write_text(SUITE)
    (suite / "pytest.ini").write_text("[pytest]\n")
    ssh = devcluster["ssh"]
    assert devcluster["cluster_name"] == "devcluster"
    (suite / "trtllm-slurm.toml").write_text(
        "[clusters.devcluster]\n"  # this machine's Slurm (its ClusterName), batch only
        'partition = "batch"\n'
        "\n[clusters.gbssh]\n"  # the same Slurm over SSH, gb200 only
        f'ssh_host = "{ssh["host"]}"\nssh_port = {ssh["port_key"]}\nuser = "{ssh["user"]}"\n'
        f'identity_file = "{ssh["identity_file"]}"\nknown_hosts = "{ssh["known_hosts"]}"\n'
        f'mfa = false\nsync = "none"\npython = "{sys.executable}"\npartition = "gb200"\n'
    )
    yield suite
    _cancel_jobs_under(base)  # the two persistent allocations of this module's runs


def run_pytest(suite: Path, *args: str, timeout: float = 420) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRTLLM_SLURM_")}
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", *args]
    try:
        return subprocess.run(argv, cwd=suite, capture_output=True, text=True,
                              timeout=timeout, env=env, check=False)
    except subprocess.TimeoutExpired as exc:  # what it waited for is in its output
        def text(value: str | bytes | None) -> str:
            return value.decode(errors="replace") if isinstance(value, bytes) else value or ""

        return subprocess.CompletedProcess(argv, -9, f"TIMED OUT after {timeout} s\n"
                                           + text(exc.stdout), text(exc.stderr))


@contextlib.contextmanager
def paired(suite: Path) -> Iterator[None]:
    """The H200 and GB200 tests wait for each other while this lasts; what an earlier run
    left (a start file would let a test pass the wait alone) is gone first."""
    folder = suite / "seen"
    folder.mkdir(exist_ok=True)
    for left in folder.glob("*"):
        left.unlink()
    (folder / "pair").write_text("")
    try:
        yield
    finally:
        (folder / "pair").unlink()


def seen(suite: Path, name: str) -> dict:
    return json.loads((suite / "seen" / f"{name}.json").read_text())


def test_the_plan_names_the_cluster_of_each_test(two_clusters: Path) -> None:
    suite = two_clusters
    proc = run_pytest(suite, "--trtllm-plan", "--trtllm-plan-json=plan.json")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert ("test_where.py::test_on_h200: 1 x H200 = 1 node(s) x 1 -> local_slurm "
            "partition=batch cluster=devcluster") in out, out
    assert ("test_where.py::test_on_gb200: 1 x GB200 = 1 node(s) x 1 -> remote_slurm "
            "partition=gb200 cluster=gbssh") in out, out
    rows = {r["nodeid"].split("::")[1]: r for r in json.loads((suite / "plan.json").read_text())
            ["tests"]}
    assert {n: (r["scenario"], r["cluster"], r["partition"]) for n, r in rows.items()} == {
        "test_on_h200": ("local_slurm", "devcluster", "batch"),
        "test_on_gb200": ("remote_slurm", "gbssh", "gb200"),
        "test_fails_on_gb200": ("remote_slurm", "gbssh", "gb200"),
        "test_eight_gb200_on_one_node": (None, None, None),
    }
    # no cluster has 8 GB200 on one node: said with what each cluster offers
    why = rows["test_eight_gb200_on_one_node"]["reason"]
    assert "needs 8 GPUs" in why and "GB200" in why, why
    assert "gbssh (gb200: 4x gb200 per node, 2 nodes)" in why, why
    assert "local Slurm devcluster: batch (4x h200 per node, 2 nodes)" in why, why


def test_a_device_keyword_finds_the_cluster_that_has_it(two_clusters: Path) -> None:
    """skip_device_not_contain(['GB200']): only gbssh's discovery has a GB200 (the local
    cluster's table offers its batch partition alone), so the test goes there."""
    suite = two_clusters
    (suite / "test_keyword.py").write_text(
        "import pytest\n\n@pytest.mark.skip_device_not_contain(['GB200'])\n"
        "@pytest.mark.skip_less_device(1)\ndef test_any_gb200():\n    pass\n")
    try:
        proc = run_pytest(suite, "--trtllm-plan", "test_keyword.py")
    finally:
        (suite / "test_keyword.py").unlink()
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert ("test_keyword.py::test_any_gb200: 1 x GB200 = 1 node(s) x 1 -> remote_slurm "
            "partition=gb200 cluster=gbssh") in out, out


def test_each_test_runs_on_its_cluster_at_the_same_time(two_clusters: Path) -> None:
    """An H200 test and a GB200 test in one run: each lands on its cluster's nodes, they
    overlap (each waits for the other to have started), a failure on one cluster is
    reported and the other's results stay; one summary covers both."""
    suite = two_clusters
    with paired(suite):
        proc = run_pytest(suite, "--trtllm-remote", "--trtllm-summary-json=summary.json",
                          "--trtllm-timeline=timeline.json", timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out  # one test fails on purpose
    assert "PASSED test_where.py::test_on_h200" in out, out
    assert "PASSED test_where.py::test_on_gb200" in out, out
    assert "FAILED test_where.py::test_fails_on_gb200" in out, out
    assert "fails on purpose" in out
    assert "SKIPPED [1] test_where.py:" in out and "needs 8 GPUs" in out, out

    h200, gb200 = seen(suite, "h200"), seen(suite, "gb200")
    assert (h200["partition"], h200["gpu"]) == ("batch", "NVIDIA H200"), h200
    assert h200["node"] in ("n1", "n2"), h200
    assert (gb200["partition"], gb200["gpu"]) == ("gb200", "NVIDIA GB200"), gb200
    assert gb200["node"] in ("g1", "g2"), gb200
    # both ran at once: each started before the other stopped (their own clocks, one host)
    assert max(h200["start"], gb200["start"]) < min(h200["stop"], gb200["stop"]), (h200, gb200)

    summary = json.loads((suite / "summary.json").read_text())
    assert sorted(summary["clusters"]) == ["devcluster", "gbssh"]
    where = {n.split("::")[1]: (b["cluster"], b["partition"], b["scenario"])
             for b in summary["batches"] for n in b["nodeids"]}
    assert where == {"test_on_h200": ("devcluster", "batch", "local_slurm"),
                     "test_on_gb200": ("gbssh", "gb200", "remote_slurm"),
                     "test_fails_on_gb200": ("gbssh", "gb200", "remote_slurm")}
    # two clusters may number their jobs alike: each job id names its cluster
    for batch in summary["batches"]:
        assert batch["job_id"].startswith(f"{batch['cluster']}:"), batch
    assert summary["efficiency"]["tests"] == 3
    # the terminal summary: one line per cluster, the failure beside the other's pass
    assert "cluster devcluster (batch): 1 batch(es), 1 test(s): 1 passed" in out, out
    assert "cluster gbssh (gb200):" in out and "1 passed, 1 failed" in out, out
    # the timeline's nodes say whose they are
    trace = json.loads((suite / "timeline.json").read_text())
    nodes = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    assert any(n.startswith("devcluster:n") for n in nodes), nodes
    assert any(n.startswith("gbssh:g") for n in nodes), nodes


def test_slurm_cluster_pins_one_cluster(two_clusters: Path) -> None:
    """--slurm-cluster gbssh: everything goes there; the H200 test, which gbssh cannot
    serve, is skipped saying so; job ids are the cluster's own (one cluster)."""
    suite = two_clusters
    proc = run_pytest(suite, "--slurm-cluster=gbssh", "--trtllm-summary-json=pinned.json",
                      "-k", "test_on_h200 or test_on_gb200")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "PASSED test_where.py::test_on_gb200" in out, out
    assert "SKIPPED [1] test_where.py:" in out, out
    assert "needs 1 GPU" in out and "H200" in out and "'gbssh'" in out, out
    assert seen(suite, "gb200")["partition"] == "gb200"
    summary = json.loads((suite / "pinned.json").read_text())
    assert summary["clusters"] == ["gbssh"]
    assert all(b["cluster"] == "gbssh" and ":" not in b["job_id"] for b in summary["batches"])


def test_a_device_type_no_cluster_has_is_a_clear_error(two_clusters: Path) -> None:
    suite = two_clusters
    (suite / "test_b200.py").write_text(
        "import pytest\n\n@pytest.mark.trtllm_slurm(device_type='B200')\n"
        "@pytest.mark.skip_less_device(1)\ndef test_b200():\n    pass\n")
    try:
        proc = run_pytest(suite, "--trtllm-plan", "test_b200.py")
    finally:
        (suite / "test_b200.py").unlink()
    out = proc.stdout + proc.stderr
    assert proc.returncode == 4, out  # a usage error: nothing ran
    assert "device type B200 is not on this machine" in out, out
    assert "clusters: gbssh (gb200: 4x gb200 per node, 2 nodes)" in out, out


def test_a_cluster_that_cannot_be_reached_fails_only_its_own_tests(two_clusters: Path,
                                                                    devcluster: dict) -> None:
    """A third cluster whose login node refuses connections (its table says enough to
    route without connecting): its B200 test fails naming the cluster and the reason,
    the H200 test on devcluster passes, and the run is no usage error."""
    suite = two_clusters
    with socket.socket() as probe:  # a port nothing listens on (taken, then let go)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ssh = devcluster["ssh"]
    config = suite / "three.toml"
    config.write_text(
        (suite / "trtllm-slurm.toml").read_text()
        + "\n[clusters.down]\n"
        f'ssh_host = "127.0.0.1"\nssh_port = {port}\nuser = "{ssh["user"]}"\n'
        f'identity_file = "{ssh["identity_file"]}"\nknown_hosts = "{ssh["known_hosts"]}"\n'
        'mfa = false\nsync = "none"\npartition = "b200"\ndevice_type = "B200"\n'
        "gpus_per_node = 8\n")
    (suite / "test_down.py").write_text(
        "import pytest\nfrom test_where import _record\n\n"
        "@pytest.mark.trtllm_slurm(device_type='B200')\n@pytest.mark.skip_less_device(1)\n"
        "def test_on_b200():\n    pass\n\n"
        "@pytest.mark.trtllm_slurm(device_type='H200')\n@pytest.mark.skip_less_device(1)\n"
        "def test_h200_beside():\n    _record('beside')\n")
    try:
        proc = run_pytest(suite, "--trtllm-remote", f"--trtllm-config={config}",
                          "test_down.py")
    finally:
        (suite / "test_down.py").unlink()
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "PASSED test_down.py::test_h200_beside" in out, out
    assert seen(suite, "beside")["partition"] == "batch"
    assert "FAILED test_down.py::test_on_b200" in out, out
    assert "cluster 'down' could not be set up" in out, out
    assert f"127.0.0.1 port {port}" in out, out


def test_two_remote_clusters_in_one_run(two_clusters: Path, devcluster: dict) -> None:
    """Two remote clusters (the dev sshd twice: its batch and its gb200 partitions), no
    local Slurm in the way (--trtllm-scenario=remote_slurm): each has its own connection,
    allocation and executor, the H200 and GB200 tests overlap on their own nodes."""
    suite = two_clusters
    ssh = devcluster["ssh"]
    login = (f'ssh_host = "{ssh["host"]}"\nssh_port = {ssh["port_key"]}\n'
             f'user = "{ssh["user"]}"\nidentity_file = "{ssh["identity_file"]}"\n'
             f'known_hosts = "{ssh["known_hosts"]}"\nmfa = false\nsync = "none"\n'
             f'python = "{sys.executable}"\n')
    # this module's allocations on devcluster (earlier tests) would hold a batch node
    # that hssh's own allocation needs: given back first
    _cancel_jobs_under(suite.parent)
    config = suite / "two_remote.toml"
    config.write_text(f'[clusters.hssh]\n{login}partition = "batch"\n\n'
                      f'[clusters.gbssh]\n{login}partition = "gb200"\n')
    with paired(suite):
        proc = run_pytest(suite, "--trtllm-remote", "--trtllm-scenario=remote_slurm",
                          f"--trtllm-config={config}",
                          "--trtllm-summary-json=two_remote.json", "-k",
                          "test_on_h200 or test_on_gb200", timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "PASSED test_where.py::test_on_h200" in out, out
    assert "PASSED test_where.py::test_on_gb200" in out, out
    h200, gb200 = seen(suite, "h200"), seen(suite, "gb200")
    assert (h200["partition"], gb200["partition"]) == ("batch", "gb200"), (h200, gb200)
    assert max(h200["start"], gb200["start"]) < min(h200["stop"], gb200["stop"]), (h200, gb200)
    summary = json.loads((suite / "two_remote.json").read_text())
    assert sorted(summary["clusters"]) == ["gbssh", "hssh"]
    assert {(b["cluster"], b["scenario"]) for b in summary["batches"]} == {
        ("hssh", "remote_slurm"), ("gbssh", "remote_slurm")}
    assert all(b["job_id"].startswith(f"{b['cluster']}:") for b in summary["batches"])
    # each cluster its own allocation
    assert (suite / "work_dirs" / ".remote-hssh").is_dir()
