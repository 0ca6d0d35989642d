"""Slurm script and command rendering: pure functions (no I/O), snapshot-tested. Every value
that reaches a shell is quoted or an argv element; node ids never reach a command line.
Launch ``single``: one task holding all the job's nodes; ``mpi``: one task per device."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from pytest_trtllm_slurm.execution.render.containers import workdir_of
from pytest_trtllm_slurm.node.paths import Batch
from pytest_trtllm_slurm.planning.jobspec import JobSpec
from pytest_trtllm_slurm.planning.masking import hidden_env, mask_argv, shown_env
from pytest_trtllm_slurm.planning.models import Launch
from pytest_trtllm_slurm.planning.safe_values import control_chars, env_problem, line_problem

GresStyle = Literal["gres", "gpus-per-node"]

@dataclass(frozen=True)
class SlurmOptions:
    """How this cluster wants GPUs and MPI asked for (from discovery)."""

    gres_style: GresStyle = "gpus-per-node"
    gres_type: str | None = None  # gres.conf Type, verbatim (``h200``)
    mpi: str | None = None  # --mpi value for launch=mpi; None: Slurm's MpiDefault
    launcher_prefix: tuple[str, ...] = ()
    container: ContainerOptions | None = None


@dataclass(frozen=True)
class ContainerOptions:
    """pyxis flags: the same container name everywhere so the named container is reused."""

    image: str
    name: str
    mounts: tuple[str, ...] = ()
    workdir: str | None = None
    writable: bool = False
    args: tuple[str, ...] = ()  # complete flags rendered elsewhere (containers.pyxis_args)

    def flags(self) -> list[str]:
        if self.args:
            return list(self.args)
        out = [f"--container-image={self.image}", f"--container-name={self.name}"]
        if self.mounts:
            out.append("--container-mounts=" + ",".join(self.mounts))
        if self.workdir:
            out.append(f"--container-workdir={self.workdir}")
        if self.writable:
            out.append("--container-writable")
        return out


@dataclass(frozen=True)
class StepShare:
    """The slice of a persistent allocation one step asks for (per task / per node)."""

    cpus_per_task: int | None = None
    mem_mb: int | None = None  # per node
    overlap: bool = False
    extra: tuple[str, ...] = field(default=())


def options_for(spec: JobSpec, *, launcher_prefix: Sequence[str] = ()) -> SlurmOptions:
    """Gres style, gres type and MPI type from ``spec.slurm_env``: ``--gres=gpu:<type>:<n>``
    where the nodes declare GPU gres (the type picks the nodes), else ``--gpus-per-node``."""
    env = spec.slurm_env
    part = env.partition_named(spec.partition) if env else None
    if part is None and env is not None:
        part = next((p for p in env.partitions if p.default), None)
    gres = part is not None and (part.requires_gres or part.gpu_type)
    style: GresStyle = "gres" if gres else "gpus-per-node"
    mpi = env.pmix.preferred if env is not None else None
    return SlurmOptions(gres_style=style, gres_type=part.gpu_type if part is not None else None,
                        mpi=mpi, launcher_prefix=tuple(launcher_prefix))


def gpu_flag(count: int, style: GresStyle, gres_type: str | None = None) -> str | None:
    """The per-node GPU request, or None for a CPU-only job."""
    if count <= 0:
        return None
    if style == "gres":
        return f"--gres=gpu:{gres_type}:{count}" if gres_type else f"--gres=gpu:{count}"
    return f"--gpus-per-node={count}"


def task_layout(spec: JobSpec) -> tuple[int, int]:
    """(tasks in total, tasks per node): one per device for mpi, one in total for single."""
    if spec.launch is Launch.MPI:
        per_node = spec.devices_per_node or 1
        total = spec.total_devices or per_node * spec.node_count
        return total, per_node
    return 1, 1


def shell_word(value: object, *, one_line: bool = False) -> str:
    """``value`` as one bash word: with control characters (which would hide text when
    shown; sbatch refuses ``\r\n``) in bash's ``$'...'`` escapes, newlines and tabs too
    when ``one_line``; NUL refused (no program can take it)."""
    text = str(value)
    found = set(control_chars(text)) - (set() if one_line else {"\\n", "\\t"})
    if not found:
        return shlex.quote(text)
    if "\x00" in text:
        raise ValueError(f"{text!r} contains a NUL character: no shell or program can take it")
    out = []
    for ch in text:
        if ch in "\\'":
            out.append("\\" + ch)
        elif ch.isprintable() and not control_chars(ch):
            out.append(ch)
        else:
            out.append("".join(f"\\x{b:02x}" for b in ch.encode("utf-8")))
    return "$'" + "".join(out) + "'"


def shell_join(argv: Sequence[object]) -> str:
    """A bash command line of ``argv`` (``shell_word`` of each element)."""
    return " ".join(shell_word(a) for a in argv)


_q = shell_word


def _directive(*parts: str) -> str:
    """One ``#SBATCH`` line. sbatch ends a directive at the line break, so a value with
    one would run the rest of it as a command: refused (ValueError), never escaped."""
    for part in parts:
        if problem := line_problem(part):
            raise ValueError(f"#SBATCH value {part!r} {problem}: it cannot stay on its line")
    return "#SBATCH " + " ".join(shlex.quote(p) if i else p for i, p in enumerate(parts))


def _comment(text: str) -> str:
    """A ``#`` comment line: control characters shown as escapes, never as line breaks."""
    return "# " + "".join(repr(c)[1:-1] if control_chars(c) else c for c in text)


