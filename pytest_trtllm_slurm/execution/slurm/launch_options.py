"""How a batch is launched here, for every backend and the re-run line: its sbatch/srun options
(GRES, MPI plugin, launcher prefix) and container (pyxis flags, or a docker/podman wrapper)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import PurePosixPath

from pytest_trtllm_slurm.execution.local.docker import TRTLLM_RUN_FLAGS
from pytest_trtllm_slurm.execution.render.containers import (
    CENV_PREFIX,
    JOB_LABEL,
    WRAPPER_SCRIPT,
    Engine,
    client_sensitive,
    container_env,
    container_name_for,
    env_file_text,
    in_container_argv,
    job_mounts,
    pyxis_args,
    workdir_of,
    wrap_in_container,
)
from pytest_trtllm_slurm.execution.render.scripts import (
    ContainerOptions,
    SlurmOptions,
    launcher_of,
    options_for,
)
from pytest_trtllm_slurm.execution.slurm.jobs import SlurmJobs
from pytest_trtllm_slurm.planning.jobspec import JobSpec, SlurmEnv
from pytest_trtllm_slurm.planning.models import Launch
from pytest_trtllm_slurm.transport.shell import Shell

MPI_FALLBACKS = ("pmix", "pmi2")
WRAPPING_RUNTIMES = ("docker", "podman")
CONTAINER_SCRIPT = "container_run.sh"  # the wrapper script, in the batch's work dir


class LaunchOptions:
    """Options and container wrapping for the batches of one executor."""

    def __init__(self, jobs: SlurmJobs, *, slurm_env: SlurmEnv | None,
                 launcher_prefix: Sequence[str], container: ContainerOptions | None,
                 container_runtime: str, container_run_flags: Sequence[str] | None,
                 warn_once: Callable[[str, str], None]) -> None:
        self.jobs = jobs
        self.slurm_env = slurm_env
        self.launcher_prefix = tuple(launcher_prefix)
        self.container = container
        self.container_runtime = container_runtime
        # docker/podman runtime: TensorRT-LLM's resource flags (docker.default_run_flags
        # fits them to the machine; the local cluster's executor passes those)
        self.container_run_flags = list(
            TRTLLM_RUN_FLAGS if container_run_flags is None else container_run_flags)
        self.warn_once = warn_once
        self.unwrapped: dict[str, JobSpec] = {}  # work dir -> the spec before wrapping
        # work dirs the caller made (0700, verified ours) with the batch's files: not again
        self.made: set[str] = set()
        self._mpi: dict[str, str | None] = {}

    def prepare(self, spec: JobSpec, shell: Shell) -> JobSpec:
        """The spec as it is launched (pyxis: the image's python with the plugin on
        PYTHONPATH; docker/podman: a container run, its wrapper in the work dir made here)."""
        if self.container_runtime == "pyxis" and spec.container_image:
            spec = spec.model_copy(update={"env": container_env(spec),
                                           "command": in_container_argv(spec.command)})
        if spec.work_dir in self.made:
            self.made.discard(spec.work_dir)
        else:
            shell.mkdir(spec.work_dir, private=True)
        if self.wraps(spec):
            self.unwrapped[spec.work_dir] = spec
            script = str(PurePosixPath(spec.work_dir) / CONTAINER_SCRIPT)
            shell.write_file(script, WRAPPER_SCRIPT)
            env, argv = self.wrapped(spec, spec.command, script)
            spec = spec.model_copy(update={"env": env, "command": argv})
        return spec

    def wraps(self, spec: JobSpec) -> bool:
        return self.container_runtime in WRAPPING_RUNTIMES and bool(spec.container_image)

    def gates(self, spec: JobSpec) -> bool:
        """A step worth launching early: worker ranks, not in docker/podman (the gate's env)."""
        return spec.workflow == "pytest" and bool(spec.nodeids) and not self.wraps(spec)

    def wrapped(self, spec: JobSpec, command: Sequence[str],
                script: str | None) -> tuple[dict[str, str], list[str]]:
        """(env to export, task argv): ``command`` (after an MPI batch's launcher prefix) run
        by the image's python in a docker/podman container (``wrap_in_container``); the
        values are exported before srun, those the engine CLI reads as ``CENV_PREFIX``."""
        assert spec.container_image
        env = container_env(spec)
        in_file = {k: v for k, v in env.items() if client_sensitive(k)}
        env_file_text(in_file)  # ValueError now for a value the wrapper could not pass
        flags = list(self.container_run_flags)
        passed = {k: v for k, v in env.items() if k not in in_file}  # -e NAME
        exported = {**passed, **{CENV_PREFIX + k: v for k, v in in_file.items()}}
        prefix = launcher_of(spec, SlurmOptions(launcher_prefix=self.launcher_prefix))
        runtime: Engine = "podman" if self.container_runtime == "podman" else "docker"
        argv = wrap_in_container(
            [*prefix, *in_container_argv(command)], runtime, spec.container_image,
            name_prefix=f"trtllm-{spec.name}", mounts=job_mounts(spec),
            workdir=workdir_of(spec), env_names=sorted(passed),
            gpus=spec.devices_per_node > 0, run_flags=flags,
            labels={JOB_LABEL: spec.job_name}, script=script,
        )
        return exported, argv

    def options(self, spec: JobSpec) -> SlurmOptions:
        # a wrapped batch has its launcher prefix inside the container (see wrapped)
        prefix = () if self.wraps(spec) else self.launcher_prefix
        base = options_for(spec.model_copy(update={"slurm_env": spec.slurm_env or self.slurm_env}),
                           launcher_prefix=prefix)
        mpi = self._usable_mpi(spec, base.mpi) if spec.launch is Launch.MPI else base.mpi
        return SlurmOptions(base.gres_style, base.gres_type, mpi, base.launcher_prefix,
                            self._container_for(spec))

    def _container_for(self, spec: JobSpec) -> ContainerOptions | None:
        """pyxis flags: a container name per image and account (imported once per node)."""
        if not spec.container_image:
            return None
        if self.container_runtime != "pyxis":
            return self.container
        name = container_name_for(spec.container_image, account=spec.account)
        return ContainerOptions(image=spec.container_image, name=name,
                                args=tuple(pyxis_args(spec, name)))

    def _usable_mpi(self, spec: JobSpec, preferred: str | None) -> str | None:
        """The first MPI plugin srun can load (``srun --mpi=X --test-only``); a listed
        pmix may lack its library. None: leave it to Slurm's MpiDefault."""
        key = spec.partition or ""
        if key in self._mpi:
            return self._mpi[key]
        available = self.slurm_env.pmix.available if self.slurm_env else []
        candidates = [c for c in dict.fromkeys([preferred, *MPI_FALLBACKS]) if c]
        if available:
            candidates = [c for c in candidates if c == preferred or c in available]
        chosen: str | None = None
        for cand in candidates:
            argv = ["srun", f"--mpi={cand}", "--test-only", "-n1"]
            argv += [f"--partition={spec.partition}"] if spec.partition else []
            argv += [f"--account={spec.account}"] if spec.account else []
            res = self.jobs.run([*argv, "true"])
            if res.ok or "mpi" not in (res.stderr + res.stdout).lower():
                chosen = cand
                break
        if preferred and chosen != preferred:
            self.warn_once(f"mpi:{preferred}", f"srun --mpi={preferred} is listed but does not "
                           f"load here; using {chosen or 'the MpiDefault'}.")
        self._mpi[key] = chosen
        return chosen
