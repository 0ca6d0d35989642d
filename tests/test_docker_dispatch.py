"""local_docker through the plugin: conftest_examples dispatched into a container of the
locally built test image, with docker and with podman (the engines and the image come from
tests/containers_fixture.py); a hang and a Ctrl-C of the pytest process leave no container
of the run behind (found by the owner label the executor puts on every container)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_trtllm_slurm.execution.render.containers import OWNER_LABEL

EXAMPLES = Path(__file__).resolve().parent.parent / "conftest_examples"


def _engine_env(engine, tmp_path: Path | None = None) -> dict[str, str]:
    """The test engines keep their own state; the plugin runs a plain ``docker`` / ``podman``.
    dockerd listens on its own socket: DOCKER_HOST. podman's store is given by flags on the
    fixture's CLI: the same store, runtime and settings through podman's own config files
    (CONTAINERS_STORAGE_CONF, CONTAINERS_CONF), written to ``tmp_path``."""
    env = dict(engine.env)
    if "-H" in engine.cli:
        env["DOCKER_HOST"] = engine.cli[engine.cli.index("-H") + 1]
    if engine.name == "podman":
        assert tmp_path is not None
        flag = {k: engine.cli[engine.cli.index(k) + 1] for k in ("--root", "--runroot",
                                                                 "--runtime") if k in engine.cli}
        driver = engine.run("info", "--format", "{{.Store.GraphDriverName}}").stdout.strip()
        storage = tmp_path / "storage.conf"
        storage.write_text(f'[storage]\ndriver = "{driver}"\ngraphroot = "{flag["--root"]}"\n'
                           f'runroot = "{flag["--runroot"]}"\n')
        conf = tmp_path / "containers.conf"
        text = Path(env["CONTAINERS_CONF"]).read_text() if "CONTAINERS_CONF" in env else ""
        if "--runtime" in flag:
            text = (text if "[engine]" in text else text + "[engine]\n").replace(
                "[engine]\n", f'[engine]\nruntime = "{flag["--runtime"]}"\n', 1)
        conf.write_text(text)
        env.update(CONTAINERS_STORAGE_CONF=str(storage), CONTAINERS_CONF=str(conf))
    return env


def _pytest(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 300
            ) -> tuple[int, str, int]:
    """Run a plugin pytest; (exit code, output, its pid: the executor's owner label)."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out, proc.pid


def _ours(engine, pid: int, running_only: bool = False) -> list[str]:
    """Containers of the plugin run with process id ``pid`` (its executor's owner label)."""
    owner = f"{socket.gethostname()}:{pid}"
    args = ["ps", *([] if running_only else ["-a"]), "--filter",
            f"label={OWNER_LABEL}={owner}", "--format", "{{.Names}}"]
    return engine.run(*args).stdout.split()


def _examples_in_image(image, tmp_path: Path, engine_name: str) -> tuple[Path, list[str]]:
    """conftest_examples plus a test that passes only inside ``image``, and the pytest
    argv dispatching them to local_docker with ``engine_name`` forced."""
    suite = tmp_path / "examples"
    shutil.copytree(EXAMPLES, suite, ignore=shutil.ignore_patterns("work_dirs", "__pycache__"))
    (suite / "test_where.py").write_text(
        "import os\n\ndef test_runs_in_the_image():\n"
        f"    assert os.path.exists({image.marker_path!r})\n"
    )
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "--trtllm-remote",
            "--trtllm-dispatch=all", "--trtllm-scenario=local_docker",
            f"--trtllm-container-engine={engine_name}", f"--trtllm-container-image={image.name}",
            "-k", "cpu or where or no_device"]
    return suite, argv


def _assert_examples_passed_in_image(out: str) -> None:
    assert "PASSED test_where.py::test_runs_in_the_image" in out
    assert "PASSED test_cpu.py::test_json_round_trip" in out
    assert "scenario: local_docker" in out


