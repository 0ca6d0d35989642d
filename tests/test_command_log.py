"""Every command a Shell runs is logged to the ``pytest_trtllm_slurm`` logger: where, what,
how long, how it ended; secrets masked. Real commands, real sshd (no mocks)."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from pytest_trtllm_slurm.planning.settings import ClusterConfig
from pytest_trtllm_slurm.transport.command_log import masked_argv
from pytest_trtllm_slurm.transport.shell import LocalShell
from pytest_trtllm_slurm.transport.ssh.openssh_shell import OpenSSHShell
from pytest_trtllm_slurm.transport.ssh.paramiko_shell import SSHShell, SSHTarget

LOGGER = "pytest_trtllm_slurm"
LINE = re.compile(r"^(?P<host>.+?): `(?P<cmd>.*)` (?P<end>exit code -?\d+|timed out) "
                  r"in (?P<secs>\d+\.\d{3}) s")


def command_lines(caplog: pytest.LogCaptureFixture) -> list[re.Match[str]]:
    return [m for r in caplog.records if r.name.startswith(LOGGER)
            and (m := LINE.match(r.getMessage()))]


def test_local_command_logged_with_duration_and_exit_code(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    result = LocalShell().run(["sh", "-c", "echo oops >&2; exit 3", "a b"])
    assert result.returncode == 3
    (line,) = command_lines(caplog)
    assert line["host"] == "localhost"
    assert line["cmd"] == "sh -c 'echo oops >&2; exit 3' 'a b'"  # quoted as a shell reads it
    assert line["end"] == "exit code 3"
    assert caplog.records[-1].levelno == logging.DEBUG
    assert caplog.records[-1].getMessage().endswith(": oops")  # why it failed


def test_timeout_and_missing_program_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    LocalShell().run(["sleep", "5"], timeout=0.2)
    LocalShell().run(["no-such-program-xyz"])
    ends = [m["end"] for m in command_lines(caplog)]
    assert ends == ["timed out", "exit code 127"]


def test_nothing_logged_above_debug(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    LocalShell().run(["true"])
    assert not command_lines(caplog)


def test_secrets_in_a_command_are_masked(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    token = "hf_" + "A1b2C3d4E5f6G7h8I9j0K1l2"
    LocalShell().run(["sh", "-c", "true", "HF_TOKEN=plain-secret-1", "PATH_X=/usr/bin",
                      "--export=DB_PASSWORD=plain-secret-2",
                      "http://user:plain-secret-3@proxy:3128", token])
    text = caplog.text
    for secret in ("plain-secret-1", "plain-secret-2", "plain-secret-3", token):
        assert secret not in text
    (line,) = command_lines(caplog)
    assert "HF_TOKEN=***" in line["cmd"] and "PATH_X=/usr/bin" in line["cmd"]
    assert "--export=DB_PASSWORD=***" in line["cmd"]
    assert "http://user:***@proxy:3128" in line["cmd"]


def test_masked_argv_keeps_ordinary_values() -> None:
    argv = ["squeue", "-h", "-j", "12,13", "-o", "%i|%T|%r", "--name=job a"]
    assert masked_argv(argv) == "squeue -h -j 12,13 -o '%i|%T|%r' '--name=job a'"


@pytest.mark.devcluster
def test_ssh_commands_logged(devcluster: dict[str, Any], caplog: pytest.LogCaptureFixture,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "1")
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    ssh = devcluster["ssh"]
    config = ClusterConfig(name="dev", ssh_host=ssh["host"], ssh_port=ssh["port_key"],
                           user=ssh["user"], identity_file=ssh["identity_file"],
                           known_hosts=ssh["known_hosts"])
    shell = SSHShell(SSHTarget.from_cluster(config, ssh_config_path=os.devnull))
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    try:
        shell.run(["sh", "-c", "exit 5"], env={"API_TOKEN": "plain-secret-4"})
        shell.run(["squeue", "-h", "-u", ssh["user"]])
    finally:
        shell.close()
    lines = command_lines(caplog)
    assert [(m["cmd"], m["end"]) for m in lines] == [
        ("sh -c 'exit 5'", "exit code 5"), (f"squeue -h -u {ssh['user']}", "exit code 0")]
    assert {m["host"] for m in lines} == {f"ssh {shell.name}"}
    assert "plain-secret-4" not in caplog.text


@pytest.mark.devcluster
def test_openssh_commands_logged(devcluster: dict[str, Any], caplog: pytest.LogCaptureFixture,
                                 monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Through the user's ControlMaster: the master check, each command (named as the
    caller wrote it: the environment's values stay out) and each file operation."""
    monkeypatch.setenv("CI", "1")
    ssh = devcluster["ssh"]
    control = Path(tempfile.mkdtemp(prefix="cm", dir="/tmp"))  # socket paths stay short
    sock = control / "m.sock"
    try:
        subprocess.run(["ssh", "-fNM", "-o", f"ControlPath={sock}", "-i", ssh["identity_file"],
                        "-o", f"UserKnownHostsFile={ssh['known_hosts']}", "-p",
                        str(ssh["port_key"]), f"{ssh['user']}@{ssh['host']}"], check=True,
                       timeout=30, stdin=subprocess.DEVNULL, capture_output=True)
        config = ClusterConfig(name="dev", ssh_host=ssh["host"], ssh_port=ssh["port_key"],
                               user=ssh["user"], identity_file=ssh["identity_file"],
                               known_hosts=ssh["known_hosts"], transport="openssh")
        caplog.set_level(logging.DEBUG, logger=LOGGER)
        shell = OpenSSHShell(SSHTarget.from_cluster(config, ssh_config_path=os.devnull),
                             control_path=str(sock))
        shell.run(["sh", "-c", "exit 4"], env={"DB_PASSWORD": "plain-secret-5"})
        shell.size(str(tmp_path / "absent"))
    finally:
        subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "x"],
                       capture_output=True, check=False)
        shutil.rmtree(control, ignore_errors=True)
    lines = command_lines(caplog)
    assert lines[0]["host"] == "localhost" and " -O check " in lines[0]["cmd"]
    assert (lines[1]["host"], lines[1]["cmd"], lines[1]["end"]) == (
        f"ssh {shell.name}", "sh -c 'exit 4'", "exit code 4")
    assert lines[2]["cmd"].startswith("sh -c ") and lines[2]["end"] == "exit code 0"
    assert "plain-secret-5" not in caplog.text
