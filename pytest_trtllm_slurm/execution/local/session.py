"""A warm local session for local_direct: a pytest started beside the suite's import with the
run's arguments (``node/session_server``) collects once and forks each batch sent to it.
A fresh worker would import and collect the suite again after the controller did; a big
suite's collection is then paid once, beside the controller's, instead of after it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from pytest_trtllm_slurm.node.files import make_dirs, write_atomic
from pytest_trtllm_slurm.node.forkloop import kill_group
from pytest_trtllm_slurm.node.paths import Batch, Session
from pytest_trtllm_slurm.node.protocol import EARLY_MISS
from pytest_trtllm_slurm.planning.jobspec import JobSpec
from pytest_trtllm_slurm.planning.masking import hidden_env, shown_env

STOP_GRACE = 5.0  # seconds between SIGTERM and SIGKILL of a session or a batch at its end
POLL_STEP = 0.01  # seconds between two looks at a batch's exit-code file while waiting


class LocalSession:
    """One run's session process and its mailbox (0700, under the work root's ``.agents``)."""

    def __init__(self, proc: subprocess.Popen[bytes], folder: str, env: Mapping[str, str]):
        self.proc = proc
        self.box = Session(folder)
        self.env = dict(env)  # what it was started with: a batch needing other secrets runs fresh

    @classmethod
    def start(cls, argv: Sequence[str], *, cwd: str, env: Mapping[str, str],
              folder: str) -> LocalSession:
        """Start the session (its own process group; its output in ``session.log``)."""
        box = Session(folder)
        make_dirs(Path(box.inbox))
        with open(os.open(box.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW,
                          0o600), "ab") as log:
            proc = subprocess.Popen(list(argv), cwd=cwd, env=dict(env), stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        return cls(proc, folder, env)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def serves(self, spec: JobSpec) -> bool:
        """Whether a fork of this session can run ``spec`` as a fresh worker would."""
        if not spec.serves_by_fork() or not self.alive():
            return False
        return all(self.env.get(k) == v for k, v in hidden_env(spec.env).items())

    def send(self, spec: JobSpec, name: str, devices: list[int]) -> ServedBatch:
        """Ask for ``spec`` to run on ``devices`` (none: the session's own environment)."""
        os.makedirs(spec.work_dir, mode=0o700, exist_ok=True)
        work = Batch(spec.work_dir)
        batch = ServedBatch(self, name, pid_path=work.batch_pid, exit_path=work.exit_code)
        for leftover in (batch.pid_path, batch.exit_path):  # a retry's
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)
        request = {"name": name, "tests": spec.assignment(), "devices": [str(d) for d in devices],
                   "reports_path": spec.reports_path, "log_path": spec.log_path,
                   "exit_path": batch.exit_path, "pid_path": batch.pid_path,
                   "env": shown_env(spec.env)}
        write_atomic(self.box.request(name), json.dumps(request))
        return batch

    def stop(self) -> None:
        """End the session once its batches ended (the executor ends them first): SIGTERM
        to its process group, SIGKILL after ``STOP_GRACE``. It holds nothing to save (each
        fork writes its own batch's files), and its own end (pytest's summary, collections
        over every item) would only delay this run's. Its folder goes with it, but for a
        session that failed on its own: its log says why."""
        if self.alive():
            kill_group(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(STOP_GRACE)
            except subprocess.TimeoutExpired:
                kill_group(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        elif self.proc.returncode not in (0, None):
            return
        shutil.rmtree(self.box.dir, ignore_errors=True)


class ServedBatch:
    """A batch the session forked, read as ``subprocess.Popen`` is (``pid``, ``poll``,
    ``wait``): its pid and exit code are files the session writes (``node/forkloop``)."""

    # the batch never started: the session ended first, or did not collect its tests
    NOT_RUN = EARLY_MISS

    def __init__(self, session: LocalSession, name: str, *, pid_path: str, exit_path: str):
        self.session = session
        self.name = name
        self.pid_path = pid_path
        self.exit_path = exit_path
        self.returncode: int | None = None
        self._pid: int | None = None

    @property
    def pid(self) -> int | None:
        if self._pid is None:
            with contextlib.suppress(OSError, ValueError):
                self._pid = int(Path(self.pid_path).read_text().strip())
        return self._pid

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._code()
        return self.returncode

    def _code(self) -> int | None:
        with contextlib.suppress(OSError, ValueError):
            code = int(Path(self.exit_path).read_text().strip())
            return 128 - code if code > 128 else code  # the shell's 128+N as Popen's -N
        if self.session.alive():
            return None
        if self.pid is None:
            return self.NOT_RUN
        try:  # the session died under a running batch: the batch ends on its own
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return 1
        except OSError:
            pass
        return None

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.name, timeout or 0.0)
            time.sleep(POLL_STEP)
        return code

    def stop(self, grace: float) -> None:
        """End the batch: TERM now (and ``<name>.cancel``: the session forgets it, or kills
        it if it starts meanwhile), KILL after ``grace``; waits for its end."""
        if self.poll() is not None:
            return
        with contextlib.suppress(OSError):
            write_atomic(self.session.box.cancel(self.name), "")
        self._signal(signal.SIGTERM)
        try:
            self.wait(grace)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.wait(STOP_GRACE)

    def _signal(self, sig: int) -> None:
        if (pid := self.pid) is not None:
            kill_group(pid, sig)
