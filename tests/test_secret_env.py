"""TRTLLM_SLURM_OTP is read once and passed on to nothing: not to the tests, not to local
workers, not to their children (srun and sbatch would export the same environment)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

CODE = "731904"
DISPATCH = ["--trtllm-remote", "--trtllm-dispatch=all", "--trtllm-scenario=local_direct"]

SUITE = '''
import json, os, subprocess, sys
from pathlib import Path

def test_sees_no_code(pytestconfig):
    child = subprocess.run([sys.executable, "-c",
                            "import os; print(os.environ.get('TRTLLM_SLURM_OTP'))"],
                           capture_output=True, text=True, check=True).stdout.strip()
    from pytest_trtllm_slurm.controller.options import held_code
    seen = {"test": os.environ.get("TRTLLM_SLURM_OTP"), "child": child,
            "held": held_code(pytestconfig).current(), "pid": os.getpid()}
    with open(os.environ["SEEN_FILE"], "a") as fh:
        fh.write(json.dumps(seen) + "\\n")
'''


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    suite = tmp_path / "suite"
    suite.mkdir(exist_ok=True)
    (suite / "test_otp.py").write_text(SUITE)
    seen = tmp_path / f"seen-{len(list(tmp_path.glob('seen-*')))}.jsonl"
    env = {**os.environ, "TRTLLM_SLURM_OTP": CODE, "SEEN_FILE": str(seen)}
    env.pop("PYTEST_ADDOPTS", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
                          cwd=suite, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    lines = seen.read_text().splitlines() if seen.exists() else []
    return proc, [json.loads(line) for line in lines]


def test_dispatched_worker_and_its_children_do_not_inherit_the_code(tmp_path: Path) -> None:
    proc, seen = _run(tmp_path, *DISPATCH)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(seen) == 1
    assert seen[0]["test"] is None and seen[0]["child"] == "None"
    assert CODE not in json.dumps(seen)


def test_plain_run_takes_the_code_out_of_the_environment(tmp_path: Path) -> None:
    proc, seen = _run(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert seen[0]["test"] is None and seen[0]["child"] == "None"
    assert seen[0]["held"] == CODE  # the controller still has it for its own SSH logins


def test_xdist_workers_get_the_code_without_the_environment(tmp_path: Path) -> None:
    proc, seen = _run(tmp_path, "-n", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert seen[0]["test"] is None and seen[0]["child"] == "None"
    assert seen[0]["held"] == CODE  # a worker dispatching over SSH can still log in


def test_a_session_request_holds_no_secret_even_when_no_agent_reads_it(
        tmp_path: Path, monkeypatch) -> None:
    """The local warm start's request (left on disk when its agent is dead) carries the
    controller's environment without its secrets; the agent it goes to is the one that
    was started with them (its folder name depends on them)."""
    from pytest_trtllm_slurm.execution.slurm.warm_pool import env_for_session, send_session
    from pytest_trtllm_slurm.transport.shell import LocalShell

    monkeypatch.setenv("HF_TOKEN", "hf_secretvalue0123456789abcdef")
    monkeypatch.setenv("HTTPS_PROXY", "http://alice:pr0xypass@proxy:3128")
    monkeypatch.setenv("PLAIN_SETTING", "visible")
    # a marker that copies the controller's token, and values of a marker's own: the
    # agent is started with them (its folder name depends on them), none is written
    batch = {"PYTHONUNBUFFERED": "1", "HF_TOKEN": "hf_secretvalue0123456789abcdef",
             "MARKER_ONLY_TOKEN": "given-in-a-marker", "MARKER_SETTING": "plain-marker"}
    env = env_for_session(batch, local=True)
    assert "MARKER_ONLY_TOKEN" not in env and "MARKER_SETTING" not in env
    assert env["PYTHONUNBUFFERED"] == "1"  # on the allow-list
    sdir = send_session(LocalShell(), str(tmp_path / "agent"), "s1", ["python"],
                        cwd=str(tmp_path), env=env)
    request = tmp_path / "agent" / "inbox" / "s1.json"
    text = request.read_text()
    assert "hf_secretvalue" not in text and "given-in-a-marker" not in text
    assert "plain-marker" not in text and "pr0xypass" not in text
    assert json.loads(text)["env"]["PLAIN_SETTING"] == "visible"
    assert oct(request.stat().st_mode & 0o777) == "0o600"
    assert Path(sdir).is_dir()
    from pytest_trtllm_slurm.execution.slurm.warm_pool import secrets_key

    key = secrets_key({}, local=True)
    monkeypatch.setenv("HF_TOKEN", "hf_anothervalue0123456789abcdef")
    assert key and secrets_key({}, local=True) != key  # another token: another agent
    assert secrets_key({}, local=False) == ""  # remote agents get the login's environment
    # the batch's values that are not written are held by the agent: they pick it too
    remote = secrets_key(batch, local=False)
    assert remote and remote != secrets_key({**batch, "MARKER_SETTING": "other"}, local=False)
    assert remote == secrets_key({**batch, "PYTHONUNBUFFERED": "0"}, local=False)
