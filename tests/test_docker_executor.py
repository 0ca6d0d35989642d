"""local_docker for real: ContainerExecutor + Monitor against a real dockerd and a real podman.

The engines and the image come from tests/containers_fixture.py (own daemon/store, image
built from this interpreter; the plugin is NOT in the image, the executor mounts it). Each
batch is a real worker pytest (``python3 -m pytest -p pytest_trtllm_slurm.node.worker``) in the
container; its reports come back through the mounted work dir, as in a dispatched run.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest
from report_lines import reports_in

from pytest_trtllm_slurm.errors import ConfigError
from pytest_trtllm_slurm.execution.local.docker import ContainerExecutor, default_run_flags
from pytest_trtllm_slurm.execution.monitor import Monitor
from pytest_trtllm_slurm.execution.outcome import JobStatus
from pytest_trtllm_slurm.execution.render.containers import (
    OWNER_LABEL,
    PLUGIN_ROOT,
    client_sensitive,
    engine_run_argv,
    env_file_text,
    in_container_argv,
    job_mounts,
)
from pytest_trtllm_slurm.planning.jobspec import JobSpec
from pytest_trtllm_slurm.planning.models import LocalEnv, Scenario

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "conftest_examples"

SUITE = '''
import os
import pytest

MARKER = "/etc/trtllm-test-image"

def test_runs_in_the_image():
    with open(MARKER) as fh:
        assert fh.read().startswith("trtllm-test-image ")

def test_env_and_cwd():
    assert os.environ["SUITE_VALUE"] == "a b $c 'd'"
    assert os.environ["PYTHONPATH"].split(":")[0] == "{plugin_root}"
    assert os.getcwd() == {rootdir!r}

def test_fails():
    assert 1 + 1 == 3

@pytest.mark.skip(reason="skipped on purpose")
def test_skipped():
    pass

@pytest.mark.parametrize("text", ["a b", "c[d]"])
def test_param(text):
    assert text
'''

HANG = '''
import sys
import time

def test_hangs():
    # stderr: line-buffered (stdout into a pipe is block-buffered in any executor)
    print("Hang detected on purpose", file=sys.stderr, flush=True)
    time.sleep(300)
'''


def worker_spec(rootdir: Path, work: Path, files: list[str], nodeids: list[str], image: str,
                **kw) -> JobSpec:
    """A JobSpec whose command is the worker pytest, as dispatch.worker_command builds it."""
    work.mkdir(parents=True, exist_ok=True)
    ids = work / "nodeids.json"
    ids.write_text(json.dumps(nodeids))
    reports = work / "reports.jsonl"
    command = [sys.executable, "-m", "pytest", "-p", "pytest_trtllm_slurm.node.worker",
               "--trtllm-worker-reports", str(reports), "--trtllm-worker-nodeids", str(ids),
               "--rootdir", str(rootdir), "-c", str(rootdir / "pytest.ini"),
               "-o", f"cache_dir={work / '.pytest_cache'}", "--junitxml", str(work / "junit.xml"),
               "--continue-on-collection-errors", "--capture=tee-sys", *files]
    return JobSpec(scenario=Scenario.LOCAL_DOCKER, name=work.name, job_name=f"t.{work.name}",
                   nodeids=nodeids, nodeids_file=str(ids), command=command, rootdir=str(rootdir),
                   invocation_dir=str(rootdir), container_image=image, work_dir=str(work),
                   log_path=str(work / "job.log"), reports_path=str(reports), **kw)


def run_all(executor, specs, timeout=120.0):
    """Submit every spec, watch them in one Monitor; returns {job name: (final, outcomes)}."""
    monitor = Monitor(["hang detected"], poll_interval=0.1)
    handles = {}
    for spec in specs:
        handle = executor.submit(spec)
        handles[handle.job_id] = spec.name
        monitor.add(handle, executor)
    results: dict[str, tuple] = {name: (None, {}) for name in handles.values()}
    end = time.monotonic() + timeout
    while monitor.active:
        assert time.monotonic() < end, f"jobs still running after {timeout}s"
        for event in monitor.poll():
            name = handles[event.job.handle.job_id]
            final, outcomes = results[name]
            for data in (d for rec in event.records for d in reports_in(rec)):
                if data.get("when") == "call" or data.get("outcome") != "passed":
                    outcomes[data["nodeid"]] = data["outcome"]
            results[name] = (event.final or final, outcomes)
        time.sleep(0.1)
    return results


def write_suite(root: Path, body: str, name: str = "test_suite.py") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "pytest.ini").write_text("[pytest]\n")
    (root / name).write_text(textwrap.dedent(body))
    return root


@pytest.fixture(params=["docker", "podman"])
def engine(request):
    return request.getfixturevalue(f"{request.param}_engine")


def make_executor(engine, **kw) -> ContainerExecutor:
    return ContainerExecutor(engine.name, cli=engine.cli, engine_env=engine.env, **kw)


# --------------------------------------------------------------------------- real engines

def test_batches_run_in_the_image_and_report_back(engine, trtllm_image, tmp_path):
    root = write_suite(tmp_path / "suite", SUITE.format(plugin_root=PLUGIN_ROOT,
                                                          rootdir=str(tmp_path / "suite")))
    ids = ["test_suite.py::test_runs_in_the_image", "test_suite.py::test_env_and_cwd",
           "test_suite.py::test_fails", "test_suite.py::test_skipped",
           "test_suite.py::test_param[a b]", "test_suite.py::test_param[c[d]]"]
    suite = worker_spec(root, tmp_path / "work-suite", ["test_suite.py"], ids, trtllm_image.name,
                        env={"SUITE_VALUE": "a b $c 'd'"})
    cpu_ids = ["test_cpu.py::test_json_round_trip", "test_cpu.py::test_word_count[a b-2]",
               "test_cpu.py::test_word_count[-0]", "test_cpu.py::test_word_count[x  y z-3]",
               "test_single_gpu.py::test_no_device_needed",
               "test_single_gpu.py::test_one_gpu[fp8]"]
    examples = worker_spec(EXAMPLES, tmp_path / "work-examples",
                           ["test_cpu.py", "test_single_gpu.py"], cpu_ids, trtllm_image.name)
    executor = make_executor(engine)
    try:
        t0 = time.monotonic()
        results = run_all(executor, [suite, examples])
        elapsed = time.monotonic() - t0
    finally:
        executor.close()
    final, outcomes = results[suite.name]
    log = Path(suite.log_path).read_text(errors="replace")
    assert final.status is JobStatus.FAILED and final.exit_code == 1, log  # one test fails
    assert outcomes == {
        "test_suite.py::test_runs_in_the_image": "passed",
        "test_suite.py::test_env_and_cwd": "passed",
        "test_suite.py::test_fails": "failed",
        "test_suite.py::test_skipped": "skipped",
        "test_suite.py::test_param[a b]": "passed",
        "test_suite.py::test_param[c[d]]": "passed",
    }, log
    final, outcomes = results[examples.name]
    log = Path(examples.log_path).read_text(errors="replace")
    # no GPU (and no nvidia-smi) in the container: the example's own skip triggers there
    assert final.status is JobStatus.COMPLETED, log
    assert outcomes == dict.fromkeys(cpu_ids[:5], "passed") | {cpu_ids[5]: "skipped"}, log
    assert (tmp_path / "work-examples" / "junit.xml").exists()
    assert executor.containers() == []
    print(f"{engine.name}: two batches in {elapsed:.1f} s")


@pytest.mark.parametrize("how", ["hang", "close"])
def test_hang_and_close_leave_no_container(engine, trtllm_image, tmp_path, how):
    root = write_suite(tmp_path / "suite", HANG)
    spec = worker_spec(root, tmp_path / "work", ["test_suite.py"],
                       ["test_suite.py::test_hangs"], trtllm_image.name)
    executor = make_executor(engine)
    try:
        if how == "hang":
            # the bound only catches a hang that was never noticed (the test sleeps 300 s);
            # a loaded machine's container start and stop may take a minute
            results = run_all(executor, [spec], timeout=150)
            final, _ = results[spec.name]
            assert final.status is JobStatus.HANG_DETECTED
        else:
            handle = executor.submit(spec)
            end = time.monotonic() + 60
            while "Hang detected" not in Path(spec.log_path).read_text(errors="replace"):
                assert time.monotonic() < end, Path(spec.log_path).read_text(errors="replace")
                assert executor.poll([handle])[handle.job_id].status is JobStatus.RUNNING
                time.sleep(0.1)
            assert executor.containers(), "the container should be running now"
            executor.close()
            assert executor.poll([handle])[handle.job_id].status is JobStatus.CANCELLED
        assert executor.containers() == []
    finally:
        executor.close()
    assert engine.containers(label=f"{OWNER_LABEL}={executor.owner}") == []


def test_missing_image_is_a_clear_error(engine, tmp_path):
    executor = make_executor(engine)
    spec = worker_spec(tmp_path, tmp_path / "work", [], [], "localhost/no-such-image:never")
    with pytest.raises(ConfigError, match=r"'localhost/no-such-image:never' is not in .*never "
                                          r"pulled"):
        executor.submit(spec)
    assert not Path(spec.log_path).exists()


def test_orphans_of_a_dead_controller_are_removed(engine, trtllm_image):
    """A container labelled with a controller pid that no longer exists is removed."""
    import socket
    import subprocess

    dead = subprocess.Popen(["true"])
    dead.wait()
    name = f"trtllm-orphan-{os.getpid()}"
    engine.run("run", "-d", "--name", name, "--network=none", "--label",
               f"{OWNER_LABEL}={socket.gethostname()}:{dead.pid}",
               *default_run_flags(engine.name), trtllm_image.name, "sleep", "300")
    executor = make_executor(engine)
    assert name in executor.remove_orphans()
    assert name not in engine.containers()


ENV_SUITE = '''
import os

def test_env_arrives():
    assert os.environ["HTTPS_PROXY"] == "http://alice:pr0xy-pw@proxy.invalid:3128"
    assert os.environ["HF_TOKEN"] == "hf_t0ken-value"
    assert os.environ["SUITE_VALUE"] == "plain"
'''


def test_env_values_reach_the_container_but_not_the_command_line(engine, trtllm_image,
                                                                  tmp_path):
    """A secret name, and a proxy (a name the engine CLI reads itself) with a password:
    both arrive in the container, and neither value is on the client's command line
    (what ``ps`` shows every user)."""
    root = write_suite(tmp_path / "suite", ENV_SUITE)
    env = {"HTTPS_PROXY": "http://alice:pr0xy-pw@proxy.invalid:3128",
           "HF_TOKEN": "hf_t0ken-value", "SUITE_VALUE": "plain"}
    spec = worker_spec(root, tmp_path / "work", ["test_suite.py"],
                       ["test_suite.py::test_env_arrives"], trtllm_image.name, env=env)
    executor = make_executor(engine)
    argvs = []
    spawn = executor._spawn

    def recording_spawn(job, argv, **kw):
        argvs.append(list(argv))
        return spawn(job, argv, **kw)

    executor._spawn = recording_spawn  # type: ignore[method-assign]
    try:
        final, outcomes = run_all(executor, [spec])[spec.name]
    finally:
        executor.close()
    log = Path(spec.log_path).read_text(errors="replace")
    assert final.status is JobStatus.COMPLETED, log
    assert outcomes == {"test_suite.py::test_env_arrives": "passed"}, log
    assert len(argvs) == 1
    for value in ("pr0xy-pw", "hf_t0ken-value"):
        assert not any(value in arg for arg in argvs[0]), argvs[0]
    assert not list((tmp_path / "work").rglob("*env*")), "an env file was left on disk"


# --------------------------------------------------------------------------- pure parts

def _spec(tmp_path, **kw) -> JobSpec:
    base = dict(scenario=Scenario.LOCAL_DOCKER, name="b", job_name="acct.b",
                command=["/opt/py/bin/python3.11", "-m", "pytest", "x.py"],
                rootdir="/repo", invocation_dir="/repo", container_image="nvcr.io/nv/trt:1",
                work_dir="/repo/work_dirs/b_1", log_path="/repo/work_dirs/b_1/job.log",
                reports_path="/repo/work_dirs/b_1/reports.jsonl")
    base.update(kw)
    return JobSpec(**base)


def test_run_argv_mounts_env_gpus(tmp_path):
    spec = _spec(tmp_path, mounts=["/data:/data:ro"], env={"A": "1", "PATH": "/x", "TOKEN": "s"})
    with pytest.raises(ValueError, match="PATH must reach the container through an env file"):
        engine_run_argv("docker", spec, name="n1")  # no value may land on the command line
    argv = engine_run_argv("docker", spec, name="n1", run_flags=["--ipc=host"], gpu_ids=[2, 3],
                           env_file="/dev/fd/7")
    plugin = job_mounts(spec)[-1]
    assert argv[:6] == ["docker", "run", "--rm", "--name", "n1", "--pull=never"]
    assert argv[argv.index("--gpus") + 1] == '"device=2,3"'
    # work dir is inside the repo: mounted once; plugin read-only at PLUGIN_ROOT
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "-v"] == [
        "/repo:/repo", "/data:/data:ro", plugin]
    assert plugin.endswith(f":{PLUGIN_ROOT}/pytest_trtllm_slurm:ro")
    envs = [argv[i + 1] for i, a in enumerate(argv) if a == "-e"]
    assert envs == ["A", "PYTHONPATH", "TOKEN"]  # values via the engine's env
    assert argv[argv.index("--env-file") + 1] == "/dev/fd/7"  # PATH: the CLI reads its own
    assert env_file_text({"PATH": "/x", "HTTPS_PROXY": "http://u:p@h"}) == (
        "HTTPS_PROXY=http://u:p@h\nPATH=/x\n")
    with pytest.raises(ValueError, match="HTTP_PROXY: its value holds a line break"):
        env_file_text({"HTTP_PROXY": "a\nb"})
    assert argv[argv.index("-w") + 1] == "/repo"
    assert argv[-5:] == ["nvcr.io/nv/trt:1", "python3", "-m", "pytest", "x.py"]
    podman = engine_run_argv("podman", spec, name="n1", gpu_ids=[0], all_gpus=True,
                             env_file="/dev/fd/7")
    assert podman[podman.index("--device") + 1] == "nvidia.com/gpu=all"
    assert client_sensitive("DOCKER_HOST") and not client_sensitive("CUDA_VISIBLE_DEVICES")
    assert in_container_argv(["/usr/bin/env", "x"]) == ["/usr/bin/env", "x"]


def test_bad_mount_paths_are_refused(tmp_path):
    with pytest.raises(ValueError, match="contains ':' or ','"):
        job_mounts(_spec(tmp_path, rootdir="/re:po", invocation_dir=None))


def test_default_run_flags_per_engine():
    assert default_run_flags("docker", can_raise_limits=True) == [
        "--ipc=host", "--ulimit", "memlock=-1", "--ulimit", "stack=67108864"]
    no_cap = default_run_flags("podman", can_raise_limits=False)
    assert "memlock=-1" not in no_cap and any(f.startswith("nofile=") for f in no_cap)
    assert not any(f.startswith("nofile=") for f in default_run_flags("docker",
                                                                      can_raise_limits=False))


def test_engine_choice_follows_the_probe_and_can_be_forced():
    assert ContainerExecutor.from_local_env(LocalEnv(container_engine="podman")).engine == "podman"
    forced = ContainerExecutor.from_local_env(LocalEnv(container_engine="podman"), engine="docker")
    assert forced.engine == "docker"
    with pytest.raises(ConfigError, match="neither docker nor podman answers"):
        ContainerExecutor.from_local_env(LocalEnv(notes=["container: docker not found on PATH"]))


def test_rerun_command_is_copy_pasteable(tmp_path):
    spec = _spec(tmp_path, env={"API_TOKEN": "secret", "MODE": "x y"},
                 command=[sys.executable, "-m", "pytest", "-p", "pytest_trtllm_slurm.node.worker",
                          "--trtllm-worker-reports", "/w/r.jsonl", "x.py"],
                 rerun_argv=[sys.executable, "-m", "pytest", "-q"])
    line = ContainerExecutor("docker", run_flags=[]).rerun_command(spec, "x.py::t[a b]")
    assert line.startswith("cd /repo && docker run --rm --name trtllm-rerun-b --pull=never")
    assert "=secret" not in line and "-e API_TOKEN " in line and "'MODE=x y'" in line
    assert line.endswith("nvcr.io/nv/trt:1 python3 -m pytest -q 'x.py::t[a b]'")
