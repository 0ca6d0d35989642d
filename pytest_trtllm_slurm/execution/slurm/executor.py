"""local_slurm (and, over an SSHShell, remote_slurm): batches as Slurm jobs or steps.

One-shot: the batch's sbatch script is written to its work dir and submitted.
Persistent (default): each batch is a step of the shared allocation, started by
a detached launcher (``setsid -f bash step.sh``) so the step outlives the
controller and the same code works over SSH. The task records its step id, so
a hang cancels exactly ``<alloc>.<step>``; the allocation itself is never
cancelled here.

poll() answers for all handles in one round: one ``squeue -j ids`` for the
one-shot jobs, one ``squeue -s -j <alloc>`` per allocation for steps, exit-code
files, and sacct (chunked) for final states. It is adaptive: called more often
than its current interval (0.5 s after a change, growing to 5 s), it returns
the cached states without asking the scheduler.

Containers (a batch with an image): ``container_runtime = "pyxis"`` adds pyxis' srun flags;
``"docker"`` / ``"podman"`` wrap the Slurm task in a container run of the image
(``containers.wrap_in_container``: the wrapper script is written to the batch's work dir,
the job's env is exported by the launcher and passed with ``-e NAME``). The engine CLI is
the plain ``docker`` / ``podman`` of the node; it honours DOCKER_HOST, CONTAINER_HOST,
CONTAINERS_CONF, ... from the task's environment, which srun exports from the controller's.
"""

from __future__ import annotations

import itertools
import shlex
import time
from collections.abc import Callable, Sequence
from pathlib import PurePosixPath

from pytest_trtllm_slurm.errors import ExecutionError
from pytest_trtllm_slurm.execution.cadence import CADENCE
from pytest_trtllm_slurm.execution.local.docker import TRTLLM_RUN_FLAGS
from pytest_trtllm_slurm.execution.outcome import JobState, JobStatus, map_slurm_state
from pytest_trtllm_slurm.execution.protocol import JobHandle
from pytest_trtllm_slurm.execution.render.containers import (
    CENV_PREFIX,
    JOB_LABEL,
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
    wrapper_script,
)
from pytest_trtllm_slurm.execution.render.scripts import (
    ContainerOptions,
    SlurmOptions,
    StepShare,
    options_for,
    render_rerun_sbatch,
    render_rerun_step,
    render_sbatch,
    render_step_command,
    render_step_launcher,
    rerun_argv,
)
from pytest_trtllm_slurm.execution.slurm.allocation import AllocationManager, AllocationState
from pytest_trtllm_slurm.execution.slurm.jobs import (
    AcctRow,
    QueueRow,
    SchedulerError,
    SlurmJobs,
    parse_duration,
)
from pytest_trtllm_slurm.execution.slurm.lifecycle import Lifecycle, Phase
from pytest_trtllm_slurm.execution.slurm.own_blockers import WAITING_REASONS, blocker_note
from pytest_trtllm_slurm.execution.slurm.reaper import reap_dead_runs
from pytest_trtllm_slurm.execution.slurm.runs import RunRegistry
from pytest_trtllm_slurm.execution.slurm.tracking import (
    TrackedJob,
    WalltimePolicy,
    exit_code_state,
    final_state,
    seconds_until,
    step_share,
    visible_state,
)
from pytest_trtllm_slurm.execution.slurm.warm_pool import AgentPool, WarmJob, serves_warm
from pytest_trtllm_slurm.node.protocol import GATE_ENV, GATE_WAIT_ENV
from pytest_trtllm_slurm.planning.jobspec import JobSpec, SlurmEnv
from pytest_trtllm_slurm.planning.masking import is_secret
from pytest_trtllm_slurm.planning.models import Launch
from pytest_trtllm_slurm.transport.shell import LocalShell, Shell

MPI_FALLBACKS = ("pmix", "pmi2")
WRAPPING_RUNTIMES = ("docker", "podman")
CONTAINER_SCRIPT = "container_run.sh"  # the wrapper script, in the batch's work dir
BLOCKER_AFTER = 5.0  # seconds a job waits before we look for the user's own allocation
CONTAINER_STOP_WAIT = 15.0  # seconds a cancelled wrapped step has to remove its container


