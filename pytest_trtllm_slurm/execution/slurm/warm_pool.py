"""Warm workers in a persistent allocation, seen from the controller: one agent per node
(a step that outlives the run) forks a session per run that forks a child per batch; the
controller talks to them through mailbox files only (no step per batch, no step polling).
The pool also places the run's batches (best fit by free GPUs); a multi-node MPI step gets
whole nodes, launched *gated* early so its ranks collect while others run there."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pytest_trtllm_slurm.errors import ExecutionError
from pytest_trtllm_slurm.execution.cadence import CADENCE
from pytest_trtllm_slurm.execution.disk import space_problem
from pytest_trtllm_slurm.execution.outcome import (
    CRASH_SIGNALS,
    JobState,
    JobStatus,
    signal_name,
    signal_of_exit_code,
)
from pytest_trtllm_slurm.execution.pushed_files import SmallFiles
from pytest_trtllm_slurm.execution.records import BadRecord, Heartbeat, validated
from pytest_trtllm_slurm.execution.render.scripts import gpu_flag, render_step_launcher
from pytest_trtllm_slurm.execution.slurm.allocation import AllocationState
from pytest_trtllm_slurm.execution.slurm.early_sessions import EarlySessions
from pytest_trtllm_slurm.execution.slurm.jobs import StepRow
from pytest_trtllm_slurm.execution.slurm.lifecycle import FollowsState, Lifecycle, Phase
from pytest_trtllm_slurm.execution.slurm.parse import expand_hostlist
from pytest_trtllm_slurm.execution.slurm.placement import (
    BestFit,
    Placement,
    Request,
    give_back,
    take,
)
from pytest_trtllm_slurm.node import assignment
from pytest_trtllm_slurm.node.assignment import key_path, pairs
from pytest_trtllm_slurm.node.paths import (
    HEARTBEAT,
    Agent,
    Batch,
    Gate,
    Session,
    WorkRoot,
    name_of,
    root_of,
)
from pytest_trtllm_slurm.node.protocol import EARLY_MISS
from pytest_trtllm_slurm.planning.jobspec import JobSpec
from pytest_trtllm_slurm.planning.masking import (
    hidden_env,
    is_secret,
    only_secrets,
    shown_env,
    without_secrets,
)
from pytest_trtllm_slurm.transport import file_ops
from pytest_trtllm_slurm.transport.file_ops import FileOp, run_ops
from pytest_trtllm_slurm.transport.shell import LocalShell, Shell

log = logging.getLogger(__name__)

AGENT_START_GRACE = 60.0  # seconds an agent may take to write its first heartbeat
HEARTBEAT_STALE = 30.0
# a heartbeat this old asks the scheduler whether the agent's step is still listed (one
# gone without an exit code is lost now, not HEARTBEAT_STALE later)
HEARTBEAT_LATE = 5.0


@dataclass
class Node:
    name: str
    gpus: int
    used: int = 0
    agent_dir: str = ""
    agent_started: float | None = None  # when this run launched its agent
    healthy_at: float | None = None
    session: str | None = None  # this run's session dir on this node
    session_ids: frozenset[str] | None = frozenset()  # None: all the run's arguments select
    session_checked: float = 0.0  # when the session's exit code may be looked at again
    session_ended: str | None = None  # the session dir whose exit code appeared


@dataclass(frozen=True)
class Delivery:
    """Where a served batch's request went and where its fork writes its pid and exit code."""

    node: Node
    session: str  # the session the request went to
    request_name: str
    pid_path: str
    exit_path: str
    news: str = ""  # its news folder and its notice's name there (``execution.news``)
    notice: str = ""


class WarmJob(FollowsState):
    """A batch as the pool sees it; ``life`` (WAITING until placed) is the executor's too."""

    def __init__(self, spec: JobSpec, warm: bool, *, job_id: str = "", gated: bool = False,
                 life: Lifecycle | None = None) -> None:
        self.spec = spec
        self.warm = warm  # served by an agent (else: a step the executor launches once placed)
        self.job_id = job_id
        self.life = life or Lifecycle(Phase.WAITING)
        self.state = JobState(status=JobStatus.PENDING,
                              reason="waiting for GPUs in the allocation")
        self.placement: Placement[Node] | None = None
        self.sent: Delivery | None = None  # a served batch's request, once written
        self.cancelled = False
        self.gated = gated  # a step launched before its nodes are free (see ``gate``)
        self.reserved: list[Node] = []  # a gated step's nodes, once launched
        self.gate_dir = ""
        self.ready = False  # every rank of the gated step has collected
        self.ranks = 0  # how many (rank 0 writes it in ``ready``)
        self.done = 0  # ranks whose interpreter has exited (``done.<rank>``), counted in order
        self.gate_watched = False  # its gate's files are pushed where the shell pushes
        self.folder_stamp: int | None = None  # its work dir's mtime at the last read
        self.next_read = 0.0  # monotonic: its pid and exit code are read by then anyway

    @property
    def launched_early(self) -> bool:
        """A gated step that runs (collecting, or waiting at its gate) without GPUs yet."""
        return self.life.phase is Phase.EARLY


