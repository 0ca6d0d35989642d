"""OpenSSHShell: the Shell protocol through the user's own ``ssh`` and a live ControlMaster.

For clusters whose MFA only the user can complete (browser device codes, Duo push):
the user starts a ControlMaster once (``ssh -fNM ...``) and every command rides on it.
This shell never starts a master and never answers a prompt (BatchMode=yes)."""

from __future__ import annotations

import shlex
import subprocess
import threading
from collections.abc import Callable, Sequence
from pathlib import PurePosixPath
from typing import IO, Any

from pytest_trtllm_slurm.errors import ConfigError
from pytest_trtllm_slurm.planning.safe_values import control_chars
from pytest_trtllm_slurm.transport.command_log import timed_command
from pytest_trtllm_slurm.transport.shell import CommandResult, WithoutRelay
from pytest_trtllm_slurm.transport.ssh.commands import OneOpFiles, piped_env_command, remote_command
from pytest_trtllm_slurm.transport.ssh.connect import SSHConnectionLost
from pytest_trtllm_slurm.transport.ssh.control_path import (
    LEGACY_CONTROL_PATH,
    default_control_path,
    why_untrusted_socket,
)
from pytest_trtllm_slurm.transport.ssh.target import SSHTarget

_READ = 'if [ -f "$1" ]; then tail -c +"$2" "$1" | head -c "$3"; fi'
_SIZE = 'if [ -f "$1" ]; then wc -c < "$1"; else echo 0; fi'
_SSH_FAILURE = ("Connection closed", "Connection reset", "Broken pipe", "mux_client",
                "Control socket", "ssh: ", "Connection timed out", "kex_exchange")


def ssh_option_path(path: str, *, tokens: bool = False) -> str:
    """A path as the value of ``ssh -o NAME=VALUE``: ssh splits such values at blanks
    (UserKnownHostsFile takes several files) unless quoted, and expands ``%`` tokens.
    ``tokens``: keep ``%`` tokens (a ControlPath such as ``%r@%h:%p``)."""
    if '"' in path or control_chars(path):
        raise ConfigError(f"path {path!r} cannot be passed to ssh -o: it contains '\"' or a "
                          "control character; use another path")
    value = path if tokens else path.replace("%", "%%")
    return f'"{value}"' if any(c.isspace() for c in value) else value


