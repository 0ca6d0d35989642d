"""Containers inside Slurm jobs, through the REAL srun of the dev cluster.

pyxis/enroot cannot be installed here, so the dev cluster loads a SPANK test double
(tests/cluster/spank/pyxis_double.c) that registers pyxis' option names: the real srun
parses ``--container-image/-name/-mounts/-workdir/-writable/-env`` and the real slurmstepd
runs each task in the image's rootfs (own mount namespace, bind mounts, chroot). Every
import appends a line to the double's import log, so "no second import" is asserted on a
count, never on time. The image is the suite's local test image (tests/containers_fixture.py).

Also: a task wrapped in ``docker run`` (container_runtime=docker) inside a Slurm step, and
a cancelled step leaving no container behind.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from devcluster import run
from report_lines import reports_in

from pytest_trtllm_slurm.execution.render.containers import (
    PLUGIN_ROOT,
    WRAPPER_SCRIPT,
    container_env,
    container_name_for,
    in_container_argv,
    job_mounts,
    pyxis_args,
    pyxis_setup_argvs,
    wrap_in_container,
)
from pytest_trtllm_slurm.planning.jobspec import JobSpec
from pytest_trtllm_slurm.planning.models import Scenario

INSTALL = "echo installed-once > /opt/installed-by-setup"

SUITE = '''
import os
from pathlib import Path

def test_marker_and_installed_file():
    assert Path("/etc/trtllm-test-image").read_text().startswith("trtllm-test-image ")
    # written by the --container-writable install step into THIS named container
    assert Path("/opt/installed-by-setup").read_text() == "installed-once\\n"

def test_mounts_and_workdir():
    assert Path("/data/hello.txt").read_text() == "hello from the host\\n"
    assert os.getcwd() == {rootdir!r}
    assert os.environ["PYTHONPATH"].split(":")[0] == "{plugin_root}"
    assert os.environ["BATCH_VALUE"] == "x y"

def test_rootfs_is_read_only():
    try:
        open("/should-not-exist", "w")
    except OSError as exc:
        assert exc.errno == 30  # EROFS: no --container-writable on this step
    else:
        raise AssertionError("the container rootfs is writable")
'''


def pyxis_key(image: str) -> str:
    """The double's image-store name of an image URI (same rule as image_rootfs() in C)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", image.removeprefix("docker://"))


@pytest.fixture(scope="module")
def pyxis(devcluster, trtllm_image):
    """The double's paths, with the test image (and an alias of it) in its image store."""
    info = devcluster.get("pyxis_double")
    if not info:
        pytest.fail("tests/cluster/up did not describe a pyxis_double (is up out of date?)")
    if info["unavailable"]:
        pytest.fail(f"the pyxis test double could not be built: {info['unavailable']}")
    images = Path(info["images_dir"])
    alias = f"{trtllm_image.name}-changed"  # "a changed image": another name, same content
    for name in (trtllm_image.name, alias):
        link = images / pyxis_key(name)
        if not (link.is_symlink() and os.readlink(link) == str(trtllm_image.rootfs)):
            tmp = images / f".{link.name}.{os.getpid()}"
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(trtllm_image.rootfs)
            os.replace(tmp, link)
    return {**info, "image": trtllm_image.name, "alias": alias}


def imports(info, job_id, name=None) -> list[str]:
    """Import-log lines of one job (and container name)."""
    try:
        lines = Path(info["import_log"]).read_text().splitlines()
    except FileNotFoundError:
        return []
    return [line for line in lines if f" job={job_id} " in line
            and (name is None or f" name={name} " in line)]


@pytest.fixture(scope="module")
def allocation(devcluster):
    """A 2-node persistent allocation (salloc --no-shell), cancelled at the end."""
    name = f"pyxis-double-{os.getpid()}"
    r = run(["salloc", "--no-shell", "-N2", "-p", "gb200,batch", "-t", "10", "-J", name,
             "--immediate=120"], timeout=180)
    m = re.search(r"Granted job allocation (\d+)", r.stderr + r.stdout)
    assert m, r.stderr
    job = m.group(1)
    yield job
    run(["scancel", job], check=False)