class AgentPool:
    """The agents of one allocation and this run's batches in it."""

    def __init__(self, shell: Shell, alloc: AllocationState, *, gres_style: str = "gres",
                 gres_type: str | None = None, warn: Callable[[str], None] | None = None,
                 list_steps: Callable[[str], dict[str, StepRow] | None] | None = None,
                 early: EarlySessions | None = None, files: SmallFiles | None = None,
                 notes: Callable[[str, Delivery], list[FileOp]] | None = None) -> None:
        self.shell = shell
        # written ahead of a batch's request in its round trip (its run-registry note)
        self.notes = notes or (lambda job_id, sent: [])
        self.files = files or SmallFiles(shell)  # batches' pids and exit codes
        self.early = early or EarlySessions()  # sessions the run started before it collected
        self.list_steps = list_steps  # the scheduler's running steps of an allocation
        self.placer = BestFit()
        self.alloc = alloc
        self.gres_style = gres_style
        self.gres_type = gres_type
        self.warn = warn or (lambda msg: None)
        names = expand_hostlist(alloc.nodelist or "") or ["node0"]
        self.nodes = [Node(n, alloc.gpus_per_node) for n in names]
        self.run_id = f"{time.strftime('%Y%m%d_%H%M%S')}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        self.jobs: dict[str, WarmJob] = {}
        self.order: list[str] = []  # submission order: placement is first come, with backfill
        # the run's tests (node id -> key, ``node.item_key``): one session per node collects all
        self.expected: dict[str, str] = {}
        self._next_health = 0.0
        self.warmed = False  # sessions started on every node (SlurmExecutor asks once)
        # session dir -> why it is gone: batches sent there end CRASHED
        self.lost: dict[str, str] = {}
        # the first served batch's ``hidden_env``, held by the run's agents
        self.carried: dict[str, str] | None = None
        self._seen_alive: dict[str, bool] = {}  # agent dir -> alive, as warm_up saw it

    def carries(self, spec: JobSpec) -> bool:
        """Whether the run's agents hold ``spec``'s unwritable values (else it runs as a step)."""
        hidden = hidden_env(spec.env)
        if self.carried is None:
            self.carried = hidden
        return hidden == self.carried

    def add(self, job_id: str, spec: JobSpec, *, warm: bool, gated: bool = False,
            life: Lifecycle | None = None) -> WarmJob:
        """A batch to place (``life``: the executor's, in WAITING)."""
        job = WarmJob(spec, warm, job_id=job_id, gated=gated and not warm, life=life)
        if job.gated:
            job.gate_dir = str(Batch(spec.work_dir).gate.dir)
        self.jobs[job_id] = job
        self.order.append(job_id)
        return job

    def place_waiting(self, launch_step: Callable[[str, WarmJob], None]) -> bool:
        """Start what fits, in submission order; True when anything started."""
        started = False
        held: list[Node] | None = None  # nodes drained for gated steps, found once per call
        for job_id in list(self.order):
            job = self.jobs[job_id]
            if job.placement is not None or job.cancelled or job.life.ended:
                self.order.remove(job_id)
                continue
            if job.gated:
                held = None  # a gated step's turn may reserve nodes or let its ranks in
                if not job.reserved:
                    if self._reserve(job):
                        launch_step(job_id, job)
                    continue
                if not self._let_in(job):
                    continue
                self.order.remove(job_id)
                started = True
                continue
            if held is None:  # nodes drained for a gated step whose ranks are ready
                held = [n for j in self.jobs.values() if j.launched_early and j.ready
                        for n in j.reserved]
            whole = not job.warm  # a step may land on any GPU of its nodes: give it the nodes
            need = self.alloc.gpus_per_node if whole else job.spec.devices_per_node
            placement = self.placer.place(self.nodes, Request(job.spec.node_count, need, whole),
                                          held=held)
            if placement is None:
                continue
            job.placement = placement
            take(placement)
            job.life.to(Phase.SUBMITTED)
            self.order.remove(job_id)
            started = True
            if job.warm:
                self._send(job_id, job)
            else:
                launch_step(job_id, job)
        return started

    def _reserve(self, job: WarmJob) -> bool:
        """Nodes for a gated step, among those no other waiting gated step has (one
        early launch per node: its ranks hold memory there while they wait)."""
        taken = [n for j in self.jobs.values() if j.launched_early for n in j.reserved]
        nodes = self.placer.reserve(self.nodes, job.spec.node_count, taken=taken)
        if nodes is None:
            return False
        job.reserved = nodes
        job.life.to(Phase.EARLY)
        job.state = JobState(status=JobStatus.PENDING, reason=(
            "launched early: its ranks collect while other batches use "
            + ",".join(n.name for n in job.reserved)))
        return True

    def _let_in(self, job: WarmJob) -> bool:
        """Open a gated step's gate once its ranks are ready and its nodes are free."""
        gate = Gate(job.gate_dir)
        if not job.ready:
            if not job.gate_watched:  # pushed over SSH: the ranks' readiness wakes the loop
                job.gate_watched = True
                self.files.watch(gate.ready)
            text = self.files.read(gate.ready).strip()
            if not text:
                return False
            job.ready, job.ranks = True, int(text) if text.isdigit() else 0
            self.files.forget(gate.ready)
            for rank in range(job.ranks):  # each rank's exit pushed too (``ranks_exited``)
                self.files.watch(gate.done_of(rank))
            job.state = JobState(status=JobStatus.PENDING, reason=(
                "ranks ready, waiting for the batches on "
                + ",".join(n.name for n in job.reserved) + " to end"))
        if any(n.used for n in job.reserved):
            return False
        job.placement = Placement(nodes=list(job.reserved), gpus=self.alloc.gpus_per_node)
        take(job.placement)
        job.life.to(Phase.SUBMITTED)
        self.shell.write_file(gate.open, "")
        return True

    def ranks_exited(self, job: WarmJob) -> bool:
        """Every rank of a running gated step has exited (``done.<rank>``): its nodes
        can take the next batches while srun and the accounting finish."""
        if not (job.gated and job.ranks and job.placement and job.placement.gpus):
            return False
        gate = Gate(job.gate_dir)
        while job.done < job.ranks and self.files.read(gate.done_of(job.done)).strip():
            job.done += 1
        return job.done >= job.ranks

    def _forget_gate(self, job: WarmJob) -> None:
        """No more pushes of a gated step's gate files (it ended, or was dropped)."""
        if job.gate_watched:
            gate = Gate(job.gate_dir)
            self.files.forget(gate.ready, *(gate.done_of(r) for r in range(job.ranks)))

    def drop(self, job: WarmJob) -> None:
        """A gated step that ended before its gate opened: its nodes are no longer set aside."""
        job.cancelled = True
        job.reserved = []
        self._forget_gate(job)
        if not job.life.ended:
            job.life.to(Phase.ENDED)

    def release(self, job: WarmJob) -> None:
        if job.sent is not None:  # no more pushes of its files
            self.files.forget(job.sent.exit_path, job.sent.pid_path)
        self._forget_gate(job)
        if job.placement is not None:
            give_back(job.placement)

    def warm_up(self, spec: JobSpec) -> None:
        """Start this run's session on every node now, so imports overlap what runs first."""
        if not spec.serves_by_fork():
            return
        dirs = [self._agent_dir(n, spec) for n in self.nodes if not n.agent_dir]
        try:  # every node's agent looked at in one round trip
            self._seen_alive = dict(zip(dirs, agents_alive(self.shell, dirs), strict=True))
        except (ExecutionError, OSError):
            self._seen_alive = {}  # each node looks again, and says why
        for node in self.nodes:
            try:
                self._ensure_session(node, spec)
            except (ExecutionError, OSError) as exc:  # its batches will say so again
                self.warn(str(exc))
        self._seen_alive = {}  # a later look is a new one

    def _agent_dir(self, node: Node, spec: JobSpec) -> str:
        base = WorkRoot(root_of(spec.work_dir)).agents_of(self.alloc.job_id)
        return agent_dir(base, node.name, spec.command[0],
                         secrets_key(spec.env, local=isinstance(self.shell, LocalShell)))

    def _ensure_agent(self, node: Node, spec: JobSpec) -> None:
        node.agent_dir = self._agent_dir(node, spec)
        alive = self._seen_alive.pop(node.agent_dir, None)  # warm_up's look, just made
        if alive is None:
            alive = agent_alive(self.shell, node.agent_dir)
        if alive:
            node.healthy_at = time.monotonic()
            return
        if not claim_agent_start(self.shell, node.agent_dir):
            # another run launches this node's agent right now: wait for its heartbeat
            node.agent_started = time.monotonic()
            self.warn(f"The warm worker on {node.name} in allocation {self.alloc.job_id} is "
                      "being started by another run; this run uses it too.")
            return
        self._launch_agent(node, spec)

    def _launch_agent(self, node: Node, spec: JobSpec) -> None:
        d, box = node.agent_dir, Agent(node.agent_dir)
        self.shell.mkdir(box.inbox, private=True)
        argv = ["srun", f"--jobid={self.alloc.job_id}", "--overlap", "-N", "1", "-n", "1",
                f"--nodelist={node.name}", f"--job-name={self.alloc.job_name or 'trtllm'}.agent"]
        flag = gpu_flag(self.alloc.gpus_per_node, self.gres_style,  # type: ignore[arg-type]
                        self.gres_type)
        argv += [flag] if flag else []
        if self.alloc.cpus_per_node:
            argv.append(f"--cpus-per-task={self.alloc.cpus_per_node}")
        if self.alloc.mem_per_node_mb:
            argv.append(f"--mem={self.alloc.mem_per_node_mb}M")
        argv += [spec.command[0], "-m", "pytest_trtllm_slurm.node.agent", "--dir", d,
                 "--node", node.name]
        file_ops.remove_files(self.shell, [box.exit_code, box.heartbeat])
        env = not_inherited(spec.env, local=isinstance(self.shell, LocalShell))
        launcher = render_step_launcher(argv, log_path=box.log, pid_path=box.srun_pid,
                                        exit_path=box.exit_code,
                                        cwd=spec.invocation_dir or spec.rootdir, env=env)
        self.shell.write_file(box.launcher, launcher)
        # the values agent.sh does not hold reach the agent as its launcher's environment
        res = self.shell.run(["setsid", "-f", "bash", box.launcher], timeout=30,
                             retry_on_drop=False, env=hidden_env(env) or None)
        if not res.ok:
            raise ExecutionError(f"could not start the warm worker on {node.name}: "
                               f"{res.describe()}")
        node.agent_started = time.monotonic()
        self.warn(f"Starting a warm worker on {node.name} in allocation {self.alloc.job_id} "
                  f"(log: {box.log}).")

    def _ensure_session(self, node: Node, spec: JobSpec) -> str:
        wanted = set(spec.nodeids)
        if node.session and (node.session_ids is None or wanted <= node.session_ids):
            return node.session
        if not node.agent_dir:
            self._ensure_agent(node, spec)
        if node.session is None:
            early = self.early.take(node.agent_dir)
            if early:  # started before the controller collected: it collects everything
                node.session, node.session_ids = early, None
                return early
        if node.session:  # a batch this session did not collect (e.g. run without expect)
            self.shell.write_file(Session(node.session).stop, "")
        tests = {**self.expected, **dict(spec.assignment())}
        ids = sorted(tests)
        name = f"{self.run_id}-{len(ids)}-{uuid.uuid4().hex[:4]}"
        sdir = Agent(node.agent_dir).session(name).dir
        base = list(spec.rerun_argv) or [spec.command[0], "-m", "pytest"]
        # the node ids' files, absolute when the session runs outside the rootdir
        cwd, root = spec.invocation_dir, spec.rootdir
        files = {m if not root or not cwd or cwd == root else f"{root}/{m}"
                 for m in (key_path(k).split("::", 1)[0] for k in tests.values())}
        argv = session_argv(spec.command[0], base, sdir, sorted(files),
                            capture_no="--capture=no" in spec.command, nodeids_file=True)
        send_session(self.shell, node.agent_dir, name, argv,
                     cwd=spec.invocation_dir or spec.rootdir,
                     env=env_for_session(spec.env, local=isinstance(self.shell, LocalShell)),
                     nodeids=assignment.dumps(pairs(ids, tests)))
        node.session, node.session_ids = sdir, frozenset(ids)
        return sdir

    def _send(self, job_id: str, job: WarmJob) -> None:
        assert job.placement is not None
        node = job.placement.nodes[0]
        spec = job.spec
        try:
            sdir = self._ensure_session(node, spec)
        except (ExecutionError, OSError) as exc:
            job.state = JobState(status=JobStatus.ERROR, reason=str(exc))
            self.release(job)
            return
        work = Batch(spec.work_dir)
        sent = Delivery(node=node, session=sdir, request_name=job_id.replace("~", "_"),
                        pid_path=work.batch_pid, exit_path=work.exit_code,
                        news=root_of(work.notice), notice=name_of(work.notice))
        job.sent = sent
        request = {
            "name": sent.request_name,
            "tests": spec.assignment(),  # (node id, key): ``node.assignment``
            "gpus": spec.devices_per_node,
            "gpus_total": self.alloc.gpus_per_node,
            "reports_path": spec.reports_path,
            "log_path": spec.log_path,
            "exit_path": sent.exit_path,
            "pid_path": sent.pid_path,
            # renamed after each of its changes (locally, one stat of the folder per round)
            "notice_path": work.notice if isinstance(self.shell, LocalShell) else None,
            # values only where they may be written; the others are the session's own
            # (its agent was started with them: ``carries``), named here
            "env": shown_env(spec.env),
            "env_names": sorted(spec.env),
        }
        # one round trip: a retry's leftovers go, the batch's notes, then its request
        run_ops(self.shell, [file_ops.remove(sent.pid_path), file_ops.remove(sent.exit_path),
                             *self.notes(job_id, sent),
                             file_ops.write(Session(sdir).request(sent.request_name),
                                            json.dumps(request))])
        # watched once the leftovers are gone (a watch pushes the file whenever it appears)
        self.files.watch(sent.exit_path)
        self.files.watch(sent.pid_path, wake=False)
        log.debug("warm pool: %s sent to %s", job_id, Session(sdir).request(sent.request_name))
        job.state = JobState(status=JobStatus.PENDING, nodelist=job.placement.names,
                             reason=f"sent to the warm worker on {node.name}")

    def refresh(self, job: WarmJob) -> None:
        """Started? ended? From the batch's pid and exit-code files (no scheduler)."""
        placement, sent = job.placement, job.sent
        if not job.warm or placement is None or sent is None or job.state.status.finished:
            return
        node = placement.nodes[0]
        if self._folder_changed(job, sent.exit_path):
            code = self.files.read(sent.exit_path).strip()
            if code == str(EARLY_MISS) and not job.cancelled:
                self._resend(job, node)
                return
            if code.lstrip("-").isdigit():
                log.debug("warm pool: %s ended with exit code %s", job.job_id, code)
                job.state = self._end_state(job, int(code), node)
                self.release(job)
                return
            if job.state.status is not JobStatus.RUNNING and (
                    self.files.read(sent.pid_path).strip().isdigit()):
                job.state = JobState(status=JobStatus.RUNNING, nodelist=placement.names)
                log.debug("warm pool: %s runs", job.job_id)
                self.files.forget(sent.pid_path)
        dead = self._dead(node)
        if sent.session in self.lost:
            job.state = JobState(status=JobStatus.CRASHED, nodelist=placement.names,
                                 reason=self.lost[sent.session])
            self.release(job)
        elif dead:
            job.state = JobState(status=JobStatus.ERROR, nodelist=placement.names, reason=dead)
            self.release(job)

    def _folder_changed(self, job: WarmJob, exit_path: str) -> bool:
        """Read the batch's pid and exit code now? Locally, only when its work dir's mtime
        moved (both are renamed in) or every ``CADENCE.warm_read`` s; remotely, always."""
        if not isinstance(self.shell, LocalShell):
            return True
        now = time.monotonic()
        try:
            stamp = os.stat(os.path.dirname(exit_path)).st_mtime_ns
        except OSError:
            return True
        if stamp == job.folder_stamp and now < job.next_read:
            return False
        job.folder_stamp, job.next_read = stamp, now + CADENCE.warm_read
        return True

    def _resend(self, job: WarmJob, node: Node) -> None:
        """The early session lacked one of the batch's node ids (EARLY_MISS): end it, resend."""
        assert job.sent is not None
        self.files.forget(job.sent.exit_path, job.sent.pid_path)  # read as files from now on
        if node.session == job.sent.session and node.session_ids is None:
            self.shell.write_file(Session(node.session).stop, "")
            node.session = None
        self.warn(f"the warm worker on {node.name} collected other tests than this run "
                  "(e.g. collection depends on the environment); collecting again by node id")
        self._send(job.job_id, job)

    def check_health(self, also: Sequence[FileOp] = ()) -> list[bytes]:
        """Every ``CADENCE.agent_health`` s: is each used node's agent alive? ``also``: reads
        done in the same round trip (their bytes are returned)."""
        now = time.monotonic()
        watched: list[Node] = []
        if now >= self._next_health:
            self._next_health = now + CADENCE.agent_health
            watched = [node for node in self.nodes if node.agent_dir]
        raw_all = run_ops(self.shell, [*(file_ops.read(Agent(n.agent_dir).heartbeat)
                                         for n in watched), *also])  # one round trip
        late = []
        for node, raw in zip(watched, raw_all, strict=False):
            beat = heartbeat_of(raw)
            age = time.time() - beat.get("time", 0) if beat is not None else None
            if age is not None and age < HEARTBEAT_STALE:
                node.healthy_at = now
            if node.session and node.healthy_at is not None and (age is None
                                                                 or age >= HEARTBEAT_LATE):
                late.append(node)
        if late:
            self._check_agent_steps(late)
        return raw_all[len(watched):]

    def _check_agent_steps(self, late: list[Node]) -> None:
        """Nodes whose heartbeat is late: lose those whose agent step left the queue."""
        if self.list_steps is None:
            return
        try:
            steps = self.list_steps(self.alloc.job_id)
        except ExecutionError:
            return  # the scheduler did not answer: the heartbeat's own limit still holds
        name = f"{self.alloc.job_name or 'trtllm'}.agent"
        running = {row.nodelist for row in (steps or {}).values() if row.name == name}
        for node in late:
            if node.name not in running:
                why = (f"the warm worker on {node.name} was lost (its srun step left the "
                       f"queue without an exit code){self._agent_errors(node)}")
                # the exit code (-1) the dead launcher did not write: no run trusts the last
                # heartbeat (on a full disk only the heartbeat's removal may succeed)
                file_ops.remove_files(self.shell, [Agent(node.agent_dir).heartbeat])
                with contextlib.suppress(ExecutionError, OSError):
                    self.shell.write_file(Agent(node.agent_dir).exit_code, "-1\n")
                self._lose(node, why)

    def _dead(self, node: Node) -> str | None:
        """Why the node's agent cannot serve (None: it can); a lost agent or session goes
        to ``lost`` (its batches end CRASHED, the node starts a new agent)."""
        now = time.monotonic()
        looks: list[FileOp] = []  # the agent's and the session's exit codes, when due
        session = node.session
        if session and now >= node.session_checked:
            node.session_checked = now + CADENCE.agent_health / 4
            looks.append(file_ops.read(Agent(node.agent_dir).exit_code))
            if node.session_ended != session:
                looks.append(file_ops.read(Session(session).exit_code))
        # read with the heartbeats when those are due: one round trip
        codes = [raw.decode("utf-8", "replace").strip() for raw in self.check_health(looks)]
        now = time.monotonic()
        if codes and node.session == session:  # (the health look did not lose it)
            code = codes[0]
            if code:
                self._lose(node, f"the warm worker on {node.name} was lost (its srun step "
                           f"ended with exit code {code}){self._agent_errors(node)}")
                return None
            if len(codes) > 1 and codes[1]:
                node.session_ended = node.session
                log = Session(node.session).log
                self._lose(node, f"the worker session on {node.name} ended early; see {log}"
                           + error_lines(self.shell, log))
                return None
        if node.session and node.healthy_at is not None and (
                now - node.healthy_at > HEARTBEAT_STALE):
            self._lose(node, f"the warm worker on {node.name} stopped answering (no heartbeat"
                       f" for {HEARTBEAT_STALE:.0f} s){self._agent_errors(node)}")
            return None
        if node.healthy_at is None and node.agent_started is not None and (
                now - node.agent_started > AGENT_START_GRACE):
            return (f"the warm worker on {node.name} did not start within "
                    f"{AGENT_START_GRACE:.0f} s{self._agent_errors(node)}")
        return None

    def _lose(self, node: Node, why: str) -> None:
        """The node's session is gone: fail what was sent there, start afresh next time."""
        if node.session:
            self.lost[node.session] = why
        self.warn(f"{why}; its tests that had not started run again with a new warm worker.")
        node.session, node.session_ids = None, frozenset()
        node.agent_dir, node.agent_started, node.healthy_at = "", None, None

    def _agent_errors(self, node: Node) -> str:
        """``; see <agent.log>``, with the srun and Python error lines found in it."""
        log = Agent(node.agent_dir).log
        full = space_problem(node.agent_dir) if isinstance(self.shell, LocalShell) else None
        return (f"; {full}" if full else "") + f"; see {log}" + error_lines(self.shell, log)

    def _end_state(self, job: WarmJob, code: int, node: Node) -> JobState:
        """``node``: where the batch's process ran; the state names every node it held."""
        assert job.placement is not None  # (refresh's: a placed, served batch)
        nodes = job.placement.names
        if code == 0:
            return JobState(status=JobStatus.COMPLETED, exit_code=0, nodelist=nodes)
        sig = signal_of_exit_code(code)  # the fork loop writes 128 + N for a signal
        if job.cancelled:
            status = JobStatus.CANCELLED
        elif sig in CRASH_SIGNALS:
            status = JobStatus.CRASHED
        else:
            status = JobStatus.FAILED
        why = (f"the batch was killed by {signal_name(sig)} on {node.name}" if sig
               else f"the batch exited with {code} on {node.name}")
        if sig == 9 and not job.cancelled:  # the cgroup's OOM killer sends SIGKILL
            why += (" (out of memory? the node's batches share the warm "
                    "worker's memory limit; --trtllm-no-warm-workers gives each its own step)")
        return JobState(status=status, exit_code=None if sig else code, signal=sig,
                        nodelist=nodes, reason=f"{why}; see {job.spec.log_path}")

    def cancel(self, job: WarmJob) -> None:
        job.cancelled = True
        sent = job.sent
        if job.placement is None:
            job.state = JobState(status=JobStatus.CANCELLED, reason="cancelled before it started")
        elif job.warm and sent is not None and sent.node.session:  # the node's session now
            self.shell.write_file(Session(sent.node.session).cancel(sent.request_name), "")

    def close(self) -> None:
        """End this run's sessions (the agents stay): in one round trip, else one by one."""
        stops = [Session(n.session).stop for n in self.nodes if n.session]
        for node in self.nodes:
            node.session = None
        try:
            run_ops(self.shell, [file_ops.write(stop, "") for stop in stops])
        except (ExecutionError, OSError):
            for stop in stops:
                with contextlib.suppress(ExecutionError, OSError):
                    self.shell.write_file(stop, "")


