"""Scheduler commands for jobs and steps over a Shell: every query names its jobs (never
a bare ``squeue``), long id lists are chunked, every command is counted (``counts``)."""

from __future__ import annotations

import re
import shlex
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime

from pytest_trtllm_slurm.errors import ExecutionError
from pytest_trtllm_slurm.execution.slurm.parse import parse_key_values
from pytest_trtllm_slurm.planning.durations import parse_duration  # noqa: F401  (re-exported)
from pytest_trtllm_slurm.transport.shell import CommandResult, Shell

CHUNK = 100  # ids per squeue/sacct/scancel call
TIMEOUT = 30.0  # seconds a scheduler command may take unless told otherwise
QUEUE_FORMAT = "%i|%T|%r|%N|%L|%l|%S"
_INVALID_ID = "invalid job id"
_ACCOUNTING_OFF = ("accounting storage is disabled", "slurm accounting storage is disabled")
NAME_SUFFIX = "-trtllm.persistent"  # a persistent allocation's name ends so
WAITING_REASONS = ("Resources", "Priority", "ReqNodeNotAvail", "Nodes_required")
_JOB_ID = re.compile(r"^(\d+)(?:([_+])(\d+|\[[^\]]*\]))?(?:\.(\w+))?$")


class SchedulerError(ExecutionError):
    """A scheduler command failed (the message names the command and its error)."""

    def __init__(self, result: CommandResult) -> None:
        super().__init__(result.describe())
        self.result = result


@dataclass(frozen=True)
class QueueRow:
    """One ``squeue`` row of a job."""

    job_id: str
    state: str
    reason: str | None
    nodelist: str | None
    time_left: str | None = None
    time_limit: str | None = None
    start: str | None = None  # estimated start (pending) or start time, ISO local time


@dataclass(frozen=True)
class StepRow:
    """One ``squeue -s`` row (steps have no state column: listed means running)."""

    step_id: str  # "<job>.<step>"
    name: str
    nodelist: str | None


@dataclass(frozen=True)
class JobIdentity:
    """Who a queued job belongs to (``squeue -o '%T|%L|%j|%u|%k'``)."""

    job_id: str
    state: str
    time_left: str
    name: str
    user: str
    comment: str


@dataclass(frozen=True)
class AcctRow:
    """Final (or current) state of a job or step from sacct / scontrol."""

    job_id: str
    state: str
    exit_code: int | None
    signal: int | None
    nodelist: str | None
    reason: str | None = None


def split_job_id(raw: str) -> tuple[str, str | None]:
    """``123+0`` -> ("123", None) (a heterogeneous component folded into its job); ``123_4`` ->
    ("123_4", None); ``123.7`` -> ("123", "7"); ``123.batch`` -> ("123", "batch")."""
    text = raw.strip()
    m = _JOB_ID.match(text)
    if not m:
        return text, None
    base, sep, idx, step = m.groups()
    job = f"{base}_{idx}" if sep == "_" else base
    return job, step


def parse_sbatch_id(stdout: str) -> str:
    """``sbatch --parsable`` prints ``123`` or ``123;cluster``; the last line wins."""
    lines = [ln.strip() for ln in stdout.splitlines() if ln.strip()]
    if not lines:
        raise ValueError("sbatch printed no job id")
    job = lines[-1].split(";", 1)[0]
    if not re.fullmatch(r"\d+(_\d+)?", job):
        raise ValueError(f"sbatch printed {lines[-1]!r}, not a job id")
    return job


def parse_exit_code(text: str | None) -> tuple[int | None, int | None]:
    """``3:0`` -> (3, 0); ``0:15`` -> (0, 15); empty -> (None, None)."""
    if not text:
        return None, None
    code, _, sig = text.strip().partition(":")
    try:
        return int(code), int(sig) if sig else 0
    except ValueError:
        return None, None


def format_duration(seconds: int) -> str:
    """Seconds -> ``H:MM:SS`` (readable in warnings)."""
    h, rest = divmod(max(0, int(seconds)), 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}"


def _none(text: str) -> str | None:
    text = text.strip()
    return None if text in ("", "None", "(null)", "N/A") else text


