"""The persistent allocation: one ``salloc --no-shell`` reused by every run of a repo
(its state file under a lock, ``state_store``), freed only by ``release()``. With pyxis
it also holds the run's named containers (``alloc_containers``)."""

from __future__ import annotations

import contextlib
import hashlib
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pytest_trtllm_slurm.errors import ConfigError, ExecutionError
from pytest_trtllm_slurm.execution.records import BadRecord, Heartbeat, load_json, validated
from pytest_trtllm_slurm.execution.render.containers import container_name_for
from pytest_trtllm_slurm.execution.render.scripts import GresStyle, gpu_flag
from pytest_trtllm_slurm.execution.slurm.alloc_containers import (
    SETUP_TIMEOUT,
    ContainerSetup,
    set_up_container,
)
from pytest_trtllm_slurm.execution.slurm.early_sessions import EarlySessions
from pytest_trtllm_slurm.execution.slurm.jobs import (
    NAME_SUFFIX,
    JobIdentity,
    SchedulerError,
    SlurmJobs,
    StepRow,
    blocker_note,
    format_duration,
    parse_duration,
)
from pytest_trtllm_slurm.execution.slurm.parse import parse_key_values
from pytest_trtllm_slurm.execution.slurm.runs import RunRecord, RunRegistry, local_registry
from pytest_trtllm_slurm.execution.slurm.state_store import SAY_EVERY, StateStore
from pytest_trtllm_slurm.execution.work_root import ensure_work_root
from pytest_trtllm_slurm.node import paths
from pytest_trtllm_slurm.node.files import write_atomic
from pytest_trtllm_slurm.planning.jobspec import JobSpec, SlurmEnv
from pytest_trtllm_slurm.planning.packing import AllocationShape, BatchShape
from pytest_trtllm_slurm.transport.shell import Shell

MIN_LEFT_SECONDS = 300  # an allocation with less left is not reused
DEFAULT_TIME_LIMIT = "04:00:00"
GPU_CHECK = ["nvidia-smi", "--query-compute-apps=pid,name,used_memory", "--format=csv,noheader"]


class AllocationState(BaseModel):
    """The seed's state file fields, plus what steps need to size themselves."""

    model_config = ConfigDict(extra="ignore")

    job_id: str
    container_name: str | None = None
    nodelist: str | None = None
    partition: str | None = None
    account: str | None = None
    nodes: int = 1
    gpus_per_node: int = 0
    docker_image: str | None = None
    container_mounts: str | None = None
    allocated_at: str = ""
    time_limit: str | None = None
    installed: bool = False
    job_name: str | None = None
    cpus_per_node: int | None = None
    mem_per_node_mb: int | None = None
    owner: str | None = None
    # pyxis: every named container set up in it (container_name / docker_image: the latest)
    container_runtime: str | None = None
    containers: list[ContainerSetup] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_container_of_old_files(self) -> AllocationState:
        """State files written before ``containers`` existed name one container."""
        if not self.containers and self.container_name and self.docker_image:
            self.containers = [ContainerSetup(name=self.container_name, image=self.docker_image,
                                              installed=self.installed, install_known=False)]
        return self

    def container(self, name: str) -> ContainerSetup | None:
        return next((c for c in self.containers if c.name == name), None)

    def record(self, setup: ContainerSetup) -> None:
        """Note a container as set up (replacing an earlier record of the same name)."""
        self.containers = [c for c in self.containers if c.name != setup.name] + [setup]
        self.container_name, self.docker_image = setup.name, setup.image
        self.installed = setup.installed

    def serves(self, spec: JobSpec) -> str | None:
        """Why a batch does not fit here (None: it fits; with pyxis any image set up in it fits)."""
        if spec.partition and self.partition and spec.partition != self.partition:
            return f"partition {spec.partition} != {self.partition}"
        if spec.node_count > self.nodes:
            return f"needs {spec.node_count} nodes, the allocation has {self.nodes}"
        if spec.devices_per_node > self.gpus_per_node:
            return f"needs {spec.devices_per_node} GPUs per node, it has {self.gpus_per_node}"
        if self.container_runtime == "pyxis":
            if spec.container_image:
                name = container_name_for(spec.container_image, account=spec.account)
                setup = self.container(name)
                if setup is None or not setup.installed:
                    return f"image {spec.container_image} is not set up in it"
            return None
        if (spec.container_image or None) != (self.docker_image or None):
            return f"image {spec.container_image} != {self.docker_image}"
        return None