class OpenSSHShell(WithoutRelay, OneOpFiles):
    """Run commands over ``ssh -o BatchMode=yes`` multiplexed on an existing ControlMaster."""

    def __init__(self, target: SSHTarget, *, control_path: str | None = None,
                 ssh_binary: str = "ssh", check: bool = True) -> None:
        self.target = target
        self.name = target.alias
        self.ssh_binary = ssh_binary
        self._control_path = control_path
        if check:
            self.check_master()

    def __repr__(self) -> str:
        where = self._control_path or "ssh config"
        return f"OpenSSHShell({self.target.display}, ControlPath={where})"

    def _base(self, control_path: str | None) -> list[str]:
        t = self.target
        argv = [self.ssh_binary, "-o", "BatchMode=yes", "-o", "ControlMaster=no",
                "-p", str(t.port), "-l", t.user,
                "-o", f"UserKnownHostsFile={ssh_option_path(t.known_hosts)}",
                "-o", f"StrictHostKeyChecking={'accept-new' if t.accept_new_host_key else 'yes'}"]
        if t.identity_file_explicit:
            argv += [arg for path in t.identity_files for arg in ("-i", path)]
        if control_path:
            argv += ["-o", f"ControlPath={ssh_option_path(control_path, tokens=True)}"]
        return argv

    def connect(self) -> None:
        """Surface a problem (no master, an untrusted socket) before any work; opens nothing."""
        self.check_master()

    def close(self) -> None:
        """The master is the user's and stays (nothing of this shell's to close)."""

    def check_master(self) -> None:
        """Find a running master (the ControlPath given, else ssh config's, the private
        default, the legacy one in /tmp) whose socket is ours in folders nobody else can
        write (control_path.py), or explain. A socket that fails that check is never
        connected to: whoever planted it would see every command and forge every answer."""
        if self._control_path:
            candidates: list[str | None] = [self._control_path]
        else:
            candidates = [None, default_control_path(), LEGACY_CONTROL_PATH]
        refused: list[str] = []
        checked: list[str] = []
        for path in candidates:
            concrete = self._expanded(path)
            if not concrete:
                continue
            checked.append(concrete)
            why = why_untrusted_socket(concrete)
            if why is not None:
                if why != "there is no socket":
                    refused.append(f"{concrete}: {why}")
                continue
            argv = [*self._base(concrete), "-O", "check", "--", self.target.alias]
            with timed_command("localhost", argv) as outcome:
                proc = subprocess.run(argv, capture_output=True, text=True, timeout=30,
                                      stdin=subprocess.DEVNULL, check=False)
                outcome.append(proc)
            if proc.returncode == 0:
                self._control_path = concrete
                return
        cp = self._control_path or default_control_path()
        port = f"-p {self.target.port} " if self.target.port != 22 else ""
        folder = shlex.quote(str(PurePosixPath(cp).parent))
        not_used = ("".join(f"\n    not used: {r}" for r in refused)
                    + ("\n(a socket is used only when it is yours, in folders nobody else "
                       "can write)" if refused else ""))
        raise ConfigError(
            f"transport = \"openssh\" in {self.target.where} needs a running OpenSSH "
            f"ControlMaster to {self.target.alias}, and `ssh -O check` finds none (checked: "
            f"{', '.join(checked) or 'your ssh config'}).{not_used}\n"
            "Start one in a terminal (it asks for your login/MFA once):\n"
            f"    mkdir -p -m 700 {folder} && ssh -fNM -o ControlMaster=auto "
            f"-o ControlPath={shlex.quote(cp)} -o ControlPersist=24h "
            f"{port}{self.target.user}@{self.target.alias}\n"
            "then run again. Or use transport = \"paramiko\" (keys, mfa, otp_command).")

    def _expanded(self, control_path: str | None) -> str | None:
        """The socket path ssh would use (as ``ssh -G`` prints it): ``control_path``, or ssh
        config's when None. None: no ControlPath."""
        argv = [*self._base(control_path), "-G", "--", self.target.alias]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL, check=False)
        for line in proc.stdout.splitlines():
            key, _, value = line.partition(" ")
            if key.lower() == "controlpath":
                return None if value.strip().lower() in ("", "none") else value.strip()
        return None

    def _ssh(self, command: str, *, stdin: bytes | None = None, timeout: float | None = 60,
             producer: Callable[[IO[bytes]], Any] | None = None,
             shown: Sequence[str] = ()) -> tuple[int, bytes, bytes, bool]:
        """``shown``: the argv the log names (the remote string holds the env's values)."""
        # "--" before the host: nothing after it is read as an option of ssh
        argv = [*self._base(self._control_path), "--", self.target.alias, command]
        with timed_command(f"ssh {self.name}", shown or ["ssh"]) as outcome:
            rc, out, err, timed_out = _popen(argv, stdin, timeout, producer)
            outcome.append(CommandResult(tuple(argv), rc, "", err.decode(errors="replace"),
                                         timed_out=timed_out))
        return rc, out, err, timed_out

    def run(self, argv: list[str], *, timeout: float | None = 60, input: str | None = None,
            env: dict[str, str] | None = None, cwd: str | None = None,
            retry_on_drop: bool = True) -> CommandResult:
        """Run argv remotely; an ssh failure (255 + ssh's own message) is retried once
        when ``retry_on_drop``, else raises SSHConnectionLost (the command may have run)."""
        data = input.encode() if input is not None else b""
        if env:  # the values through the pipe, not on ssh's command line
            command, ahead = piped_env_command(argv, env, cwd=cwd)
            data = ahead + data
        else:
            command = remote_command(argv, cwd=cwd)
        for attempt in range(2):
            rc, out, err, timed_out = self._ssh(command, stdin=data, timeout=timeout,
                                                shown=argv)
            text = err.decode(errors="replace")
            if rc == 255 and any(m in text for m in _SSH_FAILURE):
                if not retry_on_drop:
                    raise SSHConnectionLost(
                        f"ssh to {self.target.alias} failed while `{shlex.join(argv)}` ran "
                        f"({text.strip().splitlines()[-1] if text.strip() else 'exit 255'}); "
                        "not run again (it may have taken effect)")
                if attempt == 0:
                    continue
            return CommandResult(tuple(argv), rc, out.decode(errors="replace"), text,
                                 timed_out=timed_out)
        raise AssertionError("unreachable")

    def run_stdin_stream(self, argv: list[str], producer: Callable[[IO[bytes]], object], *,
                         timeout: float | None = 600, cwd: str | None = None) -> CommandResult:
        """Run argv with ``producer(stdin)`` streaming binary data into it."""
        rc, out, err, timed_out = self._ssh(remote_command(argv, cwd=cwd), timeout=timeout,
                                            producer=producer, shown=argv)
        return CommandResult(tuple(argv), rc, out.decode(errors="replace"),
                             err.decode(errors="replace"), timed_out=timed_out)

    def _sh(self, script: str, args: Sequence[str]) -> tuple[int, bytes, bytes]:
        sh = ["sh", "-c", script, "sh", *args]
        rc, out, err, timed_out = self._ssh(remote_command(sh), timeout=120, shown=sh)
        if timed_out or rc == 255:
            raise SSHConnectionLost(f"ssh to {self.target.alias} failed: "
                                    f"{err.decode(errors='replace').strip() or 'timed out'}")
        return rc, out, err

    def read_from(self, path: str, offset: int, limit: int = 1 << 20) -> bytes:
        return self._sh(_READ, [path, str(offset + 1), str(limit)])[1]

    def size(self, path: str) -> int:
        out = self._sh(_SIZE, [path])[1].strip()
        return int(out) if out.isdigit() else 0

    def exists(self, path: str) -> bool:
        return self._sh('test -e "$1"', [path])[0] == 0

    def _exec_input(self, argv: list[str], data: bytes, shown: list[str]
                    ) -> tuple[int, str, str, bool]:
        rc, out, err, timed_out = self._ssh(remote_command(argv), stdin=data, timeout=120,
                                            shown=shown)
        return rc, out.decode(errors="replace"), err.decode(errors="replace"), timed_out


