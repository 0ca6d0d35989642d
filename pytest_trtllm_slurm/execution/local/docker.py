"""local_docker: run a batch in a local container (``docker run`` or ``podman run``).

The worker runs inside the JobSpec's image (``containers.engine_run_argv``), which must be
in the engine's store (``--pull=never``); each job gets a disjoint GPU slice. Hang, timeout,
cancel and close: ``rm -f`` (again after the client is killed); ``remove_orphans``."""

from __future__ import annotations

import os
import resource
import secrets
import shlex
import signal
import socket
import subprocess
import threading
from collections.abc import Mapping, Sequence

from pytest_trtllm_slurm.errors import ConfigError
from pytest_trtllm_slurm.execution.local.process import LocalJob, LocalProcessExecutor
from pytest_trtllm_slurm.execution.protocol import JobHandle
from pytest_trtllm_slurm.execution.render.containers import (
    JOB_LABEL,
    OWNER_LABEL,
    Engine,
    client_sensitive,
    container_env,
    engine_run_argv,
    env_file_text,
    safe_name,
    workdir_of,
)
from pytest_trtllm_slurm.execution.render.scripts import rerun_argv, shell_join, shell_word
from pytest_trtllm_slurm.planning.jobspec import JobSpec
from pytest_trtllm_slurm.planning.masking import is_secret
from pytest_trtllm_slurm.planning.models import LocalEnv
from pytest_trtllm_slurm.planning.safe_values import argument_problem
from pytest_trtllm_slurm.transport.command_log import timed_command

ENGINES: tuple[Engine, ...] = ("docker", "podman")
ENGINE_TIMEOUT = 60.0
CAP_SYS_RESOURCE = 24
# podman lowers its own RLIMIT_NPROC to 32768 when it starts (measured, podman 4.3): a
# container cannot be given more without CAP_SYS_RESOURCE
PODMAN_NPROC_CEILING = 32768
TRTLLM_RUN_FLAGS = ("--ipc=host", "--ulimit", "memlock=-1", "--ulimit", "stack=67108864")