@dataclass
class AllocationRequest:
    """What to allocate when nothing reusable exists (the largest shape of the run)."""

    partition: str | None = None
    account: str | None = None
    nodes: int = 1
    gpus_per_node: int = 0
    time_limit: str = DEFAULT_TIME_LIMIT
    docker_image: str | None = None
    container_name: str | None = None
    container_mounts: list[str] = field(default_factory=list)
    gres_style: GresStyle = "gres"
    gres_type: str | None = None
    exclusive: bool = True  # whole nodes (all CPUs and memory) so steps can share them out
    # pyxis: every image of the run is set up in the allocation (docker_image is the first);
    # the install step runs in install_workdir with container_mounts mounted
    container_runtime: str = "none"
    container_images: list[str] = field(default_factory=list)
    install_command: str | None = None
    install_workdir: str | None = None

    @property
    def job_name(self) -> str:
        return f"{self.account or 'trtllm'}{NAME_SUFFIX}"

    @classmethod
    def covering(cls, shapes: Sequence[BatchShape], slurm_env: SlurmEnv | None = None, *,
                 time_limit: str | None = None, nodes: int | None = None) -> AllocationRequest:
        """One allocation for a run's batches: the partition most use, as many nodes as the
        largest needs (at least ``nodes``), whole nodes' GPUs."""
        if not shapes:
            raise ValueError("no batches to size an allocation for")
        parts = Counter(s.partition for s in shapes)
        partition = parts.most_common(1)[0][0]
        mine = [s for s in shapes if s.partition == partition]
        info = slurm_env.partition_named(partition) if slurm_env else None
        per_node = max([s.devices_per_node for s in mine] + [info.gpus_per_node if info else 0])
        gres_style: GresStyle = "gres" if info and (info.requires_gres or info.gpu_type) else (
            "gpus-per-node")
        images = list(dict.fromkeys(s.container_image for s in mine if s.container_image))
        count = max([s.node_count for s in mine] + [nodes or 0])
        if nodes and info and info.nodes and count > len(info.nodes):
            raise ConfigError(
                f"--trtllm-alloc-nodes {nodes}: partition {partition} has "
                f"{len(info.nodes)} node(s) ({', '.join(info.nodes)}); ask for at most that")
        return cls(partition=partition, account=mine[0].account,
                   nodes=count, gpus_per_node=per_node,
                   time_limit=time_limit or DEFAULT_TIME_LIMIT,
                   docker_image=mine[0].container_image, gres_style=gres_style,
                   gres_type=info.gpu_type if info else None, container_images=images)

    def shape(self) -> AllocationShape:
        """What the packer reads of it (``Capacity.allocation``)."""
        return AllocationShape(nodes=self.nodes, gpus_per_node=self.gpus_per_node,
                               partition=self.partition, image=self.docker_image)

    @property
    def images(self) -> list[str]:
        """The images to set up (pyxis), the first one first."""
        first = [self.docker_image] if self.docker_image else []
        return list(dict.fromkeys(first + self.container_images))

    def incompatible(self, state: AllocationState) -> str | None:
        """Why an existing allocation cannot serve this request (with pyxis, not a new image)."""
        if self.partition and state.partition and self.partition != state.partition:
            return f"partition {state.partition}, wanted {self.partition}"
        if self.account and state.account and self.account != state.account:
            return f"account {state.account}, wanted {self.account}"
        if state.nodes < self.nodes:
            return f"{state.nodes} node(s), wanted {self.nodes}"
        if self.container_runtime != "pyxis" and (
                (self.docker_image or None) != (state.docker_image or None)):
            return f"image {state.docker_image}, wanted {self.docker_image}"
        if state.gpus_per_node < self.gpus_per_node:
            return f"{state.gpus_per_node} GPUs per node, wanted {self.gpus_per_node}"
        return None


def parse_gpu_processes(stdout: str) -> list[str]:
    """Non-empty lines of ``srun --label nvidia-smi --query-compute-apps ...``."""
    bodies = [(line.strip(), re.sub(r"^\s*\d+:\s*", "", line).strip())
              for line in stdout.splitlines()]
    return [line for line, body in bodies if body and "no running processes" not in body.lower()]