def parse_squeue_jobs(stdout: str) -> dict[str, QueueRow]:
    """``squeue -h -o '%i|%T|%r|%N|%L|%l|%S'`` rows keyed by job id (array tasks as ``123_4``)."""
    rows: dict[str, QueueRow] = {}
    for line in stdout.splitlines():
        cols = line.strip().split("|")
        if len(cols) < 2 or not cols[0]:
            continue
        job, step = split_job_id(cols[0])
        if step is not None or job in rows:  # (a heterogeneous job's later components)
            continue
        cols += [""] * (7 - len(cols))
        rows[job] = QueueRow(job, cols[1].strip(), _none(cols[2]), _none(cols[3]), _none(cols[4]),
                             _none(cols[5]), _none(cols[6]))
    return rows


def parse_squeue_steps(stdout: str) -> dict[str, StepRow]:
    """``squeue -h -s -o '%i|%j|%N'`` rows keyed by ``<job>.<step>``."""
    rows = [line.strip().split("|") + [""] for line in stdout.splitlines()]
    return {cols[0].strip(): StepRow(cols[0].strip(), cols[1], _none(cols[2]))
            for cols in rows if len(cols) >= 3 and "." in cols[0]}


def parse_sacct(stdout: str, *, steps: bool = False) -> dict[str, AcctRow]:
    """``sacct -n -P`` rows by job id (``123+0`` folded into ``123``), or by ``<job>.<step>``."""
    rows: dict[str, AcctRow] = {}
    for line in stdout.splitlines():
        cols = line.strip().split("|")
        if len(cols) < 3 or not cols[0]:
            continue
        job, step = split_job_id(cols[0])
        if steps != (step is not None):
            continue
        key = f"{job}.{step}" if step is not None else job
        if key in rows:
            continue
        code, sig = parse_exit_code(cols[2])
        cols += [""] * (5 - len(cols))
        rows[key] = AcctRow(key, cols[1].strip(), code, sig, _none(cols[3]), _none(cols[4]))
    return rows


def parse_scontrol_job(stdout: str) -> AcctRow | None:
    """``scontrol show job -o ID`` -> AcctRow (JobState, ExitCode, NodeList, Reason)."""
    for line in stdout.splitlines():
        rec = parse_key_values(line)
        if "JobId" in rec and "JobState" in rec:
            code, sig = parse_exit_code(rec.get("ExitCode"))
            return AcctRow(rec["JobId"], rec["JobState"], code, sig, _none(rec.get("NodeList", "")),
                           _none(rec.get("Reason", "")))
    return None


def epoch(stamp: str) -> float | None:
    """A Slurm timestamp (cluster local time) as epoch seconds; None for ``Unknown``."""
    try:
        return datetime.fromisoformat(stamp.strip()).timestamp()
    except ValueError:
        return None


def _answered(res: CommandResult) -> bool:
    """True for an answer, False when the jobs asked about are gone; else SchedulerError."""
    if res.ok:
        return True
    if _INVALID_ID in (res.stderr + res.stdout).lower() and not res.timed_out:
        return False
    raise SchedulerError(res)


def chunks(ids: Iterable[str], size: int = CHUNK) -> Iterator[list[str]]:
    items = list(ids)
    for start in range(0, len(items), size):
        yield items[start:start + size]


_SUBMISSIONS = frozenset({"sbatch", "salloc"})


def job_ids(ids: list[str]) -> list[str]:
    """``ids`` unchanged when each is a Slurm job or step id (a damaged file's ``--user=me``
    given to scancel would cancel every job of a user)."""
    bad = [i for i in ids if not _JOB_ID.fullmatch(str(i))]
    if bad:
        raise ExecutionError(f"refusing Slurm job id(s) {bad!r}: expected numbers such as "
                             "123, 123_4 or 123.0 (a state file or step file may be damaged)")
    return ids