def has_cap_sys_resource() -> bool:
    """Whether this process may raise hard resource limits (CAP_SYS_RESOURCE, bounding set)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("CapBnd:"):
                    return bool(int(line.split()[1], 16) >> CAP_SYS_RESOURCE & 1)
    except (OSError, ValueError, IndexError):
        pass
    return True


def default_run_flags(engine: Engine, *, can_raise_limits: bool | None = None) -> list[str]:
    """The resource flags TensorRT-LLM's images want. Without CAP_SYS_RESOURCE (setrlimit
    fails) no ``memlock=-1``, and podman gets ``nofile``/``nproc`` at the host's hard
    limits (any ``--ulimit`` replaces containers.conf's defaults)."""
    if can_raise_limits is None:
        can_raise_limits = has_cap_sys_resource()
    if can_raise_limits:
        return list(TRTLLM_RUN_FLAGS)
    flags = ["--ipc=host", "--ulimit", "stack=67108864"]
    if engine == "podman":
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
        nofile = 1048576 if nofile == resource.RLIM_INFINITY else nofile
        nproc = (PODMAN_NPROC_CEILING if nproc == resource.RLIM_INFINITY
                 else min(nproc, PODMAN_NPROC_CEILING))
        flags += ["--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}"]
    return flags


class ContainerExecutor(LocalProcessExecutor):
    """Runs JobSpecs in local containers (local_docker), docker or podman."""

    def __init__(self, engine: Engine, *, cli: Sequence[str] | None = None,
                 engine_env: Mapping[str, str] | None = None, gpu_ids: list[int] | None = None,
                 run_flags: Sequence[str] | None = None) -> None:
        """``cli``: the argv prefix reaching the engine (default ``[engine]``); ``engine_env``:
        extra environment for it; ``run_flags`` replaces ``default_run_flags(engine)``. docker
        runs as the caller's uid:gid unless root (rootless podman maps root already)."""
        if engine not in ENGINES:
            raise ConfigError(f"container engine {engine!r}: expected one of {', '.join(ENGINES)}")
        self.engine: Engine = engine
        self.cli = list(cli or [engine])
        self.engine_env = dict(engine_env or {})
        super().__init__(gpu_ids)
        self.run_flags = list(default_run_flags(engine) if run_flags is None else run_flags)
        self.user = f"{os.getuid()}:{os.getgid()}" if engine == "docker" and os.getuid() else None
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        self._images_ok: set[str] = set()
        self._orphans_checked = False

    @classmethod
    def from_local_env(cls, local: LocalEnv, *, engine: str | None = None) -> ContainerExecutor:
        """The engine that answered the probe (docker first), or ``engine`` when forced."""
        chosen = engine or local.container_engine
        if not chosen:
            notes = "; ".join(n for n in local.notes if n.startswith("container")) or "none"
            raise ConfigError(
                "local_docker needs a container engine, and neither docker nor podman answers "
                f"here ({notes}); start one, or choose another scenario")
        return cls(chosen, gpu_ids=list(range(local.gpu_count)))  # type: ignore[arg-type]

    def _env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        return {**os.environ, **self.engine_env, **(extra or {})}

    def _remove(self, name: str) -> None:
        """Kill (no grace: podman would wait 10 s) and remove one container."""
        self._engine("rm", "-f", *(["--time", "0"] if self.engine == "podman" else []), name)

    def _engine(self, *args: str, timeout: float = ENGINE_TIMEOUT) -> subprocess.CompletedProcess:
        with timed_command("localhost", [*self.cli, *args]) as outcome:
            try:
                res = subprocess.run([*self.cli, *args], capture_output=True, text=True,
                                     timeout=timeout, stdin=subprocess.DEVNULL, env=self._env(),
                                     check=False)
            except FileNotFoundError as exc:
                res = subprocess.CompletedProcess(args, 127, "", str(exc))
            except subprocess.TimeoutExpired as exc:
                res = subprocess.CompletedProcess(args, 124, "",
                                                  f"timed out after {timeout} s: {exc}")
            outcome.append(res)
        return outcome[0]

    def check_image(self, image: str) -> None:
        """ConfigError unless ``image`` is in the engine's local store (never pulled)."""
        if image in self._images_ok:
            return
        if problem := argument_problem(image):  # else "image inspect -x" is an option
            raise ConfigError(f"container image {image!r} {problem}; choose another image "
                              "with --trtllm-container-image")
        res = self._engine("image", "inspect", "--format", "{{.Id}}", image)
        if res.returncode != 0:
            lines = (res.stderr or res.stdout).strip().splitlines()
            detail = lines[-1] if lines else f"exit {res.returncode}"
            raise ConfigError(
                f"container image {image!r} is not in {self.engine}'s local image store "
                f"({shlex.join(self.cli)}: {detail})."
                f" Images are never pulled: `{self.engine} pull {image}` (or load/build it) "
                "first, or choose another image with --trtllm-container-image")
        self._images_ok.add(image)

    def remove_orphans(self) -> list[str]:
        """Remove containers of ours whose controller (same host, pid gone) no longer runs."""
        label = (f'{{{{.Label "{OWNER_LABEL}"}}}}' if self.engine == "docker"  # docker: a method
                 else f'{{{{index .Labels "{OWNER_LABEL}"}}}}')  # podman: a map
        res = self._engine("ps", "-a", "--filter", f"label={OWNER_LABEL}", "--format",
                           "{{.Names}}\t" + label)
        host = socket.gethostname()
        dead = []
        for line in res.stdout.splitlines() if res.returncode == 0 else []:
            name, _, owner = line.partition("\t")
            owner_host, _, pid = owner.strip().rpartition(":")
            if owner_host == host and pid.isdigit() and not _pid_alive(int(pid)):
                dead.append(name.strip())
        for name in dead:
            self._remove(name)
        return dead

    def submit(self, spec: JobSpec) -> JobHandle:
        if not spec.container_image:
            raise ConfigError(
                f"batch {spec.name!r} is routed to local_docker but has no container image; "
                "set --trtllm-container-image (or container_image in the clusters file)")
        self.check_image(spec.container_image)
        if not self._orphans_checked:
            self._orphans_checked = True
            self.remove_orphans()
        n = next(self._ids)
        name = safe_name(f"trtllm-{spec.name}", 40) + f"-{os.getpid()}-{n}-{secrets.token_hex(3)}"
        return self._submitted(f"{self.engine}-{os.getpid()}-{n}", LocalJob(spec, name))

    def run_argv(self, spec: JobSpec, name: str, gpus: Sequence[int] = (),
                 command: Sequence[str] | None = None, env_file: str | None = None) -> list[str]:
        """The engine argv of one batch (``env_file``: see ``engine_run_argv``)."""
        all_gpus = bool(gpus) and sorted(gpus) == sorted(self._all_gpus)
        return engine_run_argv(
            self.engine, spec, name=name, cli=self.cli, run_flags=self.run_flags,
            gpu_ids=list(gpus), all_gpus=all_gpus, env_file=env_file, user=self.user,
            command=command, labels={OWNER_LABEL: self.owner, JOB_LABEL: spec.job_name})

    def _launch(self, job: LocalJob) -> None:
        """Values reach the engine through its environment (``-e NAME``) and, for the names
        its CLI reads itself, a pipe (``--env-file /dev/fd/N``): none in ``ps`` or on disk."""
        job_env = container_env(job.spec)
        in_file = {k: v for k, v in job_env.items() if client_sensitive(k)}
        env = self._env({k: v for k, v in job_env.items() if not client_sensitive(k)})
        banner = (f"[trtllm-slurm] container {job.name}: {self.engine} "
                  f"{job.spec.container_image}\n")
        if not in_file:
            argv = self.run_argv(job.spec, job.name, job.gpus)
            self._spawn(job, argv, cwd=workdir_of(job.spec), env=env, banner=banner)
            return
        text = env_file_text(in_file).encode()
        read_fd, write_fd = os.pipe()
        try:
            argv = self.run_argv(job.spec, job.name, job.gpus, env_file=f"/dev/fd/{read_fd}")
            self._spawn(job, argv, cwd=workdir_of(job.spec), env=env, banner=banner,
                        pass_fds=(read_fd,))
        except BaseException:
            os.close(write_fd)
            raise
        finally:
            os.close(read_fd)
        threading.Thread(target=_write_and_close, args=(write_fd, text), daemon=True).start()

    def _exit_reason(self, code: int) -> str | None:
        if code < 0:
            return f"the {self.engine} client was killed by signal {signal.Signals(-code).name}"
        return {125: f"{self.engine} could not start the container (exit 125; see the job log)",
                126: "the command in the container could not be executed (exit 126)",
                127: "the command was not found in the container image (exit 127)",
                137: "killed by SIGKILL (exit 137; out of memory?)"}.get(code)

    def cancel(self, handle: JobHandle) -> None:
        """Kill and remove the container, then stop the engine client."""
        job = self._jobs[handle.job_id]
        job.cancelled = True
        if job.proc is None or job.removed:
            return
        self._remove(job.name)
        self._stop_group(job)
        self._remove(job.name)  # one created while the client was being stopped
        job.removed = True
        self._release(job)

    def rerun_command(self, spec: JobSpec, nodeid: str) -> str:
        """``cd <dir> && <engine> run ... <image> python3 -m pytest <nodeid>`` (secret values
        left out)."""
        command = rerun_argv(spec, nodeid)
        argv = engine_run_argv(
            self.engine, spec, name=safe_name(f"trtllm-rerun-{spec.name}", 50), cli=self.cli,
            run_flags=self.run_flags, all_gpus=bool(self._all_gpus and spec.total_devices),
            env={}, user=self.user, command=command)
        flags = [arg for key, value in sorted(container_env(spec).items())
                 for arg in ("-e", key if is_secret(key, value) else f"{key}={value}")]
        image_at = argv.index(spec.container_image or "")
        argv[image_at:image_at] = flags
        return f"cd {shell_word(workdir_of(spec))} && {shell_join(argv)}"

    def close(self) -> None:
        """Cancel what still runs, then remove anything of this executor the engine has."""
        for job_id, job in self._jobs.items():
            if job.proc is not None and not job.removed and job.proc.poll() is None:
                self.cancel(JobHandle(job_id=job_id, spec=job.spec, submitted_at=0))
        if any(job.proc is not None for job in self._jobs.values()):
            for name in self.containers():
                self._remove(name)

    def containers(self) -> list[str]:
        """Names of this executor's containers the engine still has (running or not)."""
        res = self._engine("ps", "-a", "--filter", f"label={OWNER_LABEL}={self.owner}",
                           "--format", "{{.Names}}")
        return res.stdout.split() if res.returncode == 0 else []


def _write_and_close(fd: int, data: bytes) -> None:
    """Feed the engine's env-file pipe (a client that dies early: EPIPE, nothing to do)."""
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:
        pass
    finally:
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        pass
    return True