def _slurm_path(path: str) -> str:
    """A literal path for -o/-e: ``%`` is a Slurm filename pattern, ``%%`` a literal one."""
    return path.replace("%", "%%")


def _env_lines(env: dict[str, str]) -> list[str]:
    if problem := env_problem(env):
        raise ValueError(f"job environment: {problem}")
    return [f"export {key}={shell_word(value, one_line=True)}"
            for key, value in sorted(env.items())]


def _env_names(env: dict[str, str], values: str) -> list[str]:
    """The comment naming the job's variables whose values are in no file (``values``: whence)."""
    if problem := env_problem(env):
        raise ValueError(f"job environment: {problem}")
    return [_comment(f"pytest-trtllm-slurm environment (values {values}, not written here): "
                     + " ".join(sorted(env)))] if env else []


def _mpi_flags(spec: JobSpec, opts: SlurmOptions) -> list[str]:
    return [f"--mpi={opts.mpi}"] if spec.launch is Launch.MPI and opts.mpi else []


def launcher_of(spec: JobSpec, opts: SlurmOptions) -> list[str]:
    """What each rank runs before the command: the batch's launcher, else the executor's;
    only a launch=mpi batch has one."""
    if spec.launch is not Launch.MPI:
        return []
    return list(spec.launcher_prefix or opts.launcher_prefix)


def _payload(spec: JobSpec, opts: SlurmOptions) -> list[str]:
    prefix = launcher_of(spec, opts)
    if not spec.command:
        raise ValueError(f"job spec {spec.name!r} has no command")
    return prefix + list(spec.command)


def sbatch_directives(spec: JobSpec, opts: SlurmOptions) -> list[str]:
    """The job's resource options (argv form), shared by the script and the re-run line."""
    ntasks, per_node = task_layout(spec)
    out = ["-J", spec.job_name]
    if spec.account:
        out += ["-A", spec.account]
    if spec.partition:
        out += ["-p", spec.partition]
    out += ["-N", str(spec.node_count), f"--ntasks-per-node={per_node}"]
    if spec.launch is Launch.MPI:
        out.append(f"--ntasks={ntasks}")
    if flag := gpu_flag(spec.devices_per_node, opts.gres_style, opts.gres_type):
        out.append(flag)
    if spec.time_limit:
        out += ["-t", spec.time_limit]
    if spec.mem_mb:
        out.append(f"--mem={spec.mem_mb}M")
    return out + ["--no-requeue"]  # the controller decides about retries