class SlurmJobs:
    """sbatch / squeue / sacct / scontrol / scancel / salloc / srun through one Shell."""

    def __init__(self, shell: Shell) -> None:
        self.shell = shell
        self.counts: Counter[str] = Counter()
        self.accounting: bool | None = None  # None until sacct answered or refused once

    @property
    def total(self) -> int:
        """Scheduler commands issued so far (all kinds)."""
        return sum(self.counts.values())

    def run(self, argv: list[str], *, timeout: float | None = None,
            env: dict[str, str] | None = None, cwd: str | None = None,
            input: str | None = None) -> CommandResult:
        """Run one scheduler command, counted by program; a submission cut by a dropped
        connection is never re-sent (it may have run)."""
        self.counts[argv[0]] += 1
        return self.shell.run(argv, timeout=TIMEOUT if timeout is None else timeout,
                              env=env or None, cwd=cwd, input=input,
                              retry_on_drop=argv[0] not in _SUBMISSIONS)

    def sbatch(self, script_path: str, *, script: str, cwd: str | None = None,
               env: dict[str, str] | None = None) -> str:
        """Submit a script; the job id. ``script``: its text, on stdin (what runs is what was
        rendered); ``env``: the job's variables, in sbatch's environment (in no file)."""
        res = self.run(["sbatch", "--parsable"], input=script, cwd=cwd, env=env)
        if not res.ok:
            raise SchedulerError(res)
        try:
            return parse_sbatch_id(res.stdout)
        except ValueError as exc:
            raise ExecutionError(f"`sbatch --parsable {shlex.quote(script_path)}`: {exc}") from None

    def squeue_jobs(self, ids: Iterable[str]) -> dict[str, QueueRow]:
        """Queue rows of ``ids`` (jobs that left the queue are simply absent)."""
        rows: dict[str, QueueRow] = {}
        for part in chunks(ids):
            res = self.run(["squeue", "-h", "-j", ",".join(part), "-o", QUEUE_FORMAT])
            if _answered(res):  # (else every id of the chunk is gone: not an error)
                rows.update(parse_squeue_jobs(res.stdout))
        return rows

    def squeue_steps(self, alloc_id: str) -> dict[str, StepRow] | None:
        """Running steps of one allocation; None when the allocation itself is gone."""
        res = self.run(["squeue", "-h", "-s", "-j", alloc_id, "-o", "%i|%j|%N"])
        return parse_squeue_steps(res.stdout) if _answered(res) else None

    def sacct(self, ids: Iterable[str], *, steps: bool = False) -> dict[str, AcctRow]:
        """Accounting rows for job or step ids; {} and ``accounting = False`` where disabled."""
        rows: dict[str, AcctRow] = {}
        fmt = "--format=JobID,State,ExitCode,NodeList,Reason"
        for part in chunks(ids):
            argv = ["sacct", "-n", "-P", fmt, "-j", ",".join(part)]
            if not steps:
                argv.insert(1, "-X")
            res = self.run(argv)
            text = (res.stderr + res.stdout).lower()
            if any(s in text for s in _ACCOUNTING_OFF):
                self.accounting = False
                return {}
            if not res.ok:
                raise SchedulerError(res)
            self.accounting = True
            rows.update(parse_sacct(res.stdout, steps=steps))
        return rows

    def failed_steps(self, job_ids: Iterable[str]) -> dict[str, AcctRow]:
        """job id -> the step that explains its failure (its first OOM step, else the first a
        signal ended): the job alone does not say."""
        oom: dict[str, AcctRow] = {}
        signalled: dict[str, AcctRow] = {}
        for step_id, row in self.sacct(job_ids, steps=True).items():
            job_id, _, step = step_id.partition(".")
            if row.state.startswith("OUT_OF_MEMORY"):
                oom.setdefault(job_id, row)
            elif row.signal and step not in ("batch", "extern"):
                signalled.setdefault(job_id, row)
        return {**signalled, **oom}

    def ended(self, job_id: str) -> tuple[AcctRow, float | None] | None:
        """A job's final row and end time from scontrol, else sacct; None while it runs."""
        row: AcctRow | None = None
        end: float | None = None
        res = self.run(["scontrol", "show", "job", "-o", job_id])
        if res.ok:
            row = parse_scontrol_job(res.stdout)
            match = re.search(r"\bEndTime=(\S+)", res.stdout)
            end = epoch(match.group(1)) if match else None
            if row is not None and row.state.startswith("COMPLETING"):
                row = None  # ending, but how: accounting has the final state
        elif _INVALID_ID not in (res.stderr + res.stdout).lower():
            raise SchedulerError(res)
        if row is None and self.accounting is not False:
            res = self.run(["sacct", "-X", "-n", "-P", "-j", job_id,
                            "--format=JobID,State,ExitCode,NodeList,Reason,End"])
            if not res.ok:
                raise SchedulerError(res)
            row = parse_sacct(res.stdout).get(job_id)
            ends = [ln.rsplit("|", 1)[-1] for ln in res.stdout.splitlines() if ln.strip()]
            end = epoch(ends[0]) if ends else None
        if row is None or row.state.split(" ", 1)[0] in (
                "RUNNING", "PENDING", "CONFIGURING", "SUSPENDED", "RESIZING"):
            return None
        return row, end

    def scontrol_job(self, job_id: str) -> AcctRow | None:
        """One job from slurmctld's memory (finished jobs stay there for MinJobAge)."""
        res = self.run(["scontrol", "show", "job", "-o", *job_ids([job_id])])
        return parse_scontrol_job(res.stdout) if _answered(res) else None

    def identity(self, job_id: str) -> JobIdentity | None:
        """State, time left, name, owner and comment of one job; None when it is gone."""
        res = self.run(["squeue", "-h", "-j", job_id, "-o", "%T|%L|%j|%u|%k"])
        if not _answered(res):
            return None
        line = next((ln for ln in res.stdout.splitlines() if ln.strip()), "")
        cols = line.strip().split("|", 4)
        if not cols[0]:
            return None
        cols += [""] * (5 - len(cols))
        return JobIdentity(job_id, cols[0], cols[1], cols[2], cols[3],
                           "" if cols[4] == "(null)" else cols[4])

    def by_name(self, user: str, name: str) -> list[tuple[str, str, str]]:
        """(job id, state, comment) of ``user``'s jobs named ``name`` (user AND name filter)."""
        res = self.run(["squeue", "-h", "-u", user, f"--name={name}", "-o", "%i|%T|%k"])
        if not res.ok:
            raise SchedulerError(res)
        rows = [line.strip().split("|") + [""] for line in res.stdout.splitlines()]
        return [(cols[0], cols[1], cols[2]) for cols in rows if len(cols) >= 3 and cols[0]]

    def scancel(self, ids: Iterable[str]) -> list[CommandResult]:
        """Cancel exactly these jobs or ``job.step`` ids (never by user or name)."""
        return [self.run(["scancel", *part])
                for part in chunks(job_ids([i for i in ids if i]))]