class SlurmExecutor:
    """Runs JobSpecs on Slurm through ``shell`` (LocalShell here, SSHShell for remote)."""

    def __init__(
        self,
        shell: Shell,
        *,
        slurm_env: SlurmEnv | None = None,
        persistent: bool = True,
        allocation_manager: AllocationManager | None = None,
        jobs: SlurmJobs | None = None,
        launcher_prefix: Sequence[str] = (),
        container: ContainerOptions | None = None,
        container_runtime: str = "none",
        container_run_flags: Sequence[str] | None = None,
        warn: Callable[[str], None] | None = None,
        min_interval: float = CADENCE.scheduler_min,
        max_interval: float = CADENCE.scheduler_max,
        max_failures: int = 5,
        fail_grace: float = 30.0,
        final_wait: float = 60.0,
        report_wait: float = 15.0,
        walltime: WalltimePolicy | None = None,
        warm_workers: bool = False,
        runs: RunRegistry | None = None,
    ) -> None:
        if persistent and allocation_manager is None:
            raise ValueError("persistent=True needs an allocation_manager")
        self.shell = shell
        self.slurm_env = slurm_env
        self.persistent = persistent
        self.allocations = allocation_manager
        self.jobs = jobs or (allocation_manager.jobs if allocation_manager else SlurmJobs(shell))
        self.launcher_prefix = tuple(launcher_prefix)
        self.container = container
        self.container_runtime = container_runtime
        # docker/podman runtime: TensorRT-LLM's resource flags (docker.default_run_flags
        # fits them to the machine; the local cluster's executor passes those)
        self.container_run_flags = list(
            TRTLLM_RUN_FLAGS if container_run_flags is None else container_run_flags)
        self._unwrapped: dict[str, JobSpec] = {}  # work dir -> the spec before wrapping
        self.warn = warn or (lambda msg: None)
        self.min_interval, self.max_interval = min_interval, max_interval
        # a scheduler that fails max_failures times in a row over fail_grace seconds (a
        # slurmctld restart takes a few) turns the jobs into ERROR; fewer are ridden out
        self.max_failures, self.fail_grace = max_failures, fail_grace
        self.final_wait, self.report_wait = final_wait, report_wait
        self.walltime = walltime
        self._failing_since: float | None = None
        self._jobs: dict[str, TrackedJob] = {}
        self._by_work_dir: dict[str, TrackedJob] = {}
        self._seq = itertools.count(1)
        self._interval = min_interval
        self._next_at = 0.0
        self._failures = 0
        self._alloc: AllocationState | None = None
        self._alloc_checked = False
        self._mpi: dict[str, str | None] = {}
        self._warned: set[str] = set()
        # warm workers (persistent only): an agent per node serves the batches by fork
        self.warm_workers = warm_workers and persistent
        # seconds between monitor rounds (warm batches are files: see cadence)
        self.poll_hint = (CADENCE.warm_hint(local=isinstance(shell, LocalShell))
                          if self.warm_workers else None)
        self._pools: dict[str, AgentPool] = {}
        self._expected: set[str] = set()
        self._watch_at: dict[str, float] = {}  # allocation -> when to look at it next
        self._watched_at: dict[str, float] = {}  # allocation -> when it was last looked at
        self._alive: dict[str, float] = {}  # allocation -> when squeue last said it runs (epoch)
        self._watch_failing: dict[str, float] = {}  # allocation -> since when squeue fails
        self._ended: set[str] = set()  # allocations the scheduler ended during this run
        # this run's record (what it submitted, for the next run after a SIGKILL)
        self.runs = runs or (allocation_manager.runs if allocation_manager else None)
        self._reaped = False
        self._recorded: set[str] = set()  # warm batches noted in this run's record
        self._blockers: dict[str, str] = {}  # job id -> who holds the nodes it waits for
        self._said_failing = 0.0

    def expect(self, specs_nodeids: set[str]) -> None:
        """The run's node ids (before the first submit): one worker session collects all."""
        self._expected |= specs_nodeids
        for pool in self._pools.values():
            pool.expect(specs_nodeids)

    # -- submit -------------------------------------------------------------------
    def submit(self, spec: JobSpec) -> JobHandle:
        """Start the batch without waiting for it; a refused submission comes back as a
        handle in state ERROR (its tests then fail with the scheduler's message)."""
        if self.runs is not None and not self._reaped:
            self._reaped = True  # what killed runs left behind goes first
            reap_dead_runs(self.runs, self.jobs, self.shell,
                           self.slurm_env.user if self.slurm_env else None, self.warn)
        if self.container_runtime == "pyxis" and spec.container_image:
            # inside the image: its python, and the plugin mounted on PYTHONPATH
            spec = spec.model_copy(update={"env": container_env(spec),
                                           "command": in_container_argv(spec.command)})
        self.shell.mkdir(spec.work_dir)
        if self._wraps(spec):
            # docker/podman: the task is a container run of the image (its python)
            self._unwrapped[spec.work_dir] = spec
            script = str(PurePosixPath(spec.work_dir) / CONTAINER_SCRIPT)
            self.shell.write_file(script, wrapper_script())
            env, argv = self._wrapped(spec, spec.command, script)
            spec = spec.model_copy(update={"env": env, "command": argv})
        opts = self._options(spec)
        alloc = self._allocation_for(spec) if self.persistent else None
        try:
            if alloc is not None and self.warm_workers:
                job = self._enqueue(spec, opts, alloc)
            else:
                job = self._launch_step(spec, opts, alloc) if alloc else self._sbatch(spec, opts)
        except SchedulerError as exc:
            handle = JobHandle(job_id=f"unsubmitted-{next(self._seq)}", spec=spec,
                               submitted_at=time.time())
            job = TrackedJob(handle, opts, state=JobState(status=JobStatus.ERROR, reason=str(exc)))
        self._jobs[job.handle.job_id] = job
        self._by_work_dir[spec.work_dir] = job
        if not (job.served or job.waiting):  # the scheduler knows of it: ask soon
            self._wake()
        return job.handle

    def _sbatch(self, spec: JobSpec, opts: SlurmOptions) -> TrackedJob:
        script = render_sbatch(spec, gres_style=opts.gres_style, mpi=opts.mpi,
                               launcher_prefix=opts.launcher_prefix, gres_type=opts.gres_type,
                               container=opts.container)
        path = str(PurePosixPath(spec.work_dir) / "job.sbatch")
        self.shell.write_file(path, script)
        job_id = self.jobs.sbatch(path, cwd=spec.work_dir)
        if self.runs is not None:
            self.runs.add_job(job_id, spec.job_name)
        return TrackedJob(JobHandle(job_id=job_id, spec=spec, submitted_at=time.time()), opts)

    def _launch_step(self, spec: JobSpec, opts: SlurmOptions, alloc: AllocationState) -> TrackedJob:
        handle = JobHandle(job_id=f"{alloc.job_id}~{next(self._seq)}", spec=spec,
                           submitted_at=time.time(), nodelist=alloc.nodelist)
        job = TrackedJob(handle, opts, alloc=alloc, share=step_share(spec, alloc))
        self._start_step(job)
        return job

    def _enqueue(self, spec: JobSpec, opts: SlurmOptions, alloc: AllocationState) -> TrackedJob:
        """Warm workers: the allocation's pool places the batch (now or once GPUs free up);
        it runs in a worker's fork, or (MPI across nodes) as a step on whole nodes."""
        pool = self._pools.get(alloc.job_id)
        if pool is None:
            pool = AgentPool(self.shell, alloc, gres_style=opts.gres_style,
                             gres_type=opts.gres_type, warn=self.warn)
            pool.expect(self._expected)
            self._pools[alloc.job_id] = pool
        handle = JobHandle(job_id=f"{alloc.job_id}~w{next(self._seq)}", spec=spec,
                           submitted_at=time.time(), nodelist=alloc.nodelist)
        job = TrackedJob(handle, opts, alloc=alloc, share=step_share(spec, alloc),
                         life=Lifecycle(Phase.WAITING))
        warm = serves_warm(spec)
        job.warm = pool.add(handle.job_id, spec, warm=warm,
                            gated=not warm and self._gates(spec), life=job.life)
        if not pool.warmed and job.warm.warm:
            pool.warmed = True
            pool.warm_up(spec)
        self._jobs[handle.job_id] = job
        pool.place_waiting(self._start_granted_step)
        self._sync_warm(job)
        return job

    def _record_warm(self, job: TrackedJob) -> None:
        """Note a batch sent to a session in this run's record (once), so that the next run
        can cancel it if this controller is killed."""
        sent = job.warm.sent if job.warm else None
        if (self.runs is None or sent is None or not sent.session
                or job.handle.job_id in self._recorded):
            return
        self._recorded.add(job.handle.job_id)
        self.runs.add_warm(sent.session, sent.request_name)

    def _gates(self, spec: JobSpec) -> bool:
        """A step worth launching before its nodes are free: the worker plugin's ranks
        (they wait at the gate after collecting), not a docker/podman-wrapped task (the
        gate's variables would not reach inside)."""
        return spec.workflow == "pytest" and bool(spec.nodeids) and not self._wraps(spec)

    def _start_granted_step(self, job_id: str, warm: WarmJob) -> None:
        """A step the pool gave whole nodes (or set them aside for a gated step): pinned
        to them, sharing them with the agents."""
        job = self._jobs[job_id]
        assert warm.placement is not None or warm.gated
        nodes = ",".join(n.name for n in (warm.placement.nodes if warm.placement
                                          else warm.reserved))
        base = job.share or StepShare()
        job.share = StepShare(cpus_per_task=base.cpus_per_task, mem_mb=base.mem_mb,
                              overlap=True, extra=(*base.extra, f"--nodelist={nodes}"))
        try:
            if warm.gated:
                self.shell.mkdir(warm.gate_dir)
                job.extra_env = {GATE_ENV: warm.gate_dir,
                                 GATE_WAIT_ENV: str(job.handle.spec.monitor_timeout_seconds)}
            self._start_step(job)
            self._wake()
        except (SchedulerError, ExecutionError, OSError) as exc:
            job.state = JobState(status=JobStatus.ERROR, reason=str(exc))
            warm.state = job.state

    def _sync_warm(self, job: TrackedJob) -> None:
        """A served or waiting batch shows the pool's view of it."""
        warm = job.warm
        if warm is None or not (job.served or job.waiting) or job.state.status.finished:
            return
        job.state = warm.state
        if warm.placement is not None:
            job.handle.nodelist = ",".join(n.name for n in warm.placement.nodes)
            self._record_warm(job)
        if job.state.status is JobStatus.RUNNING and job.handle.started_at is None:
            job.handle.started_at = time.time()

    def _start_step(self, job: TrackedJob) -> None:
        spec, opts, alloc = job.handle.spec, job.opts, job.alloc
        assert alloc is not None
        # a re-used work dir must not show the previous launch's step id or exit code
        self.shell.run(["rm", "-f", job.path("stepid"), job.path("srun.pid"),
                        job.path("exit_code")], timeout=30)
        argv = render_step_command(
            spec, alloc.job_id, gres_style=opts.gres_style, mpi=opts.mpi,
            launcher_prefix=opts.launcher_prefix, gres_type=opts.gres_type, share=job.share,
            stepid_path=job.path("stepid"), container=opts.container,
        )
        launcher = render_step_launcher(
            argv, log_path=spec.log_path, pid_path=job.path("srun.pid"),
            exit_path=job.path("exit_code"), cwd=spec.invocation_dir or spec.rootdir,
            env={**spec.env, **job.extra_env},
        )
        step_sh = job.path("step.sh")
        self.shell.write_file(step_sh, launcher)
        if self.runs is not None:
            self.runs.add_step(alloc.job_id, spec.work_dir)
        # a launch cut by a dropped connection may have started: never launch it twice
        res = self.shell.run(["setsid", "-f", "bash", step_sh], timeout=30, retry_on_drop=False)
        if not res.ok:
            raise SchedulerError(res)
        job.launched_at = time.monotonic()

    def _allocation_for(self, spec: JobSpec) -> AllocationState | None:
        """The persistent allocation when it can serve ``spec``; None -> run one-shot."""
        assert self.allocations is not None
        if not self._alloc_checked:
            self._alloc_checked = True
            try:
                self._alloc = self.allocations.ensure()
            except ExecutionError as exc:  # e.g. the queue is too busy: sbatch still queues
                self.warn(f"No persistent allocation ({exc}); batches run as one-shot jobs.")
                self._alloc = None
            if self._alloc is not None:
                self.allocations.check_gpu_processes(self._alloc)
        if self._alloc is None:
            return None
        why = self._alloc.serves(spec)
        if why is not None:
            self._warn_once(f"serves:{why}", f"Batch {spec.name} does not fit allocation "
                            f"{self._alloc.job_id} ({why}); it runs as a one-shot job.")
            return None
        if spec.time_limit and f"time:{spec.time_limit}" not in self._warned:
            self._warned.add(f"time:{spec.time_limit}")
            self.allocations.check_time(self._alloc, spec)
        return self._alloc

    def _wraps(self, spec: JobSpec) -> bool:
        return self.container_runtime in WRAPPING_RUNTIMES and bool(spec.container_image)

    def _wrapped(self, spec: JobSpec, command: Sequence[str],
                 script: str | None) -> tuple[dict[str, str], list[str]]:
        """(env to export, task argv): ``command`` run by the image's python inside a
        docker/podman container of the batch's image, with the repo, invocation and work
        dirs and the JobSpec's mounts at their host paths, the invocation dir as working
        directory, the job's env names (``-e NAME``; the values are exported before srun;
        those the engine CLI reads itself as ``CENV_PREFIX + NAME``, which the wrapper
        passes through ``--env-file``, a pipe), the step's GPUs,
        TensorRT-LLM's resource flags and a label naming the batch. An MPI batch's
        launcher prefix runs inside the container too."""
        assert spec.container_image
        env = container_env(spec)
        in_file = {k: v for k, v in env.items() if client_sensitive(k)}
        env_file_text(in_file)  # ValueError now for a value the wrapper could not pass
        flags = list(self.container_run_flags)
        passed = {k: v for k, v in env.items() if k not in in_file}  # -e NAME
        exported = {**passed, **{CENV_PREFIX + k: v for k, v in in_file.items()}}
        prefix = list(self.launcher_prefix) if spec.launch is Launch.MPI else []
        runtime: Engine = "podman" if self.container_runtime == "podman" else "docker"
        argv = wrap_in_container(
            [*prefix, *in_container_argv(command)], runtime, spec.container_image,
            name_prefix=f"trtllm-{spec.name}", mounts=job_mounts(spec),
            workdir=workdir_of(spec), env_names=sorted(passed),
            gpus=spec.devices_per_node > 0, run_flags=flags,
            labels={JOB_LABEL: spec.job_name}, script=script,
        )
        return exported, argv

    def _options(self, spec: JobSpec) -> SlurmOptions:
        # a wrapped batch has its launcher prefix inside the container (see _wrapped)
        prefix = () if self._wraps(spec) else self.launcher_prefix
        base = options_for(spec.model_copy(update={"slurm_env": spec.slurm_env or self.slurm_env}),
                           launcher_prefix=prefix)
        mpi = self._usable_mpi(spec, base.mpi) if spec.launch is Launch.MPI else base.mpi
        return SlurmOptions(base.gres_style, base.gres_type, mpi, base.launcher_prefix,
                            self._container_for(spec))

    def _container_for(self, spec: JobSpec) -> ContainerOptions | None:
        """pyxis flags for a batch with an image: one container name per image (and account),
        the same in every step, so a persistent allocation imports each image once per node."""
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
            self._warn_once(f"mpi:{preferred}", f"srun --mpi={preferred} is listed but does not "
                            f"load here; using {chosen or 'the MpiDefault'}.")
        self._mpi[key] = chosen
        return chosen

    # -- poll -----------------------------------------------------------------------
    def poll(self, handles: list[JobHandle]) -> dict[str, JobState]:
        jobs = [self._jobs[h.job_id] for h in handles if h.job_id in self._jobs]
        self._poll_warm(jobs)
        now = time.monotonic()
        for job in jobs:
            if job.alloc is not None and job.state.status.finished and job.ended_wall is None:
                job.ended_wall = time.time()
        self._watch_allocations(jobs, now)
        for job in jobs:  # served batches: files only, every call
            if job.served and job.state.status.finished and not job.settled and (
                    self._confirmed(job) and self._reports_settled(job, now)):
                job.life.settle()
        # what the scheduler reports on, polled at the adaptive interval
        active = [j for j in jobs if not j.state.status.finished and not j.served
                  and not j.waiting]
        unsettled = [j for j in jobs if j.state.status.finished and not j.settled
                     and not j.served]
        if (active or unsettled) and now >= self._next_at:
            asked = [*active, *unsettled]
            before = {j.handle.job_id: visible_state(j).status for j in asked}
            try:
                if active:
                    self._refresh(active)
                self._failures, self._failing_since = 0, None
            except SchedulerError as exc:
                self._failures += 1
                self._failing_since = self._failing_since or now
                self._say_failing(exc, now)
                if self._failures >= self.max_failures and (
                        now - self._failing_since >= self.fail_grace):
                    for job in active:
                        job.state = JobState(status=JobStatus.ERROR, reason=(
                            f"scheduler not answering ({self._failures} tries): {exc}"))
            for job in jobs:  # those that ended just now too
                if job.state.status.finished and not job.settled and not job.served and (
                        self._confirmed(job) and self._reports_settled(job, now)):
                    job.life.settle()
            # nodes of steps that ended here are given back by the next call's _poll_warm
            # (a status, not a pending reason: "Priority" -> "Resources" needs no hurry)
            changed = any(visible_state(j).status != before[j.handle.job_id] for j in asked)
            self._interval = CADENCE.next_scheduler_interval(
                self._interval, changed=changed, low=self.min_interval, high=self.max_interval)
            self._next_at = time.monotonic() + self._interval
        return {j.handle.job_id: self._shown(j) for j in jobs}

    def _shown(self, job: TrackedJob) -> JobState:
        """The monitor's view; a served batch's carries when its allocation was last seen
        running (its reports wait until the scheduler vouched for the time they ended)."""
        state = visible_state(job)
        if job.alloc is not None and not state.status.finished:
            state = state.model_copy(update={"alive_at": self._alive.get(job.alloc.job_id, 0.0)})
        return state

    def _confirmed(self, job: TrackedJob) -> bool:
        """A batch in the allocation (served, or a step: a node set DOWN with its slurmd
        dead keeps its processes) shows its end once the scheduler, asked after it ended,
        still had the allocation running (else the allocation's end decides)."""
        if job.alloc is None:
            return True
        return self._alive.get(job.alloc.job_id, 0.0) >= (job.ended_wall or 0.0)

    def _watch_allocations(self, jobs: list[TrackedJob], now: float) -> None:
        """Every ``CADENCE.alloc_watch`` s, one squeue of each allocation running this run's
        batches: a failed node (NODE_FAIL), its time limit or a scancel ends it, and the
        batches' files alone would not say so (a DOWN node's processes may live on)."""
        watched = {j.alloc.job_id for j in jobs if j.alloc is not None
                   and not j.state.status.finished}
        ending = {j.alloc.job_id for j in jobs if j.alloc is not None
                  and j.state.status.finished and not j.settled and not self._confirmed(j)}
        for alloc_id in watched | ending:
            due = self._watch_at.get(alloc_id, 0.0)
            if alloc_id in ending:  # a batch waits for this look to show its end
                due = min(due, self._watched_at.get(alloc_id, 0.0) + CADENCE.alloc_watch_gap)
            if now < due or alloc_id in self._ended:
                continue
            self._watched_at[alloc_id] = now
            self._watch_at[alloc_id] = now + CADENCE.alloc_watch
            asked = time.time()
            try:
                row = self.jobs.squeue_jobs([alloc_id]).get(alloc_id)
                self._watch_failing.pop(alloc_id, None)
                if row is not None and row.state in ("RUNNING", "SUSPENDED"):
                    self._alive[alloc_id] = asked
                    continue
                self._check_allocation(alloc_id)
            except SchedulerError as exc:
                # a slurmctld restart is ridden out (results wait); a longer outage must
                # not hold them forever: after fail_grace the agents' files are trusted
                since = self._watch_failing.setdefault(alloc_id, now)
                if now - since >= self.fail_grace:
                    self._alive[alloc_id] = asked
                    self._warn_once(f"watch:{alloc_id}", (
                        f"The scheduler has not answered for {now - since:.0f} s ({exc}); "
                        f"results of allocation {alloc_id} are shown from the warm workers' "
                        "files without its confirmation."))

    def _check_allocation(self, alloc_id: str) -> bool:
        """Has the scheduler ended the allocation? Then every unfinished batch in it ends
        with the allocation's state (NODE_FAIL, TIMEOUT, ...), its end time attached (no
        report written later counts), this run's sessions there are stopped, and the next
        batch asks for a new allocation. True when it ended."""
        if alloc_id in self._ended:
            return True
        ended = self.jobs.ended(alloc_id)
        if ended is None:
            return False
        row, end = ended
        # Slurm's end time is in whole seconds: our own last look that found it running,
        # when later, is the closer bound (what ended before it surely counts)
        end = max(end or 0.0, self._alive.get(alloc_id, 0.0)) or None
        self._ended.add(alloc_id)
        status = map_slurm_state(row.state)
        if status is JobStatus.COMPLETED:
            status = JobStatus.ERROR
        why = f"allocation {alloc_id} ended: {row.state}" + (
            f" on {row.nodelist}" if row.nodelist else "") + (
            f" ({row.reason})" if row.reason and row.reason != "None" else "")
        for job in self._jobs.values():  # and those whose end was not vouched for
            if job.alloc is None or job.alloc.job_id != alloc_id or job.settled:
                continue
            job.state = JobState(status=status, nodelist=job.state.nodelist, reason=why,
                                 ended_at=end)
            job.life.settle()
            if job.warm is not None:
                job.warm.state = job.state
                job.warm.cancelled = True
        pool = self._pools.get(alloc_id)
        if pool is not None:
            pool.close()
        if self._alloc is not None and self._alloc.job_id == alloc_id:
            self._alloc, self._alloc_checked = None, False  # the next batch: a new one
        self.warn(f"{why[0].upper()}{why[1:]}; the tests that had not started run again "
                  "in a new allocation.")
        self._wake()
        return True

    def _say_failing(self, exc: SchedulerError, now: float) -> None:
        """A scheduler outage is not silent: from the second failure in a row, a line at
        most every 30 s with what fails and since when."""
        if self._failures < 2 or now - self._said_failing < 30.0:
            return
        self._said_failing = now
        since = time.strftime("%H:%M:%S", time.localtime(
            time.time() - (now - (self._failing_since or now))))
        first = (str(exc).splitlines() or ["?"])[0]
        self.warn(f"The scheduler has not answered since {since} ({self._failures} tries; "
                  f"last: {first}); still waiting for it.")

    def _poll_warm(self, jobs: list[TrackedJob]) -> None:
        """Every call (files only, no scheduler): served batches' states, pool slots of
        ended steps given back, held-back batches placed."""
        if not self._pools:
            return
        for job in jobs:
            warm = job.warm
            if warm is None or job.alloc is None:
                continue
            if job.served and not job.state.status.finished:
                self._pools[job.alloc.job_id].refresh(warm)
                self._sync_warm(job)
            elif not job.state.status.finished and warm.placement is not None:
                pool = self._pools[job.alloc.job_id]
                if pool.ranks_exited(warm):  # its state still comes from srun and sacct
                    pool.release(warm)
                elif self._read(job.path("exit_code")).strip() == "0":
                    # a step of the pool that srun says succeeded: its nodes are needed
                    # now, not after the next squeue and sacct (a failure still goes that way)
                    job.state = JobState(status=JobStatus.COMPLETED, exit_code=0,
                                         nodelist=job.state.nodelist)
        self._place_waiting()
        for job in jobs:
            self._sync_warm(job)

    def _place_waiting(self) -> None:
        """Give back the nodes of the pool's steps that ended (the monitor stops asking
        about a job once it ended, so look at all of them), then start what now fits."""
        for job in self._jobs.values():
            warm = job.warm
            if (warm is None or job.alloc is None or job.served
                    or not job.state.status.finished):
                continue
            if warm.placement and warm.placement.gpus:
                self._pools[job.alloc.job_id].release(warm)
            elif warm.reserved and warm.placement is None and not warm.cancelled:
                self._pools[job.alloc.job_id].drop(warm)
        for pool in self._pools.values():  # a step it launches wakes the scheduler polls
            pool.place_waiting(self._start_granted_step)

    def _reports_settled(self, job: TrackedJob, now: float) -> bool:
        """Shared file systems lag: a job can end before its last report lines are visible
        here. A batch whose process ended (exit code, sacct) has closed its reports file,
        so after one refresh of the directory's attribute cache what is there is all there
        is: a crash (no ``session_finish`` line, ever) is decided at once. Only a batch
        that exited 0 (a clean pytest always writes the line) waits for it, bounded by
        ``report_wait``."""
        if job.state.status not in (JobStatus.COMPLETED, JobStatus.FAILED):
            return True
        if self._session_finished(job):
            return True
        if job.settle_since is None:
            job.settle_since = now
            self.shell.run(["ls", "-a", job.handle.spec.work_dir], timeout=30)  # NFS refresh
            if self._session_finished(job):
                return True
        if job.state.status is not JobStatus.COMPLETED:
            return True
        return now - job.settle_since >= self.report_wait

    def _session_finished(self, job: TrackedJob) -> bool:
        path = job.handle.spec.reports_path
        tail = self.shell.read_from(path, max(0, self.shell.size(path) - 4096))
        return b'"session_finish"' in tail

    def _refresh(self, active: list[TrackedJob]) -> None:
        oneshot = [j for j in active if not j.is_step]
        if oneshot:
            self._refresh_jobs(oneshot)
        by_alloc: dict[str, list[TrackedJob]] = {}
        for job in active:
            if job.alloc is not None:
                by_alloc.setdefault(job.alloc.job_id, []).append(job)
        for alloc_id, steps in by_alloc.items():
            self._refresh_steps(alloc_id, steps)

    def _refresh_jobs(self, jobs: list[TrackedJob]) -> None:
        rows = self.jobs.squeue_jobs([j.handle.job_id for j in jobs])
        left: list[TrackedJob] = []
        for job in jobs:
            row = rows.get(job.handle.job_id)
            status = map_slurm_state(row.state) if row else None
            if row is not None and status is not None and not status.finished:
                reason = row.reason if status is JobStatus.PENDING else None
                if reason in WAITING_REASONS:
                    reason = self._with_blocker(job, reason)
                job.state = JobState(status=status, nodelist=row.nodelist, reason=reason)
                if status is JobStatus.PENDING and self.walltime and not job.negotiated:
                    self._negotiate(job, row)
                if status is JobStatus.RUNNING and job.handle.started_at is None:
                    job.handle.started_at = time.time()
            else:
                left.append(job)
        if left:
            self._finalize_jobs(left)

    def _with_blocker(self, job: TrackedJob, reason: str) -> str:
        """A waiting job's reason, plus the user's own allocation when one holds nodes of
        its partition (asked once per job, once it has waited BLOCKER_AFTER seconds)."""
        job_id = job.handle.job_id
        if (job_id not in self._blockers and self.slurm_env is not None
                and self.slurm_env.user
                and time.time() - job.handle.submitted_at >= BLOCKER_AFTER):
            self._blockers[job_id] = blocker_note(
                self.jobs, self.slurm_env.user, job.handle.spec.partition,
                one_shot=not self.persistent) or ""
        note = self._blockers.get(job_id)
        return f"{reason}: {note}" if note else reason

    def _negotiate(self, job: TrackedJob, row: QueueRow) -> None:
        """Shorten the time limit of a job that would wait long (seed: walltime strategy)."""
        policy = self.walltime
        assert policy is not None
        if time.time() - job.handle.submitted_at < policy.pending_after:
            return
        job.negotiated = True
        wait = seconds_until(row.start)
        if wait is not None and wait <= policy.far_start:
            return
        have, want = parse_duration(row.time_limit), parse_duration(policy.new_limit)
        if have is None or want is None or want >= have:
            return
        res = self.jobs.set_time_limit(job.handle.job_id, policy.new_limit)
        eta = f"estimated start {row.start}" if wait is not None else "no estimated start"
        if res.ok:
            self.warn(f"Reduced the time limit of job {job.handle.job_id} ({job.handle.spec.name})"
                      f" from {row.time_limit} to {policy.new_limit} for faster scheduling "
                      f"({eta}); it now has less time to run.")
        else:
            self.warn(f"Could not shorten job {job.handle.job_id}: {res.describe()}")

    def _finalize_jobs(self, jobs: list[TrackedJob]) -> None:
        """Jobs no longer queued: final state from sacct, else scontrol, within final_wait."""
        now = time.monotonic()
        for job in jobs:
            job.left_at = job.left_at or now
        rows: dict[str, AcctRow] = {}
        if self.jobs.accounting is not False:
            rows = self.jobs.sacct([j.handle.job_id for j in jobs])
        failed = [i for i, r in rows.items() if map_slurm_state(r.state) is JobStatus.FAILED]
        for job_id, step in (self.jobs.failed_steps(failed) if failed else {}).items():
            was = rows[job_id]
            if step.state.startswith("OUT_OF_MEMORY"):
                rows[job_id] = AcctRow(job_id, "OUT_OF_MEMORY", was.exit_code, was.signal,
                                       was.nodelist, f"step {step.job_id} ran out of memory")
            elif step.signal and not was.signal:  # srun's exit code is the task's signal
                rows[job_id] = AcctRow(job_id, was.state, None, step.signal, was.nodelist,
                                       f"step {step.job_id}: {step.state}")
        for job in jobs:
            row = rows.get(job.handle.job_id)
            if row is None and self.jobs.accounting is False:
                row = self.jobs.scontrol_job(job.handle.job_id)
            if row is not None and map_slurm_state(row.state).finished:
                job.state = final_state(job, row)
            elif now - (job.left_at or now) > self.final_wait:
                job.state = JobState(status=JobStatus.ERROR, nodelist=job.state.nodelist,
                                     reason=f"job {job.handle.job_id} left the queue but its "
                                     f"final state is unknown after {self.final_wait:.0f} s")
            else:
                job.state = JobState(status=JobStatus.RUNNING, nodelist=job.state.nodelist)

    def _refresh_steps(self, alloc_id: str, jobs: list[TrackedJob]) -> None:
        # a gated step waiting at its gate is followed through its files alone
        steps = self.jobs.squeue_steps(alloc_id) if any(
            j.warm is None or not j.warm.launched_early for j in jobs) else {}
        if steps is None and self._check_allocation(alloc_id):
            return
        ended: list[tuple[TrackedJob, int]] = []
        now = time.monotonic()
        for job in jobs:
            if job.step_id is None:
                text = self._read(job.path("stepid")).strip()
                if text.isdigit():
                    job.step_id = f"{alloc_id}.{text}"
            code_text = self._read(job.path("exit_code")).strip()
            if code_text.lstrip("-").isdigit():
                ended.append((job, int(code_text)))
            elif job.warm is not None and job.warm.launched_early:
                self._hold_at_gate(job, now)
            elif job.step_id is not None and steps is not None and job.step_id in steps:
                row = steps[job.step_id]
                job.state = JobState(status=JobStatus.RUNNING, nodelist=row.nodelist)
                if job.handle.started_at is None:
                    job.handle.started_at = time.time()
            elif job.step_id is None:
                if not self._read(job.path("srun.pid")) and now - job.launched_at > 30:
                    job.state = JobState(status=JobStatus.ERROR, reason=(
                        f"the step launcher {job.path('step.sh')} did not start"))
                elif steps is None:
                    job.state = JobState(status=JobStatus.PENDING,
                                         reason=f"allocation {alloc_id} is gone")
                else:
                    job.state = JobState(status=JobStatus.PENDING, reason="StepResources")
            else:  # step left the queue; the launcher writes the exit code any moment
                job.left_at = job.left_at or now
                if now - job.left_at > self.final_wait:
                    ended.append((job, -1))
        if ended:
            self._finalize_steps(ended)

    def _hold_at_gate(self, job: TrackedJob, now: float) -> None:
        """A gated step before its gate opens shows as pending (the monitor's timeout
        starts when it runs); ranks that never get ready within the monitor timeout
        (e.g. an import that hangs) end it."""
        assert job.warm is not None
        limit = job.handle.spec.monitor_timeout_seconds
        if not job.warm.ready and job.launched_at and now - job.launched_at > limit:
            self._cancel([job])
            job.state = JobState(status=JobStatus.TIMEOUT, reason=(
                f"its ranks did not finish collecting within the monitor timeout ({limit} s);"
                f" see {job.handle.spec.log_path}"))
            return
        job.state = job.warm.state

    def _finalize_steps(self, ended: list[tuple[TrackedJob, int]]) -> None:
        """Final step states: sacct of ``<alloc>.<step>`` (OUT_OF_MEMORY, TIMEOUT and
        CANCELLED show there), else the exit code srun returned."""
        ids = [j.step_id for j, _ in ended if j.step_id]
        rows: dict[str, AcctRow] = {}
        if ids and self.jobs.accounting is not False:
            rows = self.jobs.sacct(ids, steps=True)
        # a step that Slurm ended without us asking: did its allocation end (a failed node)?
        suspects = {j.alloc.job_id for j, code in ended if j.alloc is not None and not j.cancelled
                    and (code != 0 or map_slurm_state(
                        rows[j.step_id].state if j.step_id in rows else "COMPLETED")
                        is not JobStatus.COMPLETED)}
        gone = {a for a in suspects if self._check_allocation(a)}
        now = time.monotonic()
        for job, code in ended:
            if job.alloc is not None and job.alloc.job_id in gone:
                continue  # _check_allocation gave it the allocation's end
            row = rows.get(job.step_id or "")
            if row is not None and map_slurm_state(row.state).finished:
                job.state = final_state(job, row, exit_code=code if code >= 0 else None)
                continue
            job.left_at = job.left_at or now
            if job.step_id and self.jobs.accounting is not False and now - job.left_at < 10:
                job.state = JobState(status=JobStatus.RUNNING, nodelist=job.state.nodelist)
                continue  # accounting lags a little behind srun's exit
            job.state = exit_code_state(job, code)

    def _read(self, path: str) -> str:
        return self.shell.read_from(path, 0, 4096).decode("utf-8", "replace")

    # -- cancel / close -------------------------------------------------------------------
    def cancel(self, handle: JobHandle) -> None:
        """Cancel one batch: its job, or its step (never the allocation)."""
        job = self._jobs.get(handle.job_id)
        if job is None or job.state.status.finished:
            return
        self._cancel([job])

    def _cancel(self, jobs: list[TrackedJob]) -> None:
        self._stop_containers(jobs)
        ids: list[str] = []
        for job in jobs:
            job.cancelled = True
            if job.warm is not None and (job.served or job.waiting):
                assert job.alloc is not None
                self._pools[job.alloc.job_id].cancel(job.warm)
                self._sync_warm(job)
                continue
            if job.is_step:
                if job.step_id is None:
                    text = self._read(job.path("stepid")).strip()
                    if text.isdigit() and job.alloc is not None:
                        job.step_id = f"{job.alloc.job_id}.{text}"
                if job.step_id:
                    ids.append(job.step_id)
                pid = self._read(job.path("srun.pid")).strip()
                if pid.isdigit():  # also stops an srun still waiting for its step
                    self.shell.run(["kill", "-TERM", pid], timeout=30)
            elif not job.handle.job_id.startswith("unsubmitted-"):
                ids.append(job.handle.job_id)
        if ids:
            self.jobs.scancel(ids)
        self._wake()

    def _stop_containers(self, jobs: list[TrackedJob]) -> None:
        """Steps wrapped in a docker/podman run: SIGTERM first, so the wrapper removes its
        container. A cancelled step (``scancel <alloc>.<step>``, or srun killed) gets
        SIGKILL at once, which would leave the container running in the engine's daemon.
        Waits (up to ``CONTAINER_STOP_WAIT`` s) for the steps' exit codes."""
        steps = []
        for job in jobs:
            if not (job.is_step and self._wraps(job.handle.spec) and job.alloc is not None
                    and not (job.warm is not None and (job.served or job.waiting))):
                continue
            if job.step_id is None:
                text = self._read(job.path("stepid")).strip()
                if text.isdigit():
                    job.step_id = f"{job.alloc.job_id}.{text}"
            if job.step_id:
                steps.append(job)
        if not steps:
            return
        self.jobs.run(["scancel", "--signal=TERM", *(j.step_id or "" for j in steps)])
        end = time.monotonic() + CONTAINER_STOP_WAIT
        while time.monotonic() < end and any(
                not self._read(j.path("exit_code")).strip() for j in steps):
            time.sleep(0.2)

    def close(self) -> None:
        """Cancel every unfinished job and step of this run; the allocation stays."""
        self._cancel([j for j in self._jobs.values() if not j.state.status.finished])
        for pool in self._pools.values():
            pool.close()
        if self.allocations is not None:
            self.allocations.close()  # this run's lease on the allocation and its record
        elif self.runs is not None:
            self.runs.finish()

    # -- helpers ----------------------------------------------------------------------------
    def rerun_command(self, spec: JobSpec, nodeid: str) -> str:
        job = self._by_work_dir.get(spec.work_dir)
        opts = job.opts if job else self._options(spec)
        assign = ""
        if self._wraps(spec):
            # the same container run around a plain pytest of ``nodeid``; the env the
            # launcher exported is set on the line (secret-looking values are left to
            # your shell: srun passes its environment on, -e NAME takes it from there)
            base = self._unwrapped.get(spec.work_dir, spec)
            script = str(PurePosixPath(base.work_dir) / CONTAINER_SCRIPT)
            env, argv = self._wrapped(base.masked(), rerun_argv(base, nodeid),
                                      script if job is not None else None)
            assign = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())
                              if not is_secret(k, base.env.get(k.removeprefix(CENV_PREFIX), v)))
            spec = base.model_copy(update={"command": argv, "rerun_argv": []})
        if job is not None and job.alloc is not None:
            text = render_rerun_step(spec, nodeid, job.alloc.job_id, opts, job.share)
            if assign:  # "cd DIR && NAME=VALUE ... srun ..."
                head, sep, tail = text.partition(" && ")
                text = f"{head}{sep}{assign} {tail}"
            return text
        text = render_rerun_sbatch(spec, nodeid, opts)
        return f"{assign} {text}" if assign else text

    def _wake(self) -> None:
        self._interval = self.min_interval
        self._next_at = 0.0

    def _warn_once(self, key: str, msg: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            self.warn(msg)