def worker_spec(tmp_path: Path, image: str) -> JobSpec:
    root = tmp_path / "suite"
    work = tmp_path / "work"
    data = tmp_path / "data"
    for d in (root, work, data):
        d.mkdir(parents=True, exist_ok=True)
    (data / "hello.txt").write_text("hello from the host\n")
    (root / "pytest.ini").write_text("[pytest]\n")
    (root / "test_in_pyxis.py").write_text(textwrap.dedent(SUITE.format(
        rootdir=str(root), plugin_root=PLUGIN_ROOT)))
    ids = work / "nodeids.json"
    nodeids = ["test_in_pyxis.py::test_marker_and_installed_file",
               "test_in_pyxis.py::test_mounts_and_workdir",
               "test_in_pyxis.py::test_rootfs_is_read_only"]
    ids.write_text(json.dumps(nodeids))
    reports = work / "reports.jsonl"
    command = [sys.executable, "-m", "pytest", "-p", "pytest_trtllm_slurm.node.worker",
               "--trtllm-worker-reports", str(reports), "--trtllm-worker-nodeids", str(ids),
               "--rootdir", str(root), "-c", str(root / "pytest.ini"),
               "-o", f"cache_dir={work / '.pytest_cache'}", "--capture=tee-sys",
               "test_in_pyxis.py"]
    return JobSpec(scenario=Scenario.LOCAL_SLURM, name="pyxis", job_name="t.pyxis",
                   nodeids=nodeids, nodeids_file=str(ids), command=command, rootdir=str(root),
                   invocation_dir=str(root), container_image=image, work_dir=str(work),
                   log_path=str(work / "job.log"), reports_path=str(reports),
                   mounts=[f"{data}:/data:ro"], env={"BATCH_VALUE": "x y"})


def outcomes(spec: JobSpec) -> dict[str, str]:
    out = {}
    for line in Path(spec.reports_path).read_text().splitlines():
        for data in reports_in(json.loads(line)):
            if data.get("when") == "call" or data.get("outcome") != "passed":
                out[data["nodeid"]] = data["outcome"]
    return out


def test_persistent_allocation_imports_once_and_runs_batches(pyxis, allocation, tmp_path):
    job = allocation
    image = pyxis["image"]
    spec = worker_spec(tmp_path, image)
    name = container_name_for(image, salt=INSTALL)
    mounts = job_mounts(spec)

    # seed Step 0E: import on every node, warm the mounts, install once (writable)
    t0 = time.monotonic()
    for argv in pyxis_setup_argvs(job, 2, image, name, mounts, install_command=INSTALL):
        run(argv, timeout=120)
    setup_s = time.monotonic() - t0
    assert len(imports(pyxis, job, name)) == 2  # once per node
    assert {re.search(r"node=(\S+)", line).group(1) for line in imports(pyxis, job)} == set(
        run(["scontrol", "show", "hostnames",
             run(["squeue", "-h", "-j", job, "-o", "%N"]).stdout.strip()]).stdout.split())

    env = {**os.environ, **container_env(spec)}
    for attempt in (1, 2):  # two runs in the same allocation: the second imports nothing
        Path(spec.reports_path).unlink(missing_ok=True)
        argv = ["srun", f"--jobid={job}", "-N1", "--ntasks=1", "--overlap",
                *pyxis_args(spec, name), *in_container_argv(spec.command)]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env,
                           cwd=spec.rootdir, stdin=subprocess.DEVNULL)
        assert r.returncode == 0, f"attempt {attempt}:\n{r.stdout}\n{r.stderr}"
        assert outcomes(spec) == dict.fromkeys(spec.nodeids, "passed"), r.stdout
        assert len(imports(pyxis, job, name)) == 2, f"attempt {attempt} imported again"

    # a changed image means a new container name, hence one new import (here: one node)
    new_name = container_name_for(pyxis["alias"], salt=INSTALL)
    assert new_name != name
    run(["srun", f"--jobid={job}", "-N1", "--overlap", f"--container-image={pyxis['alias']}",
         f"--container-name={new_name}", "true"], timeout=120)
    assert len(imports(pyxis, job, new_name)) == 1
    assert len(imports(pyxis, job)) == 3
    print(f"setup steps (2 imports, warm, install) {setup_s:.1f} s")