# a job waiting behind the user's own allocation: "PENDING (Resources)" alone looks busy
def own_allocations(jobs: SlurmJobs, user: str, partition: str | None,
                    exclude: str | None = None) -> list[tuple[str, str, str]]:
    """(job id, name, nodelist) of the user's running persistent allocations on ``partition``."""
    argv = ["squeue", "-h", "-u", user, "-t", "RUNNING", "-o", "%i|%j|%N|%P"]
    if partition:
        argv += ["-p", partition]
    res = jobs.run(argv)
    if not res.ok:
        raise SchedulerError(res)
    rows = [line.strip().split("|") for line in res.stdout.splitlines()]
    return [(cols[0], cols[1], cols[2]) for cols in rows
            if len(cols) >= 3 and cols[1].endswith(NAME_SUFFIX) and cols[0] != exclude]


def blocker_note(jobs: SlurmJobs, user: str, partition: str | None, *, one_shot: bool,
                 exclude: str | None = None) -> str | None:
    """A sentence naming the user's own allocations on ``partition`` and what to do; or None."""
    try:
        found = own_allocations(jobs, user, partition, exclude)
    except SchedulerError:
        return None
    if not found:
        return None
    held = ", ".join(f"{job_id} ({name}) on {nodes}" for job_id, name, nodes in found)
    where = f"partition {partition}" if partition else "the default partition"
    use = ("; or use it: run without --trtllm-one-shot" if one_shot else
           "; it may be another checkout's (one persistent allocation per rootdir)")
    return (f"your own persistent allocation {held} holds nodes of {where}. Release it with "
            "`trtllm-slurm alloc release` (in that checkout, or --rootdir DIR), "
            f"--trtllm-release-allocation, or `scancel {found[0][0]}`{use}")
