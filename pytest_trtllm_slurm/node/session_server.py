"""A worker session that serves batches (``--trtllm-worker-serve DIR``; target side): started
by the node's agent once per run, it collects once, then forks a child per batch request that
takes its GPUs (flock on node-local files) and runs the items: a fork instead of a start."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Any

import pytest

from pytest_trtllm_slurm.node import assignment, item_key, records
from pytest_trtllm_slurm.node.files import announce, write_atomic
from pytest_trtllm_slurm.node.forkloop import ForkLoop, redirect_output, spawn
from pytest_trtllm_slurm.node.paths import Session, gpu_lock
from pytest_trtllm_slurm.node.protocol import EARLY_MISS, GPU_LOCKS_ENV  # noqa: F401

SESSION_IDLE_EXIT = 300.0  # a session whose controller vanished leaves after this


class GpuLeases:
    """Exclusive GPUs of this node by position, through flock'd files in a local dir."""

    def __init__(self, lock_dir: Path | None, visible: list[str]) -> None:
        self.lock_dir = lock_dir
        self.visible = visible

    def take(self, count: int) -> tuple[list[str], list[int]] | None:
        """``count`` free GPUs (their ids, and the fds holding them), or None."""
        if count <= 0:
            return [], []
        if count > len(self.visible):
            raise ValueError(f"the batch wants {count} GPUs, this node has {len(self.visible)}")
        if self.lock_dir is None:  # no agent: nothing to share with
            return self.visible[:count], []
        ids: list[str] = []
        fds: list[int] = []
        for gpu in self.visible:
            fd = os.open(gpu_lock(self.lock_dir, gpu), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            ids.append(gpu)
            fds.append(fd)
            if len(ids) == count:
                return ids, fds
        for fd in fds:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
        return None


def one_node_job_env(gpu_ids: list[str]) -> dict[str, str]:
    """The Slurm variables a one-node, one-task job with these GPUs shows its test (the
    agent's step describes the whole allocation); SLURM_JOB_ID stays the allocation's."""
    node = os.environ.get("SLURMD_NODENAME") or os.environ.get("SLURM_NODENAME", "")
    env = {"CUDA_VISIBLE_DEVICES": ",".join(gpu_ids)}
    if not os.environ.get("SLURM_JOB_ID"):  # not under Slurm (a local agent): nothing more
        return env
    one = {"SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1", "SLURM_STEP_NUM_NODES": "1",
           "SLURM_NTASKS": "1", "SLURM_NPROCS": "1", "SLURM_STEP_NUM_TASKS": "1",
           "SLURM_TASKS_PER_NODE": "1", "SLURM_STEP_TASKS_PER_NODE": "1",
           "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
           "SLURM_GPUS_ON_NODE": str(len(gpu_ids))}
    if node:
        one.update(SLURM_JOB_NODELIST=node, SLURM_NODELIST=node, SLURM_STEP_NODELIST=node)
    if os.environ.get("SLURM_JOB_GPUS") or os.environ.get("SLURM_STEP_GPUS"):
        one.update(SLURM_JOB_GPUS=",".join(gpu_ids), SLURM_STEP_GPUS=",".join(gpu_ids))
    return {**env, **one}


def visible_gpus(total: int) -> list[str]:
    """The GPUs the agent's step was given (CUDA_VISIBLE_DEVICES), else 0..total-1."""
    text = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    ids = [x.strip() for x in text.split(",") if x.strip()]
    return ids or [str(i) for i in range(total)]


class SessionServer:
    """Replaces the session's test loop with serving batch requests."""

    def __init__(self, config: pytest.Config, serve_dir: Path, writer: Any) -> None:
        self.config = config
        self.serve_dir = serve_dir
        self.writer = writer
        self.items: dict[str, list[pytest.Item]] = {}  # key -> items (``item_key``)
        self.leases: GpuLeases | None = None

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool:
        self.items = self.writer.candidates(session)
        lock_dir = os.environ.get(GPU_LOCKS_ENV)
        self.session = session
        self._lock_dir = Path(lock_dir) if lock_dir else None
        write_atomic(Session(self.serve_dir).ready, f"{os.getpid()}\n")
        ForkLoop(self.serve_dir, self._start, idle_exit=SESSION_IDLE_EXIT,
                 watch_parent=True).run()
        return True

    def _start(self, request: dict[str, Any]) -> int | None:
        fds: list[int] = []  # the GPUs' lock files, held by the child
        if "devices" in request:  # chosen by the controller (a local session: no agent)
            gpu_ids = [str(d) for d in request["devices"]]
        else:
            if self.leases is None:
                self.leases = GpuLeases(self._lock_dir,
                                        visible_gpus(int(request.get("gpus_total", 0))))
            try:
                taken = self.leases.take(int(request.get("gpus", 0)))
            except ValueError as exc:
                why = str(exc)
                return spawn(lambda: self._refuse(request, why))
            if taken is None:
                return None
            gpu_ids, fds = taken
        pid = spawn(lambda: self._run_batch(request, gpu_ids))
        for fd in fds:  # the child holds the locks now; closing our copies keeps them held
            os.close(fd)
        write_atomic(request["pid_path"], f"{pid}\n")
        announce(request.get("notice_path"))
        return pid

    def _refuse(self, request: dict[str, Any], why: str) -> int:
        redirect_output(request["log_path"])
        print(f"[trtllm-slurm] batch refused: {why}", flush=True)
        return 2

    def _run_batch(self, request: dict[str, Any], gpu_ids: list[str]) -> int:
        # (node id, key) pairs; a bare list of node ids names tests by their own ids
        wanted = assignment.parse(request.get("tests", request.get("nodeids", [])))
        if not self.writer.wanted and any(key not in self.items for _, key in wanted):
            # not collected from the run's arguments: the controller re-sends it elsewhere
            return EARLY_MISS
        for key, value in (request.get("env") or {}).items():
            os.environ[key] = value
        if "devices" not in request:
            os.environ.update(one_node_job_env(gpu_ids))
        elif gpu_ids:  # none: the session's own devices, as a fresh local worker sees them
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_ids)
        self._own_basetemp(str(request.get("name", os.getpid())))
        redirect_output(request["log_path"])
        self.writer.reopen(Path(request["reports_path"]), request.get("notice_path"))
        # the batch's own reports file, as a fresh worker's option names it
        self.config.option.trtllm_worker_reports = request["reports_path"]
        items, missing = item_key.pick(wanted, self.items)  # under the controller's ids
        if missing:
            for record in self.writer.collect_errors:
                self.writer.emit(record)
            self.writer.emit(records.missing(missing, str(self.config.rootpath)))
        session = self.session
        failed_before = session.testsfailed
        for index, item in enumerate(items):
            nextitem = items[index + 1] if index + 1 < len(items) else None
            item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
        status = 1 if session.testsfailed > failed_before else 0
        artefacts = self.config.pluginmanager.get_plugin("trtllm-slurm-artefacts")
        if artefacts is not None:  # this child ends without pytest-cov's own finish
            artefacts.write(Path(request["reports_path"]).parent, running=True)
        self.writer.emit(records.session_finish(status))
        with contextlib.suppress(Exception):
            self.writer.close()
        return status

    def _own_basetemp(self, name: str) -> None:
        """Batches side by side get their own folder below --basetemp (as xdist's workers)."""
        factory = getattr(self.config, "_tmp_path_factory", None)
        given = getattr(factory, "_given_basetemp", None)
        if factory is not None and given is not None:
            factory._given_basetemp = Path(given) / name
            factory._basetemp = None