def parse_tres(text: str) -> dict[str, str]:
    """``cpu=8,mem=8000M,node=2,gres/gpu=8`` -> dict."""
    pairs = (item.partition("=") for item in text.split(","))
    return {key.strip(): value.strip() for key, sep, value in pairs if sep}


def _mem_mb(text: str) -> int | None:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]?)", text.strip())
    if not m:
        return None
    scale = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}[m.group(2)]
    return int(float(m.group(1)) * scale)


class AllocationManager:
    """Find, validate, create and release the persistent allocation of one rootdir."""

    def __init__(self, shell: Shell, *, rootdir: str | Path, request: AllocationRequest,
                 user: str | None = None, warn: Callable[[str], None] | None = None,
                 wait_seconds: int = 600, agents_dir: str | None = None,
                 runs: RunRegistry | None = None, store: StateStore | None = None,
                 early: EarlySessions | None = None) -> None:
        self.shell = shell
        self.early = early or EarlySessions()  # this run's sessions started before it collected
        root = paths.work_root(None, Path(rootdir))
        self.agents_dir = agents_dir or str(root.agents)
        self.request = request
        self.jobs = SlurmJobs(shell)
        self.store = store or StateStore(shell, root.dir, paths.STATE_NAME, private=False)
        self.salloc_log = root.salloc_log
        # another run may hold the lock while it allocates (with pyxis: sets up an image)
        self._lock_timeout = wait_seconds + 120 + (SETUP_TIMEOUT if self.pyxis else 0)
        # the same tag on every machine that shares the store
        self.owner = "trtllm-slurm:" + hashlib.sha1(
            self.store.identity.encode()).hexdigest()[:12]
        self._user = user
        self.warn = warn or (lambda msg: None)
        self.wait_seconds = wait_seconds
        self.messages: list[str] = []  # what ensure() did, for the run's summary
        self.runs = runs or local_registry(shell, root.dir)
        self._state_note = "state file was missing"  # why there is no state (orphan message)

    def read_state(self) -> AllocationState | None:
        """The state file, or None; one that is not a readable state is moved aside, reported."""
        try:
            return self._parsed_state()
        except (OSError, ValueError, ValidationError) as exc:
            first = (str(exc).splitlines() or [type(exc).__name__])[0]
            aside = self.store.move_aside("bad")
            self._state_note = f"state file was unreadable ({first})"
            self._say(f"State file {self.store.where} is unreadable or corrupt ({first}); "
                      + (f"moved to {aside}; " if aside else "")
                      + "continuing without it.", warn=True)
            return None

    def peek_state(self) -> AllocationState | None:
        """The state file if it parses, without the lock and leaving a bad one in place."""
        try:
            return self._parsed_state()
        except (OSError, ValueError, ValidationError):
            return None

    def _parsed_state(self) -> AllocationState | None:
        text = self.store.read()
        return None if text is None else AllocationState.model_validate(
            load_json(text, "the state file"))

    def _write_state(self, state: AllocationState) -> None:
        self.store.write(state.model_dump_json(indent=2) + "\n")

    def ensure(self) -> AllocationState | None:
        """A RUNNING allocation for the request (reused when valid; with pyxis its images set
        up); None, warned, when an incompatible one is busy with other runs (run one-shot)."""
        if not self.pyxis:  # the common case without the lock: a valid allocation
            with self.runs.locked():  # (nobody cancels it between the check and the lease)
                state = self.peek_state()
                if state is not None and self._validate(state) is None:
                    return self._reuse(state)
        with self.holding_lock():
            state = self._reuse_or_allocate()
            if state is not None and self.pyxis:
                self._set_up_images(state)
            return state

    def _reuse(self, state: AllocationState) -> AllocationState:
        self.runs.use_allocation(state.job_id)
        self._say(f"Reusing allocation {state.job_id} ({state.nodelist}).")
        return state

    def close(self) -> None:
        """This run no longer uses the allocation (its lease and record go)."""
        self.runs.finish()

    def holding_lock(self) -> contextlib.AbstractContextManager[None]:
        """The state file's lock (``StateStore.locked``), for ``_lock_timeout`` seconds."""
        holder = {**self.runs.holder(), "since": datetime.now().strftime("%H:%M:%S")}
        return self.store.locked(self._lock_timeout, holder, self.warn)

    @property
    def pyxis(self) -> bool:
        return self.request.container_runtime == "pyxis"

    def _reuse_or_allocate(self) -> AllocationState | None:
        """Under the lock: a valid allocation or a new one."""
        state = self.read_state()
        if state is not None:
            verdict = self._validate(state)
            if verdict is None:
                with self.runs.locked():
                    return self._reuse(state)
            kind, why = verdict
            if kind == "gone":
                self._say(f"Allocation {state.job_id} is gone ({why}); stale state file "
                          "removed.", warn=True)
                self.store.delete()
                self._state_note = f"allocation {state.job_id} was gone"
            elif kind == "foreign":
                aside = self.store.move_aside("foreign")
                self._state_note = f"state file named job {state.job_id}, not ours"
                self._say(f"State file {self.store.where} names job {state.job_id}, which is not "
                          f"this checkout's allocation ({why}): not used, not cancelled; "
                          + (f"the file is moved to {aside}." if aside else "file removed."),
                          warn=True)
            elif kind == "busy":
                self._say(f"Allocation {state.job_id} does not fit this run ({why}) but "
                          "other steps run in it: left alone; batches run one-shot.",
                          warn=True)
                return None
            else:
                users = self._cancel_unused(state.job_id, delete_state=True)
                if users:
                    pids = ", ".join(f"pid {u.pid} on {u.host}" for u in users)
                    self._say(f"Allocation {state.job_id} {why}, but live run(s) use it "
                              f"({pids}): left alone; batches run one-shot.", warn=True)
                    return None
                self._say(f"Allocation {state.job_id} {why}: released, allocating anew.",
                          warn=True)
                self._state_note = f"allocation {state.job_id} was replaced"
        self._cancel_orphans()
        state = self._allocate()
        self._write_state(state)
        with self.runs.locked():
            self.runs.use_allocation(state.job_id)
        return state

    def _validate(self, state: AllocationState) -> tuple[str, str] | None:
        ident = self.jobs.identity(state.job_id)
        if ident is None:
            return "gone", "not in the queue"
        foreign = self._foreign(state, ident)
        if foreign:
            return "foreign", foreign
        status, remaining = ident.state, ident.time_left
        if status != "RUNNING":
            return ("gone", f"state {status}") if status not in ("PENDING", "CONFIGURING") else (
                "incompatible", f"is {status}")
        seconds = parse_duration(remaining)
        if seconds is not None and seconds <= MIN_LEFT_SECONDS:
            return "expiring", f"expires in {remaining}"
        why = self.request.incompatible(state)
        if why is None:
            return None
        steps = self.jobs.squeue_steps(state.job_id)
        if steps and not self._only_idle_agents(state, steps):
            return "busy", why
        return "incompatible", f"does not fit ({why})"

    def _foreign(self, state: AllocationState, ident: JobIdentity) -> str | None:
        """Why the job a state file names is not this checkout's allocation, or None."""
        if ident.user and ident.user != self.user:
            return f"it belongs to user {ident.user}"
        if not ident.name.endswith(NAME_SUFFIX) or (
                state.job_name and ident.name != state.job_name):
            return f"it is named {ident.name!r}, not {state.job_name or '*' + NAME_SUFFIX!r}"
        if ident.comment and ident.comment != self.owner:
            return f"its comment {ident.comment!r} is another checkout's, not {self.owner!r}"
        return None

    def _only_idle_agents(self, state: AllocationState, steps: dict[str, StepRow]) -> bool:
        """The allocation's steps are only agents serving no other run's session."""
        if any(not row.name.endswith(".agent") for row in steps.values()):
            return False
        base = paths.join(self.agents_dir, state.job_id)
        script = ('for f in "$1"/*/"$2"; do [ -f "$f" ] && '
                  'printf "%s\\t%s\\n" "${f%/"$2"}" "$(cat "$f")"; done; true')
        res = self.shell.run(["sh", "-c", script, "sh", base, paths.HEARTBEAT], timeout=30)
        if not res.ok:
            return False
        for line in res.stdout.splitlines():
            agent, _, text = line.partition("\t")
            try:
                beat = validated(Heartbeat, text, paths.HEARTBEAT)
            except BadRecord:
                return False
            serving = beat.running + beat.pending
            if serving - (1 if self.early.has(agent) else 0) > 0:
                return False
        return True

    def _cancel_orphans(self) -> None:
        """Allocations with our name but no state file: ours are cancelled, others' reported."""
        try:
            found = self.jobs.by_name(self.user, self.request.job_name)
        except SchedulerError as exc:
            self._say(f"Could not look for orphaned allocations: {exc}", warn=True)
            return
        for job_id, status, comment in found:
            if comment and comment != self.owner:
                self._say(f"Allocation {job_id} ({status}) has our name but belongs to another "
                          f"checkout ({comment}); left alone (one persistent allocation per "
                          "rootdir).", warn=True)
                continue
            users = self._cancel_unused(job_id)
            if users:
                self._say(f"Allocation {job_id} ({status}) has no state file but a live run "
                          f"(pid {users[0].pid}) uses it: left alone.", warn=True)
                continue
            self._say(f"Released orphaned allocation {job_id} - {self._state_note}.",
                      warn=True)

    def _cancel_unused(self, job_id: str, *, delete_state: bool = False) -> list[RunRecord]:
        """scancel ``job_id`` (and delete its state file) unless live runs use it (returned),
        under the registry's lock so no run starts using it or reads its state meanwhile."""
        with self.runs.locked():
            users = self.runs.users_of(job_id)
            if not users:
                self.jobs.scancel([job_id])
                if delete_state:
                    self.store.delete()
        return users

    def salloc_argv(self) -> list[str]:
        req = self.request
        argv = ["salloc", "--no-shell", f"--job-name={req.job_name}", f"--nodes={req.nodes}",
                f"--time={req.time_limit}", f"--comment={self.owner}",
                f"--immediate={self.wait_seconds}"]
        if req.exclusive:
            argv += ["--exclusive", "--mem=0"]
        if req.partition:
            argv.append(f"--partition={req.partition}")
        if req.account:
            argv.append(f"--account={req.account}")
        flag = gpu_flag(req.gpus_per_node, req.gres_style, req.gres_type)
        if flag:
            argv.append(flag)
        return argv

    def _allocate(self) -> AllocationState:
        req = self.request
        where = req.partition or "the default partition"
        self._say(f"No reusable allocation found. Allocating {req.nodes} node(s) on {where} for "
                  f"{req.time_limit}.")
        code, output = self._salloc(self.salloc_argv())
        ensure_work_root(self.salloc_log.parent)
        write_atomic(self.salloc_log, output, parents=True)
        m = re.search(r"Granted job allocation (\d+)", output)
        if code != 0 or not m:
            raise ExecutionError(
                f"could not allocate: salloc exited with {code}: {output.strip()[-2000:]}\n"
                f"(log: {self.salloc_log}; check the partition, the account and the "
                "allocation's time limit, or run one-shot)"
            )
        job_id = m.group(1)
        state = AllocationState(
            job_id=job_id, partition=req.partition, account=req.account, nodes=req.nodes,
            gpus_per_node=req.gpus_per_node,
            # pyxis: filled in by record() once an image is set up
            docker_image=None if self.pyxis else req.docker_image,
            container_name=None if self.pyxis else req.container_name,
            container_mounts=",".join(req.container_mounts) or None,
            allocated_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            time_limit=req.time_limit, job_name=req.job_name, owner=self.owner,
            container_runtime=req.container_runtime,
            installed=not (self.pyxis and req.images),
        )
        self._fill_from_scontrol(state)
        self._say(f"Allocation {job_id} granted on {state.nodelist}.")
        return state

    def _salloc(self, argv: list[str]) -> tuple[int, str]:
        """Run salloc detached and wait for it, saying so every SAY_EVERY s; an interrupt or a
        wait past the limit cancels the request."""
        base = paths.WorkRoot(paths.root_of(self.agents_dir)).salloc_dir(self.runs.me.run_id)
        out, rc = f"{base}.out", f"{base}.rc"
        # (the detached shell lets go of this command's pipes at once)
        script = ('exec </dev/null >/dev/null 2>&1; out=$1; rc=$2; shift 2; '
                  '"$@" >"$out" 2>&1; s=$?; '
                  't=$(mktemp "$rc.XXXXXXXX") && echo "$s" >"$t" && mv -f "$t" "$rc"')
        self.shell.mkdir(str(PurePosixPath(base).parent))
        self.shell.run(["rm", "-f", out, rc], timeout=30)
        self.jobs.counts["salloc"] += 1
        # run from the work dirs: squeue's WorkDir (%Z) then names the checkout that owns
        # the allocation, on a remote cluster too (not the login shell's home)
        res = self.shell.run(["setsid", "-f", "sh", "-c", script, "sh", out, rc, *argv],
                             timeout=30, retry_on_drop=False,
                             cwd=str(PurePosixPath(base).parent))
        if not res.ok:  # (it may have started all the same: never leave a request behind)
            self._cancel_request(None)
            raise ExecutionError(f"could not start salloc: {res.describe()}")
        started, since = time.monotonic(), datetime.now().strftime("%H:%M:%S")
        say_at = started + 10.0
        job_id: str | None = None
        try:
            while True:
                code = self._read(rc).strip()
                output = self._read(out)
                if code.lstrip("-").isdigit():
                    self.shell.run(["rm", "-f", out, rc], timeout=30)
                    self.runs.waiting_for(None)
                    return int(code), output
                found = re.search(r"job allocation (\d+)", output)
                if found and job_id is None:
                    job_id = found.group(1)
                    self.runs.waiting_for(job_id)  # the next run cancels it if we are killed
                now = time.monotonic()
                if now - started > self.wait_seconds + 60:
                    raise ExecutionError(f"salloc did not finish within {self.wait_seconds + 60}"
                                         f" s: {output.strip()[-500:]}")
                if now >= say_at:
                    say_at = now + SAY_EVERY
                    self.warn(self._waiting_line(job_id, since))
                time.sleep(0.2)
        except BaseException:  # interrupted, or waited too long: never leave the request
            self._cancel_request(job_id)
            raise

    def _waiting_line(self, job_id: str | None, since: str) -> str:
        """What the request waits for, since when, and the user's own jobs holding nodes."""
        reason = ""
        if job_id:  # ``PENDING Resources``: its state and reason as squeue has them
            res = self.jobs.run(["squeue", "-h", "-j", job_id, "-o", "%T %r"])
            state = (res.stdout.strip() or "not in the queue") if res.ok else "squeue failed"
            reason = f" ({state})"
        line = (f"Waiting since {since} for the persistent allocation "
                f"{job_id or '(request not queued yet)'}{reason} on "
                f"{self.request.partition or 'the default partition'}.")
        note = blocker_note(self.jobs, self.user, self.request.partition, one_shot=False,
                            exclude=job_id)
        return f"{line} {note[0].upper()}{note[1:]}." if note else line

    def _cancel_request(self, job_id: str | None) -> None:
        """scancel this run's never-granted request (by id, else by name, owner and comment)."""
        ids = [job_id] if job_id else []
        if not ids:
            with contextlib.suppress(SchedulerError):
                ids = [j for j, status, comment in self.jobs.by_name(self.user,
                                                                     self.request.job_name)
                       if status == "PENDING" and comment == self.owner]
        if ids:
            self.jobs.scancel(ids)
            self.warn(f"Cancelled the allocation request {', '.join(ids)} that was not granted.")

    def _read(self, path: str) -> str:
        return self.shell.read_from(path, 0, 1 << 16).decode("utf-8", "replace")

    def _fill_from_scontrol(self, state: AllocationState) -> None:
        res = self.jobs.run(["scontrol", "show", "job", "-o", state.job_id])
        rec = parse_key_values(res.stdout.strip().splitlines()[0]) if res.ok and res.stdout else {}
        state.nodelist = rec.get("NodeList") or state.nodelist
        state.partition = state.partition or rec.get("Partition")
        state.account = state.account or rec.get("Account")
        nodes = int(rec.get("NumNodes", state.nodes) or state.nodes)
        tres = parse_tres(rec.get("TRES", ""))
        if tres.get("cpu", "").isdigit():
            state.cpus_per_node = max(1, int(tres["cpu"]) // nodes)
        mem = _mem_mb(tres.get("mem", ""))
        if mem:
            state.mem_per_node_mb = mem // nodes

    def _set_up_images(self, state: AllocationState) -> None:
        """Set up each image not yet set up with this install command (state saved after each)."""
        if state.container_runtime != "pyxis":  # an allocation made before pyxis was on
            state.container_runtime = "pyxis"
            self._write_state(state)
        req = self.request
        for image in req.images:
            name = container_name_for(image, account=req.account)
            done = state.container(name)
            if done is not None and done.current(req.install_command):
                continue
            self._say(f"Setting up image {image} as container {name} on {state.nodes} node(s) "
                      f"of allocation {state.job_id}.")
            state.record(set_up_container(
                self.jobs, state.job_id, state.nodes, image, name,
                mounts=req.container_mounts, install_command=req.install_command,
                workdir=req.install_workdir))
            self._write_state(state)

    def check_time(self, state: AllocationState, spec: JobSpec) -> str | None:
        """A warning when the allocation ends before the batch's time limit could."""
        want = parse_duration(spec.time_limit)
        if not want:
            return None
        ident = self.jobs.identity(state.job_id)
        have = parse_duration(ident.time_left) if ident else None
        if have is not None and have < want:
            msg = (f"Allocation {state.job_id} has {format_duration(have)} left but batch "
                   f"{spec.name} expects {spec.time_limit}. The job may be killed early.")
            self._say(msg, warn=True)
            return msg
        return None

    def check_gpu_processes(self, state: AllocationState) -> list[str]:
        """Leftover GPU processes on the allocation's nodes (warned), unless steps run in it."""
        if state.gpus_per_node <= 0 or self.early.on_allocation(state.job_id) or (
                self.jobs.squeue_steps(state.job_id)):
            return []
        argv = ["srun", f"--jobid={state.job_id}", "-N", str(state.nodes),
                "--ntasks-per-node=1", "--overlap", "--label", *GPU_CHECK]
        res = self.jobs.run(argv, timeout=120)
        if not res.ok:
            self._say(f"GPU check in allocation {state.job_id} failed: {res.describe()}",
                      warn=True)
            return []
        procs = parse_gpu_processes(res.stdout)
        if procs:
            self._say(f"GPU processes found on {state.nodelist}: {'; '.join(procs)}. These may "
                      "interfere with the job.", warn=True)
        return procs

    def status(self) -> dict[str, object]:
        """The state file plus the scheduler's view (for ``trtllm-slurm alloc status``)."""
        state = self.peek_state()  # never waits for a run that holds the lock
        if state is None:
            info: dict[str, object] = {"state_file": self.store.where, "allocation": None}
            if self.store.exists():
                info["unreadable"] = True
            return info
        ident = self.jobs.identity(state.job_id)
        steps = self.jobs.squeue_steps(state.job_id) if ident else None
        return {
            "state_file": self.store.where,
            "allocation": state.model_dump(),
            "scheduler_state": ident.state if ident else "GONE",
            "time_left": ident.time_left if ident else None,
            "steps": sorted(steps) if steps else [],
        }

    def release(self) -> str:
        """scancel the allocation of the state file (and our orphans); delete the state."""
        with self.holding_lock():
            state = self.read_state()
            msgs = []
            ident = self.jobs.identity(state.job_id) if state is not None else None
            foreign = self._foreign(state, ident) if state is not None and ident else None
            if state is not None and foreign:
                msgs.append(f"State file named job {state.job_id}, which is not this "
                            f"checkout's allocation ({foreign}): not cancelled.")
            elif state is not None:
                out = " ".join(r.stderr + r.stdout for r in self.jobs.scancel([state.job_id]))
                gone = "invalid job id" in out.lower()
                msgs.append(f"Allocation {state.job_id} " + (
                    "was already gone; state file removed." if gone else "released."))
            self.store.delete()
            self.salloc_log.unlink(missing_ok=True)
            try:
                found = self.jobs.by_name(self.user, self.request.job_name)
            except SchedulerError:
                found = []
            for job_id, _status, comment in found:
                if (state is None or job_id != state.job_id) and comment == self.owner:
                    self.jobs.scancel([job_id])
                    msgs.append(f"Orphaned allocation {job_id} released.")
        return " ".join(msgs) or f"No allocation to release ({self.store.where} absent)."

    @property
    def user(self) -> str:
        if self._user is None:
            res = self.shell.run(["id", "-un"], timeout=10)
            self._user = res.stdout.strip() if res.ok and res.stdout.strip() else "root"
        return self._user

    def _say(self, msg: str, *, warn: bool = False) -> None:
        self.messages.append(msg)
        if warn:
            self.warn(msg)