def _popen(argv: list[str], stdin: bytes | None, timeout: float | None,
           producer: Callable[[IO[bytes]], Any] | None) -> tuple[int, bytes, bytes, bool]:
    """Run ``argv`` with ``producer`` (else ``stdin``) writing its stdin from a thread."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    write = producer or (lambda fh: fh.write(stdin or b""))
    out, err = bytearray(), bytearray()

    def feed() -> None:
        assert proc.stdin is not None
        try:
            write(proc.stdin)
        except OSError:  # (BrokenPipeError too: the command stopped reading)
            pass
        finally:
            try:
                proc.stdin.close()
            except OSError:
                pass

    def drain(stream: IO[bytes] | None, into: bytearray) -> None:
        if stream is not None:
            for chunk in iter(lambda: stream.read1(1 << 16), b""):  # type: ignore[attr-defined]
                into.extend(chunk)

    threads = [threading.Thread(target=feed, daemon=True),
               threading.Thread(target=drain, args=(proc.stdout, out), daemon=True),
               threading.Thread(target=drain, args=(proc.stderr, err), daemon=True)]
    for thread in threads:
        thread.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        timed_out = True
    for thread in threads:
        thread.join(timeout=30)
    return (124 if timed_out else proc.returncode), bytes(out), bytes(err), timed_out