def test_cancelled_step_leaves_no_step_or_process(pyxis, allocation, tmp_path):
    job = allocation
    name = container_name_for(pyxis["image"], salt="cancel")
    flag = tmp_path / "started"
    step_name = f"cancel-me-{os.getpid()}"
    argv = ["srun", f"--jobid={job}", "-N1", "--overlap", "-J", step_name,
            f"--container-image={pyxis['image']}", f"--container-name={name}",
            f"--container-mounts={tmp_path}:{tmp_path}",
            "sh", "-c", f"touch {flag}; exec sleep 313"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 60
        while not flag.exists():
            assert time.monotonic() < end and proc.poll() is None, "the step did not start"
            time.sleep(0.1)
        steps = run(["squeue", "-h", "-s", "-j", job, "-o", "%i %j"]).stdout.split("\n")
        step = next(s.split()[0] for s in steps if s.split()[1:] == [step_name])
        run(["scancel", step])
        proc.wait(timeout=30)
        end = time.monotonic() + 30
        while step in run(["squeue", "-h", "-s", "-j", job, "-o", "%i"]).stdout.split():
            assert time.monotonic() < end, f"step {step} still listed"
            time.sleep(0.2)
        assert "sleep 313" not in run(["ps", "-eo", "args"]).stdout.splitlines()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_docker_runtime_inside_a_slurm_step(devcluster, docker_engine, trtllm_image, tmp_path):
    """container_runtime=docker: the task runs in `docker run`; scancel removes the container."""
    show = 'cat /etc/trtllm-test-image /host/in.txt; echo "$STEP_VALUE"'
    argv = wrap_in_container(["sh", "-c", show],
                             "docker", trtllm_image.name, name_prefix="trtllm-slurm-test",
                             cli=docker_engine.cli, mounts=[f"{tmp_path}:/host:ro"],
                             env_names=["STEP_VALUE"], run_flags=["--ipc=host"])
    (tmp_path / "in.txt").write_text("from the host\n")
    r = run(["srun", "-N1", "-p", "gb200,batch", "-t", "2", "-J", "docker-wrap",
             "--export=ALL,STEP_VALUE=from the step", *argv], timeout=120)
    assert r.stdout.splitlines() == [trtllm_image.marker_text, "from the host",
                                     "from the step"], r.stderr

    sleeper = wrap_in_container(["sleep", "300"], "docker", trtllm_image.name,
                                name_prefix="trtllm-slurm-cancel", cli=docker_engine.cli)
    proc = subprocess.Popen(["srun", "-N1", "-p", "gb200,batch", "-t", "2", "-J", "docker-cancel",
                             *sleeper],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True)
    try:
        end = time.monotonic() + 60
        while not [n for n in docker_engine.containers() if n.startswith("trtllm-slurm-cancel-")]:
            assert time.monotonic() < end and proc.poll() is None, proc.stderr.read()
            time.sleep(0.2)
        job = next(line.split()[0] for line in run(["squeue", "-h", "-o", "%i %j"]).stdout
                   .splitlines() if line.split()[1:] == ["docker-cancel"])
        run(["scancel", job])
        proc.wait(timeout=30)
        end = time.monotonic() + 20
        while [n for n in docker_engine.containers() if n.startswith("trtllm-slurm-cancel-")]:
            assert time.monotonic() < end, "the container outlived its cancelled step"
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.kill()


# --------------------------------------------------------------------------- pure rendering

def _spec(**kw) -> JobSpec:
    base = dict(scenario=Scenario.LOCAL_SLURM, name="b", job_name="a.b", rootdir="/repo",
                invocation_dir="/repo/tests", container_image="nvcr.io/nvidia/pytorch:25.01",
                work_dir="/scratch/w", log_path="/scratch/w/job.log",
                reports_path="/scratch/w/r.jsonl", command=["/x/bin/python", "-m", "pytest"],
                mounts=["/models:/models:ro"], env={"HF_HOME": "/h"})
    base.update(kw)
    return JobSpec(**base)


def test_pyxis_args_render_every_flag():
    spec = _spec()
    args = pyxis_args(spec, "acct-pytorch_25.01-abc", writable=True)
    plugin = job_mounts(spec)[-1]
    assert args == [
        "--container-image=nvcr.io#nvidia/pytorch:25.01",
        "--container-name=acct-pytorch_25.01-abc",
        "--container-mounts=/repo:/repo,/scratch/w:/scratch/w,/models:/models:ro," + plugin,
        "--container-workdir=/repo/tests",
        "--container-writable",
        "--container-env=HF_HOME,PYTHONPATH",
    ]
    assert pyxis_args(spec, "n", mounts=[], workdir="/w", env_names=[]) == [
        "--container-image=nvcr.io#nvidia/pytorch:25.01", "--container-name=n",
        "--container-workdir=/w"]


def test_container_name_follows_the_image():
    a = container_name_for("nvcr.io/nvidia/pytorch:25.01", account="acct")
    assert a == container_name_for("nvcr.io#nvidia/pytorch:25.01", account="acct")
    assert a.startswith("acct-pytorch_25.01-") and re.fullmatch(r"[A-Za-z0-9_.-]+", a)
    assert a != container_name_for("nvcr.io/nvidia/pytorch:25.02", account="acct")
    assert a != container_name_for("nvcr.io/nvidia/pytorch:25.01", account="acct", salt="pip")


def test_setup_steps_follow_the_seed():
    steps = pyxis_setup_argvs("77", 2, "nvcr.io/nv/img:1", "c1", ["/a:/b", "/m:/m:ro"],
                              install_command="pip install -e .", workdir="/repo")
    base = ["srun", "--jobid=77", "-N", "2", "--ntasks-per-node=1", "--overlap"]
    assert steps[0] == base + ["--container-image=nvcr.io#nv/img:1", "--container-name=c1",
                               "true"]
    assert steps[1][:8] == base + ["--container-name=c1", "--container-mounts=/a:/b,/m:/m:ro"]
    assert steps[1][-2:] == ["/b", "/m"]
    assert steps[2] == base + ["--container-name=c1", "--container-writable",
                               "--container-mounts=/a:/b,/m:/m:ro", "--container-workdir=/repo",
                               "sh", "-c", "pip install -e ."]


def test_wrap_in_container_argv():
    argv = wrap_in_container(["python3", "-m", "pytest", "t.py::x[a b]"], "podman", "img:1",
                             cli=["podman", "--root", "/r"], mounts=["/w:/w"],
                             env_names=["A"], gpus=True, workdir="/w")
    assert argv[:3] == ["bash", "-c", WRAPPER_SCRIPT]
    assert argv[3:8] == ["trtllm-container", "trtllm", "3", "podman", "gpus"]
    assert argv[8:] == ["podman", "--root", "/r", "--rm", "--pull=never", "--network=host",
                        "-v", "/w:/w", "-w", "/w", "-e", "A", "img:1",
                        "python3", "-m", "pytest", "t.py::x[a b]"]
    # the script in a file (the Slurm executor writes it to the batch's work dir)
    assert wrap_in_container(["true"], "docker", "i", script="/w/c.sh")[:6] == [
        "bash", "/w/c.sh", "trtllm", "1", "docker", "none"]
    with pytest.raises(ValueError):
        wrap_in_container(["x"], "docker", "i", env_names=["BAD-NAME"])