def srun_in_job(spec: JobSpec, opts: SlurmOptions) -> list[str]:
    """The srun line inside the sbatch script (argv)."""
    ntasks, per_node = task_layout(spec)
    argv = ["srun", "--kill-on-bad-exit=1", "-N", "1" if ntasks == 1 else str(spec.node_count)]
    argv += [f"--ntasks={ntasks}", f"--ntasks-per-node={per_node}"]
    argv += _mpi_flags(spec, opts)
    if opts.container:
        argv += opts.container.flags()
    return argv + _payload(spec, opts)


def render_sbatch(spec: JobSpec, *, gres_style: GresStyle = "gpus-per-node",
                  mpi: str | None = None, launcher_prefix: Sequence[str] = (),
                  gres_type: str | None = None, container: ContainerOptions | None = None) -> str:
    """The one-shot sbatch script of a batch (stdout and stderr both to spec.log_path)."""
    opts = SlurmOptions(gres_style, gres_type, mpi, tuple(launcher_prefix), container)
    directives = iter(sbatch_directives(spec, opts))
    lines = ["#!/bin/bash"]
    for flag in directives:  # a short option always comes with its value
        if flag.startswith("-") and not flag.startswith("--"):
            lines.append(_directive(flag, next(directives)))
        else:
            lines.append(_directive(shlex.quote(flag)))
    log = _slurm_path(spec.log_path)
    lines += [
        _directive("-o", log),
        _directive("-e", log),
        "#SBATCH --open-mode=append",
        _directive("--chdir=" + shlex.quote(workdir_of(spec))),
        _comment(f"pytest-trtllm-slurm batch {spec.name}; spec: {Batch(spec.work_dir).job_spec}"),
        *_env_names(spec.env, "given to sbatch"),
        'echo "[trtllm-slurm] job ${SLURM_JOB_ID} on ${SLURM_JOB_NODELIST}"',
        shell_join(srun_in_job(spec, opts)),
        "",
    ]
    return "\n".join(lines)


def render_step_command(spec: JobSpec, alloc_job_id: str, *,
                        gres_style: GresStyle = "gpus-per-node", mpi: str | None = None,
                        launcher_prefix: Sequence[str] = (), gres_type: str | None = None,
                        share: StepShare | None = None, stepid_path: str | None = None,
                        container: ContainerOptions | None = None) -> list[str]:
    """argv of one batch as a step of the persistent allocation ``alloc_job_id``: always
    ``-N`` (else srun takes one node), ``--exact`` and a memory share so steps run side by
    side; with ``stepid_path`` rank 0 records ``$SLURM_STEP_ID`` (a hang cancels just it)."""
    opts = SlurmOptions(gres_style, gres_type, mpi, tuple(launcher_prefix), container)
    share = share or StepShare()
    ntasks, per_node = task_layout(spec)
    nodes = 1 if ntasks == 1 else spec.node_count
    argv = ["srun", f"--jobid={alloc_job_id}", "-N", str(nodes)]
    argv += [f"--ntasks={ntasks}", f"--ntasks-per-node={per_node}", "--exact"]
    if share.cpus_per_task:
        argv.append(f"--cpus-per-task={share.cpus_per_task}")
    mem = spec.mem_mb or share.mem_mb
    if mem:
        argv.append(f"--mem={mem}M")
    if flag := gpu_flag(spec.devices_per_node, opts.gres_style, opts.gres_type):
        argv.append(flag)
    if share.overlap:
        argv.append("--overlap")
    argv += ["--kill-on-bad-exit=1", f"--job-name={spec.job_name}"]
    if spec.time_limit:
        argv.append(f"--time={spec.time_limit}")
    argv += _mpi_flags(spec, opts) + list(share.extra)
    if opts.container:
        argv += opts.container.flags()
    payload = _payload(spec, opts)
    if stepid_path:
        # POSIX sh: a container image may have no bash
        payload = ["sh", "-c", STEP_WRAPPER, "trtllm-step", stepid_path, *payload]
    return argv + payload