def session_argv(python: str, base: list[str], sdir: str, targets: list[str], *,
                 capture_no: bool, nodeids_file: bool) -> list[str]:
    """The served session's pytest: ``base``, the worker plugin serving, and ``targets``."""
    box = Session(sdir)
    ids = ["--trtllm-worker-nodeids", box.nodeids] if nodeids_file else []
    return [python, *base[1:], "-p", "pytest_trtllm_slurm.node.worker",
            "-p", "no:cacheprovider",
            "--trtllm-worker-reports", box.reports, *ids,
            "--trtllm-worker-serve", sdir, "--continue-on-collection-errors",
            "--capture=no" if capture_no else "--capture=tee-sys",
            "-W", "ignore::pytest.PytestAssertRewriteWarning", *targets]


def controller_env() -> dict[str, str]:
    """What srun would pass from this process to a step (SLURM_* describe this process)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}


def env_for_session(batch_env: dict[str, str], *, local: bool) -> dict[str, str]:
    """The environment a session request (a file) carries: locally the controller's less
    its secrets, then the batch's writable values; the rest comes from the agent's own."""
    env: dict[str, str] = {k: v for k, v in without_secrets(controller_env()).items()
                           if k not in batch_env} if local else {}
    env.update(shown_env(batch_env))
    return env


def not_inherited(env: dict[str, str], *, local: bool) -> dict[str, str]:
    """``env`` less the secrets a local agent inherits anyway from this process's
    environment (srun passes it on): those need not be written to a launcher file."""
    if not local:
        return dict(env)
    return {k: v for k, v in env.items() if not (is_secret(k, v) and os.environ.get(k) == v)}


def secrets_key(batch_env: Mapping[str, str], *, local: bool) -> str:
    """A digest ('' for none) of the unwritable values an agent must hold to serve this
    run (the batch's ``hidden_env``, locally also our secrets); part of the agent's name."""
    held = dict(only_secrets(controller_env())) if local else {}
    held.update(hidden_env(batch_env))
    if not held:
        return ""
    return hashlib.sha256(json.dumps(sorted(held.items())).encode()).hexdigest()[:16]


def send_session(shell: Shell, agent_dir: str, name: str, argv: list[str], *, cwd: str,
                 env: dict[str, str], nodeids: str | None = None) -> str:
    """Ask the agent in ``agent_dir`` for a session (inboxes 0700, files 0600); its dir."""
    agent = Agent(agent_dir)
    box = agent.session(name)
    request = {"name": name, "argv": argv, "cwd": cwd, "env": env,
               "log_path": box.log, "exit_path": box.exit_code}
    run_ops(shell, [file_ops.mkdir(box.inbox, private=True),
                    file_ops.mkdir(agent.inbox, private=True),
                    *([file_ops.write(box.nodeids, nodeids)] if nodeids is not None else []),
                    file_ops.write(agent.request(name), json.dumps(request))])
    return box.dir


def agent_dir(base: str, node: str, python: str, secrets: str = "") -> str:
    """One agent per node, interpreter and set of secrets (``secrets_key``)."""
    key = python if not secrets else f"{python}\0{secrets}"
    return Agent(base).at(f"{node}-{hashlib.sha1(key.encode()).hexdigest()[:8]}")


def heartbeat_of(raw: bytes) -> dict | None:
    """A heartbeat file's bytes as a heartbeat (None: empty, or not one)."""
    try:
        return validated(Heartbeat, raw, HEARTBEAT).model_dump() if raw else None
    except BadRecord:
        return None


# under the agent folder's flock: a claim younger than the grace stands while its agent
# starts (no heartbeat, no exit code yet); $1 folder, $2 grace, lock, claim, exit, heartbeat
_CLAIM = ('mkdir -p "$1" && exec 9>>"$3" && flock -w 30 9 || exit 3; '
          'now=$(date +%s); then=$(cat "$4" 2>/dev/null); '
          'if [ -n "$then" ] && [ "$((now - then))" -lt "$2" ] && [ ! -e "$5" ] '
          '&& [ ! -e "$6" ]; then echo taken; exit 0; fi; '
          'rm -f "$5" "$6"; echo "$now" >"$4" && echo mine')


def claim_agent_start(shell: Shell, agent_dir: str) -> bool:
    """True when this run is to launch the agent of ``agent_dir`` (one, even when two cold
    runs find it missing at once; a claim goes stale after AGENT_START_GRACE s)."""
    box = Agent(agent_dir)
    res = shell.run(["sh", "-c", _CLAIM, "sh", agent_dir, str(int(AGENT_START_GRACE)),
                     box.start_lock, box.starting, box.exit_code, box.heartbeat], timeout=60)
    if not res.ok:  # no flock on the target: launch without a claim
        return True
    return res.stdout.strip() != "taken"


def agent_alive(shell: Shell, agent_dir: str) -> bool:
    """A fresh heartbeat, and no exit code yet (written when srun ends)."""
    return agents_alive(shell, [agent_dir])[0]


def agents_alive(shell: Shell, agent_dirs: list[str]) -> list[bool]:
    """``agent_alive`` of each, all read in one round trip where the shell can."""
    looks = [op for d in agent_dirs for op in (file_ops.read(Agent(d).heartbeat),
                                              file_ops.read(Agent(d).exit_code, 64))]
    raw = run_ops(shell, looks)
    beats = [heartbeat_of(b) for b in raw[::2]]
    return [beat is not None and time.time() - beat.get("time", 0) < HEARTBEAT_STALE
            and not code.strip() for beat, code in zip(beats, raw[1::2], strict=True)]


ERROR_MARKS = ("error", "Error", "Traceback", "Killed", "killed", "CANCELLED")


def error_lines(shell: Shell, log: str, lines: int = 6, max_bytes: int = 16384) -> str:
    """The last error lines of a log (srun's, a Python exception) as ``":\n    line..."``."""
    try:
        start = max(0, shell.size(log) - max_bytes)
        text = shell.read_from(log, start, max_bytes).decode("utf-8", "replace")
    except (ExecutionError, OSError):
        return ""
    found = [ln.rstrip() for ln in text.splitlines() if any(m in ln for m in ERROR_MARKS)]
    return (":\n    " + "\n    ".join(found[-lines:])) if found else ""
