"""container_runtime = "docker" / "podman" through the plugin on the REAL dev cluster: each
batch's Slurm task is wrapped in a container run of the image (``containers.wrap_in_container``).

The engines are the suite's own (tests/containers_fixture.py). The executor runs the plain
``docker`` / ``podman`` of the node; the dev cluster's GPUs are fake and the test engines have
no GPU support, so the ``docker`` / ``podman`` on PATH is a shim standing in for an engine with
the NVIDIA container toolkit: it logs and drops the GPU flags (``--gpus X``, ``--device
nvidia.com/gpu=N``) and runs the real CLI with the rest. dockerd is reached through DOCKER_HOST
in the controller's environment, which srun passes on to the task; podman's store through the
fixture's flags in the shim (tests/test_docker_dispatch.py::_engine_env is the config-file route
to the same store; tests/containers_fixture.py::ensure_podman says why both are as fast).

One run per mode (one-shot sbatch jobs; steps of a persistent allocation, with warm workers,
the default, and without): a 1-GPU test sees the image's marker file, CUDA_VISIBLE_DEVICES
(renumbered from 0), its env and workdir; the engine was given exactly the step's GPU; a hang
is stopped and leaves no container behind; the reported re-run line of a failed test, pasted
into bash, runs the test again in the image.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from devcluster import run as sh
from test_docker_dispatch import _engine_env

from pytest_trtllm_slurm.execution.render.containers import PLUGIN_ROOT
from pytest_trtllm_slurm.execution.slurm.executor import SlurmExecutor, SlurmSettings
from pytest_trtllm_slurm.planning.jobspec import JobSpec
from pytest_trtllm_slurm.planning.models import Launch, Scenario
from pytest_trtllm_slurm.transport.shell import LocalShell

SUITE = '''
import os
import time
from pathlib import Path

import pytest

MARKER = {marker!r}


@pytest.mark.skip_less_device(1)
@pytest.mark.trtllm_slurm(env={{"BATCH_VALUE": "x y",
                                "HTTPS_PROXY": "http://alice:pr0xy-pw@proxy.invalid:3128"}})
def test_in_image():
    assert Path(MARKER).read_text().startswith("trtllm-test-image ")
    assert os.environ.get("CUDA_VISIBLE_DEVICES") == "0"
    assert os.environ["BATCH_VALUE"] == "x y"
    assert os.environ["HTTPS_PROXY"] == "http://alice:pr0xy-pw@proxy.invalid:3128"
    assert os.environ["PYTHONPATH"].split(":")[0] == "/opt/trtllm-slurm"
    assert os.getcwd() == {suite!r}


@pytest.mark.trtllm_slurm(env={{"RERUN_ME": "yes"}})
def test_fails_in_image():
    assert Path(MARKER).exists() and os.environ.get("RERUN_ME") == "yes"
    assert False, "failed in the image on purpose"


def test_hangs():
    print("hang detected", flush=True)
    time.sleep(600)
'''

SHIM = '''#!/bin/bash
# TEST SHIM standing in for a {engine} whose runtime has the NVIDIA container toolkit: the
# GPU flags are logged to {log} and dropped (the test engine has no GPU support), the rest
# goes to the real CLI.
args=()
while [ $# -gt 0 ]; do
  if [ "$1" = --gpus ]; then echo "gpus $2" >> {log}; shift 2; continue; fi
  if [ "$1" = --device ] && [ "${{2#nvidia.com/gpu=}}" != "$2" ]; then
    echo "device $2" >> {log}; shift 2; continue
  fi
  args+=("$1"); shift
done
exec {real} "${{args[@]}}"
'''

NAME = re.compile(r"^trtllm-.*-\d+\.\d+\.\d+$")  # the wrapper's <prefix>-<job>.<step>.<task>


@pytest.mark.parametrize("engine_name,mode", [
    ("docker", "--trtllm-one-shot"),
    ("docker", "--trtllm-no-warm-workers"),
    ("docker", "--trtllm-warm-workers"),  # the default: container batches as granted steps
    ("podman", "--trtllm-no-warm-workers"),
])
def test_batches_run_wrapped_in_containers(request, devcluster, trtllm_image, engine_name: str,
                                           mode: str, tmp_path: Path) -> None:
    engine = request.getfixturevalue(f"{engine_name}_engine")
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "pytest.ini").write_text(
        "[pytest]\nmarkers =\n    skip_less_device(n): needs n GPUs\n")
    (suite / "trtllm-slurm.toml").write_text(
        f'[clusters.devcluster]\ncontainer_runtime = "{engine_name}"\n')
    (suite / "test_rt.py").write_text(SUITE.format(marker=trtllm_image.marker_path,
                                                   suite=str(suite)))
    shims = tmp_path / "bin"
    shims.mkdir()
    gpu_log = tmp_path / "gpu-flags.log"
    shim = shims / engine_name
    real = engine.cli[0] if engine_name == "docker" else shlex.join(engine.cli)
    shim.write_text(SHIM.format(engine=engine_name, log=gpu_log, real=real))
    shim.chmod(0o755)

    env = {k: v for k, v in os.environ.items() if not k.startswith("TRTLLM_SLURM_")}
    env.update(_engine_env(engine) if engine_name == "docker" else engine.env)
    env["PATH"] = f"{shims}:{env['PATH']}"
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "--trtllm-remote",
            "--trtllm-scenario=local_slurm", "--slurm-partition=batch", mode,
            f"--trtllm-container-image={trtllm_image.name}"]
    state_file = suite / "work_dirs" / ".slurm_alloc.json"
    before = set(engine.containers())
    seen: set[str] = set()
    proc = subprocess.Popen(argv, cwd=suite, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 300
        while proc.poll() is None:  # the containers of this run, seen while they run
            assert time.monotonic() < end, "the run did not end within 300 s"
            seen |= {n for n in engine.containers() if NAME.match(n)} - before
            time.sleep(0.3)
        out = proc.stdout.read() if proc.stdout else ""
        assert proc.returncode == 1, out
        assert "PASSED test_rt.py::test_in_image" in out, out
        assert "FAILED test_rt.py::test_fails_in_image" in out, out
        assert "FAILED test_rt.py::test_hangs" in out and "hang" in out.lower(), out
        assert seen, f"no container of the run was seen:\n{out}"
        end = time.monotonic() + 30
        while left := seen & set(engine.containers()):
            assert time.monotonic() < end, f"containers left behind: {left}\n{out}"
            time.sleep(0.3)
        # the GPU batch's engine got exactly its step's GPU (one id), the others none
        flags = gpu_log.read_text().splitlines()
        want = r'gpus "device=\d"' if engine_name == "docker" else r"device nvidia.com/gpu=\d"
        assert len(flags) == 1 and re.fullmatch(want, flags[0]), flags

        # the re-run line of the failed test: the same container run of a plain pytest
        rerun = next(line.split("re-run:", 1)[1].strip() for line in out.splitlines()
                     if "re-run:" in line and "test_fails_in_image" in line)
        assert f" {engine_name} run " not in rerun  # the CLI and run args are argv elements
        # a marker's env value is never printed: the line names it (-e RERUN_ME) and
        # takes it from the shell that runs the line, as a user sets it
        assert "container_run.sh" in rerun and "-e RERUN_ME" in rerun, rerun
        assert "RERUN_ME=" not in rerun and "***" not in rerun, rerun
        env = {**env, "RERUN_ME": "yes"}
        if mode == "--trtllm-one-shot":  # sbatch --wrap: wait for it, its log in the suite
            assert " sbatch " in rerun, rerun
            job = subprocess.run(["bash", "-c", rerun.replace(" sbatch ", " sbatch --wait "
                                                              "--parsable -o rerun.out ", 1)],
                                 cwd=suite, env=env, capture_output=True, text=True, timeout=180)
            again = (suite / "rerun.out").read_text() if (suite / "rerun.out").exists() else ""
        else:  # srun --jobid=<the allocation>
            job = subprocess.run(["bash", "-c", rerun], cwd=tmp_path, env=env,
                                 capture_output=True, text=True, timeout=180)
            again = job.stdout + job.stderr
        assert job.returncode != 0, again
        assert "failed in the image on purpose" in again, f"{rerun}\n{job.stderr}\n{again}"
        assert "1 failed" in again, again
    finally:
        if proc.poll() is None:
            proc.kill()
        if state_file.exists():
            sh(["scancel", json.loads(state_file.read_text())["job_id"]], check=False)
        for name in seen & set(engine.containers()):
            engine.run("rm", "-f", name, check=False)


# --------------------------------------------------------------------------- pure rendering

def test_wrapped_batch_and_its_rerun_line_render(tmp_path: Path) -> None:
    """podman runtime, an MPI batch: the launcher prefix runs inside the container with the
    image's python; env names go as -e NAME (exported by the launcher), those the engine
    CLI reads itself are exported as TRTLLM_SLURM_CENV_<NAME> for the wrapper's --env-file
    (no value on any command line); the re-run line sets the exported values that may be
    shown (the allow-list of ``masking``), never secret ones (by name or by value)."""
    spec = JobSpec(
        scenario=Scenario.LOCAL_SLURM, name="b", job_name="acct.b", rootdir="/repo",
        invocation_dir="/repo", work_dir=str(tmp_path / "w"), log_path=str(tmp_path / "l"),
        reports_path=str(tmp_path / "r"), container_image="img:1", launch=Launch.MPI,
        node_count=1, total_devices=2, devices_per_node=2,
        command=["/host/venv/bin/python", "-m", "pytest", "-p", "w"],
        rerun_argv=["/host/venv/bin/python", "-m", "pytest"],
        env={"HF_TOKEN": "s3cret", "HOME": "/h", "A": "x y",
             "HTTPS_PROXY": "http://u:pr0xy-pw@proxy:3128"})
    ex = SlurmExecutor(LocalShell(), SlurmSettings(persistent=False, container_runtime="podman", launcher_prefix=("trtllm-llmapi-launch",), container_run_flags=("--ipc=host",)))
    env, argv = ex.launch.wrapped(spec, spec.command, "/w/container_run.sh")
    assert env == {"HF_TOKEN": "s3cret", "A": "x y", "PYTHONPATH": PLUGIN_ROOT,
                   "TRTLLM_SLURM_CENV_HOME": "/h",
                   "TRTLLM_SLURM_CENV_HTTPS_PROXY": "http://u:pr0xy-pw@proxy:3128"}
    assert argv[:6] == ["bash", "/w/container_run.sh", "trtllm-b", "1", "podman", "gpus"]
    run = argv[6:]
    assert run[:5] == ["podman", "--rm", "--pull=never", "--label", "trtllm-slurm.job=acct.b"]
    assert not any("/h" == a.split("=")[-1] or "pr0xy-pw" in a for a in argv), argv
    assert ["-e", "A", "-e", "HF_TOKEN", "-e", "PYTHONPATH", "img:1"] == run[
        run.index("img:1") - 6:run.index("img:1") + 1]
    assert run[run.index("img:1") + 1:] == ["trtllm-llmapi-launch", "python3", "-m", "pytest",
                                             "-p", "w"]
    assert ex.launch.options(spec).launcher_prefix == ()  # not again outside the container

    line = ex.rerun_command(spec, "t.py::x")
    # A is not on the allow-list of shown values: left to the shell, as HF_TOKEN (-e A)
    assert line.startswith("PYTHONPATH=/opt/trtllm-slurm TRTLLM_SLURM_CENV_HOME=/h sbatch ")
    assert "s3cret" not in line and "HF_TOKEN" in line and "pr0xy-pw" not in line
    wrapped = shlex.split(shlex.split(line)[-1])  # the --wrap text
    assert wrapped[0] == "srun" and wrapped[wrapped.index("bash") + 1] == "-c"
    assert wrapped[-6:] == ["img:1", "trtllm-llmapi-launch", "python3", "-m", "pytest", "t.py::x"]