# a test in a step sees the SLURM_JOB_* of a one-shot job of its shape (the step's, not the
# allocation's); rank 0 records $SLURM_STEP_ID so a hang cancels exactly this step
STEP_WRAPPER = (
    'export SLURM_JOB_NUM_NODES="$SLURM_STEP_NUM_NODES" SLURM_NNODES="$SLURM_STEP_NUM_NODES"'
    ' SLURM_JOB_NODELIST="$SLURM_STEP_NODELIST" SLURM_NODELIST="$SLURM_STEP_NODELIST"'
    ' SLURM_NTASKS="$SLURM_STEP_NUM_TASKS" SLURM_NPROCS="$SLURM_STEP_NUM_TASKS"'
    ' SLURM_TASKS_PER_NODE="$SLURM_STEP_TASKS_PER_NODE"; '
    '[ "${SLURM_PROCID:-0}" != 0 ] || echo "$SLURM_STEP_ID" > "$1"; shift; exec "$@"')


def render_step_launcher(step_argv: Sequence[str], *, log_path: str, pid_path: str, exit_path: str,
                         cwd: str, env: dict[str, str] | None = None) -> str:
    """``step.sh``, run detached (setsid): srun in the background, its pid recorded, the exit
    code written atomically, inherited SLURM_* (but SLURM_CONF) dropped. Of ``env`` only
    ``shown_env``'s values are written; ``hidden_env``'s come from the caller's environment."""
    # the exit code through a temporary file of an unpredictable name that mktemp creates
    # (O_EXCL, 0600), renamed over the name the controller reads
    exit_tmp = _q(exit_path + ".XXXXXXXX")
    lines = [
        "#!/bin/bash",
        "# pytest-trtllm-slurm step launcher (started detached with setsid)",
        f"exec >>{_q(log_path)} 2>&1 </dev/null",
        'for v in $(compgen -e); do case "$v" in SLURM_CONF) ;; SLURM_*) unset "$v" ;; esac; done',
        f'finish() {{ t=$(mktemp {exit_tmp}) && echo "$1" >"$t" && mv -f "$t" {_q(exit_path)}; }}',
        f"cd -- {_q(cwd)} || {{ finish 127; exit 127; }}",
        *_env_lines(shown_env(env or {})),
        *_env_names(hidden_env(env or {}),
                     "inherited from the command that started this launcher"),
        f"{shell_join(step_argv)} &",
        "pid=$!",
        f'echo "$pid" > {_q(pid_path)}',
        'wait "$pid"',
        "rc=$?",
        'finish "$rc"',
        "",
    ]
    return "\n".join(lines)


def rerun_argv(spec: JobSpec, nodeid: str) -> list[str]:
    """A plain pytest run of ``nodeid`` with the batch's options (else the job's command)."""
    if not spec.rerun_argv:
        return mask_argv(spec.command)
    nodeid = spec.item_keys.get(nodeid, nodeid)  # what pytest finds, whatever hooks showed
    if spec.invocation_dir and spec.invocation_dir != spec.rootdir:
        nodeid = f"{spec.rootdir.rstrip('/')}/{nodeid}"  # node ids are relative to the rootdir
    return [*spec.masked_rerun_argv(), nodeid]


def render_rerun_sbatch(spec: JobSpec, nodeid: str, opts: SlurmOptions) -> str:
    """A copy-pasteable ``sbatch --wrap`` that re-runs ``nodeid`` with the batch's resources."""
    inner = spec.model_copy(update={"command": rerun_argv(spec, nodeid)})
    srun = srun_in_job(inner, opts)
    argv = ["sbatch", *sbatch_directives(spec, opts), f"--chdir={workdir_of(spec)}"]
    argv += ["--wrap", shlex.join(srun)]  # sbatch runs it with /bin/sh: POSIX quoting
    return shell_join(argv)


def render_rerun_step(spec: JobSpec, nodeid: str, alloc_job_id: str, opts: SlurmOptions,
                      share: StepShare | None = None) -> str:
    """A copy-pasteable ``srun --jobid=<alloc>`` that re-runs ``nodeid`` as a step."""
    inner = spec.model_copy(update={"command": rerun_argv(spec, nodeid)})
    argv = render_step_command(inner, alloc_job_id, gres_style=opts.gres_style, mpi=opts.mpi,
                               launcher_prefix=opts.launcher_prefix, gres_type=opts.gres_type,
                               share=share, container=opts.container)
    return f"cd {_q(workdir_of(spec))} && " + shell_join(argv)
