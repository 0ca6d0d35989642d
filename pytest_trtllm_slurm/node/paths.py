"""The name of every file and folder the plugin keeps, one class per folder, generic over the
path type (``Path`` here, POSIX ``str`` on the cluster); no other module spells these names
(tests/test_architecture.py). Stdlib only: the node side reads the same names."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Generic, TypeVar

P = TypeVar("P", str, Path)

WORK_DIRS = "work_dirs"  # the default work root below the pytest rootdir
SHARED_STATE = ".trtllm-state"  # a remote cluster's state folder, beside the checkouts
AGENTS = ".agents"  # the top of the warm workers' mailboxes (``work_dirs/.agents``)
STATE_NAME = ".slurm_alloc.json"  # the persistent allocation's state
COLLECTION_FILE = "collection.json"  # what a collection on the target found
COVERAGE_FILE = "coverage.db"  # artefacts a batch leaves for the controller (node/artefacts)
BENCHMARKS_FILE = "benchmarks.json"
OUTPUTS_DIR = "outputs"  # a batch's own copies of the suite's output paths
STOP = "stop"  # in a mailbox's inbox: leave once nothing runs
HEARTBEAT = "heartbeat.json"  # an agent's last word on what it serves
NEWS = ".news"  # in a work root: one notice per batch whose files changed (node/files.announce)
ENDS = ".ends"  # in a news folder: ENDED's own folder, the one a waiting controller watches
ENDED = "ended"  # in ENDS: renamed in after every exit code (execution/folder_watch)
SYNC_RECORD = ".git/trtllm-sync.json"  # in the remote checkout: what the last sync left


def join(root: P, *parts: str) -> P:
    """``root/part/...`` of the same type as ``root`` (a ``str`` is a POSIX path)."""
    if isinstance(root, str):
        return str(PurePosixPath(root, *parts))
    return root.joinpath(*parts)


def lock_of(path: P) -> P:
    """The lock file that guards ``path``."""
    return join(root_of(path), f"{name_of(path)}.lock")


def holder_of(lock: P) -> P:
    """Who holds ``lock`` (written by its holder)."""
    return join(root_of(lock), f"{name_of(lock)}.holder")


def end_notice(news: P) -> P:
    """The end notice of the news folder ``news`` (in a folder of its own: the notices of
    report lines, which land in ``news``, do not wake a controller that waits for an end)."""
    return join(news, ENDS, ENDED)


def root_of(path: P) -> P:
    return str(PurePosixPath(path).parent) if isinstance(path, str) else path.parent


def name_of(path: str | Path) -> str:
    return PurePosixPath(path).name if isinstance(path, str) else path.name


def _file(*parts: str) -> property:
    """A member naming ``parts`` below the folder."""
    return property(lambda self: self.at(*parts))


@dataclass(frozen=True)
class Folder(Generic[P]):
    dir: P

    def at(self, *parts: str) -> P:
        return join(self.dir, *parts)


@dataclass(frozen=True)
class Gate(Folder[P]):
    """A step started before its GPUs were free waits here (node/gate.py): ``ready.<rank>``,
    ``ready`` (all are), ``open`` (the controller's word), ``done.<rank>``."""

    ready = _file("ready")
    open = _file("open")

    def ready_of(self, rank: int) -> P:
        return self.at(f"ready.{rank}")

    def done_of(self, rank: int) -> P:
        return self.at(f"done.{rank}")


@dataclass(frozen=True)
class Batch(Folder[P]):
    """A batch's work dir (``work_dirs/<name>_<ts>``) as written and read on both sides."""

    job_spec = _file("job_spec.json")
    nodeids = _file("nodeids.json")
    reports = _file("reports.jsonl")
    result = _file("result.json")
    exit_code = _file("exit_code")
    stepid = _file("stepid")
    srun_pid = _file("srun.pid")
    batch_pid = _file("batch.pid")
    step_sh = _file("step.sh")
    sbatch = _file("job.sbatch")
    log = _file("job.log")
    build_log = _file("build.log")
    junit = _file("junit.xml")
    pytest_cache = _file(".pytest_cache")
    collection = _file(COLLECTION_FILE)
    coverage = _file(COVERAGE_FILE)
    benchmarks = _file(BENCHMARKS_FILE)
    outputs = _file(OUTPUTS_DIR)

    @property
    def gate(self) -> Gate[P]:
        return Gate(self.at("gate"))

    @property
    def notice(self) -> P:
        """The batch's notice in its work root's news folder (``files.announce``)."""
        return join(root_of(self.dir), NEWS, name_of(self.dir))

    @property
    def end_notice(self) -> P:
        """Its work root's end notice (``end_notice``)."""
        return end_notice(join(root_of(self.dir), NEWS))

    def case_log(self, model: str, workflow: str) -> P:
        return self.at(f"{model}_{workflow}.log")


@dataclass(frozen=True)
class Mailbox(Folder[P]):
    """A warm worker's or a session's folder: requests arrive in ``inbox``."""

    inbox = _file("inbox")
    stop = _file("inbox", STOP)
    exit_code = _file("exit_code")
    srun_pid = _file("srun.pid")

    def request(self, name: str) -> P:
        return self.at("inbox", f"{name}.json")

    def cancel(self, name: str) -> P:
        return self.at("inbox", f"{name}.cancel")


@dataclass(frozen=True)
class Session(Mailbox[P]):
    """One run's forked pytest session inside an agent (node/session_server.py)."""

    nodeids = _file("nodeids.json")
    reports = _file("reports.jsonl")
    log = _file("session.log")
    ready = _file("ready")

    @property
    def agent(self) -> P:
        """The folder of the agent this session is of."""
        return root_of(root_of(self.dir))


@dataclass(frozen=True)
class Agent(Mailbox[P]):
    """The warm worker of one node (node/agent.py): ``work_dirs/.agents/<job>/<node>-<key>``."""

    heartbeat = _file(HEARTBEAT)
    log = _file("agent.log")
    launcher = _file("agent.sh")
    start_lock = _file("agent.lock")  # two runs that find no agent: one launches it
    starting = _file("agent.starting")

    def session(self, name: str) -> Session[P]:
        return Session(self.at("sessions", name))


@dataclass(frozen=True)
class Runs(Folder[P]):
    """The run registry: a record and a lease per live run, and their locks."""

    lock = _file(".lock")
    checkout_lock = _file(".checkout.lock")

    def record(self, run_id: str) -> P:
        return self.at(f"{run_id}.json")

    def lease(self, run_id: str) -> P:
        return self.at(f"{run_id}.lock")

    @staticmethod
    def lease_of(record: P) -> P:
        """The lease beside a run's record."""
        return join(root_of(record), name_of(record).removesuffix(".json") + ".lock")


@dataclass(frozen=True)
class Cache(Folder[P]):
    """What discovery found, kept between runs (``work_dirs/.cache``)."""

    slurm_env = _file("slurm_env.json")

    def remote_env(self, safe_name: str) -> P:
        return self.at(f"slurm_env-remote-{safe_name}.json")


@dataclass(frozen=True)
class Checkout(Folder[P]):
    """The remote checkout a sync keeps (execution/remote/sync.py)."""

    git = _file(".git")
    record = _file(SYNC_RECORD)

    def bundle(self, branch: str) -> P:
        return self.at(".git", f"trtllm-sync-{branch}.bundle")


@dataclass(frozen=True)
class StateDir(Folder[P]):
    """The persistent allocation's state: ``work_dirs``, or a cluster's ``.trtllm-state``."""

    state = _file(STATE_NAME)

    @property
    def runs(self) -> Runs[P]:
        return Runs(self.at("runs"))


@dataclass(frozen=True)
class WorkRoot(StateDir[P]):
    """``work_dirs``: the batches' work dirs and the plugin's own hidden state."""

    salloc_log = _file(".salloc.log")
    agents = _file(AGENTS)
    news = _file(NEWS)
    gitignore = _file(".gitignore")
    shared_state = _file(SHARED_STATE)

    @property
    def runs(self) -> Runs[P]:
        return Runs(self.at(".runs"))

    def agents_of(self, job_id: str) -> P:
        return self.at(AGENTS, job_id)

    def salloc_dir(self, run_id: str) -> P:
        return self.at(f".salloc-{run_id}")

    def remote_dir(self, cluster: str) -> P:
        """This machine's folder for a remote cluster (its salloc log)."""
        return self.at(f".remote-{cluster}")

    @property
    def cache(self) -> Cache[P]:
        return Cache(self.at(".cache"))


def work_root(work_dir: str | Path | None, rootdir: Path) -> WorkRoot[Path]:
    """The configured work root, else ``<rootdir>/work_dirs``."""
    return WorkRoot(Path(work_dir) if work_dir else Path(rootdir) / WORK_DIRS)


def gpu_lock(lock_dir: P, gpu: int | str) -> P:
    """The flock file of one GPU in a node-local lock folder."""
    return join(lock_dir, f"gpu{gpu}.lock")


def lock_base(root: str) -> Path:
    """``<root>/trtllm-slurm-<uid>``: this user's node-local folder of GPU lock folders."""
    return Path(root) / f"trtllm-slurm-{os.geteuid()}"


def gpu_lock_dir(base: Path, job: str, node: str) -> Path:
    """One allocation's GPU lock folder on one node, in ``lock_base``."""
    return base / f"{job}-{node}".replace("/", "_")