def test_examples_dispatched_into_docker(docker_engine, trtllm_image, tmp_path: Path) -> None:
    suite, argv = _examples_in_image(trtllm_image, tmp_path, "docker")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRTLLM_SLURM_")}
    env.update(_engine_env(docker_engine))
    proc = subprocess.run(argv, cwd=suite, capture_output=True, text=True, timeout=300, env=env,
                          check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    _assert_examples_passed_in_image(out)
    left = docker_engine.run("ps", "-aq", "--filter", f"label={OWNER_LABEL}", check=False).stdout
    assert not left.strip(), f"containers left behind: {left}"


def test_examples_dispatched_into_podman(podman_engine, trtllm_image, tmp_path: Path) -> None:
    """The same run with the engine forced to podman (its store: see _engine_env)."""
    suite, argv = _examples_in_image(trtllm_image, tmp_path, "podman")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRTLLM_SLURM_")}
    env.update(_engine_env(podman_engine, tmp_path))
    rc, out, pid = _pytest(argv, suite, env)
    assert rc == 0, out
    _assert_examples_passed_in_image(out)
    assert _ours(podman_engine, pid) == [], "containers left behind"


STUCK = """
import time
from pathlib import Path

def test_hangs():
    print("hang detected", flush=True)
    time.sleep(600)

def test_waits_for_ctrl_c():
    Path(__file__).with_name("started").write_text("in the container")
    time.sleep(600)
"""


@pytest.mark.parametrize("engine_name", ["docker", "podman"])
def test_hang_and_ctrl_c_leave_no_container(request, engine_name: str, trtllm_image,
                                            tmp_path: Path) -> None:
    engine = request.getfixturevalue(f"{engine_name}_engine")
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "pytest.ini").write_text("[pytest]\n")
    (suite / "test_stuck.py").write_text(STUCK)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRTLLM_SLURM_")}
    env.update(_engine_env(engine, tmp_path))
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "--trtllm-remote",
            "--trtllm-dispatch=all", "--trtllm-scenario=local_docker",
            f"--trtllm-container-engine={engine_name}",
            f"--trtllm-container-image={trtllm_image.name}"]

    # a hang: the pattern in the log stops the batch, the test fails, the container is gone
    rc, out, pid = _pytest([*argv, "-k", "hangs"], suite, env)
    assert rc == 1 and "FAILED test_stuck.py::test_hangs" in out, out
    assert "hang" in out.lower()
    assert _ours(engine, pid) == [], "the hung batch's container was left behind"

    # Ctrl-C (SIGINT to the pytest process) while the test runs in its container
    flag = suite / "started"
    live = subprocess.Popen([*argv, "-k", "ctrl_c"], cwd=suite, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 120
        while not flag.exists():
            assert time.monotonic() < end and live.poll() is None, live.communicate()[0]
            time.sleep(0.2)
        assert len(_ours(engine, live.pid, running_only=True)) == 1
        live.send_signal(signal.SIGINT)
        out, _ = live.communicate(timeout=120)
    finally:
        if live.poll() is None:
            live.kill()
    assert live.returncode == 2, out  # pytest: interrupted
    assert _ours(engine, live.pid) == [], f"containers left behind after Ctrl-C:\n{out}"


def test_missing_image_is_a_clear_error(docker_engine, tmp_path: Path) -> None:
    suite = tmp_path / "examples"
    shutil.copytree(EXAMPLES, suite, ignore=shutil.ignore_patterns("work_dirs", "__pycache__"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRTLLM_SLURM_")}
    env.update(_engine_env(docker_engine))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--trtllm-remote",
         "--trtllm-dispatch=all", "--trtllm-scenario=local_docker",
         "--trtllm-container-engine=docker", "--trtllm-container-image=nosuch/image:1",
         "-k", "cpu"],
        cwd=suite, capture_output=True, text=True, timeout=120, env=env, check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 4, out
    assert "nosuch/image:1" in out and "Traceback" not in out
