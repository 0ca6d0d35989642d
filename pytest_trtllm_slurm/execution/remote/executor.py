"""remote_slurm: the same SlurmExecutor, over an SSH shell, with paths mapped.

Nothing Slurm-specific lives here. A JobSpec is written by the controller with local
paths; before submission every local path prefix (the rootdir, the work root) is
replaced by its remote counterpart and the interpreter by the cluster's, the node-id
file and job_spec.json are written on the cluster, and the inner executor runs the
mapped spec. The monitor then reads reports and logs through the SSH shell by offset.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from pathlib import PurePosixPath
from typing import Any

from pytest_trtllm_slurm.execution.outcome import JobState
from pytest_trtllm_slurm.execution.protocol import Executor, JobHandle
from pytest_trtllm_slurm.node import assignment
from pytest_trtllm_slurm.planning.jobspec import JobSpec
from pytest_trtllm_slurm.transport.shell import Shell


class PathMap:
    """Local path prefixes -> remote ones, longest first."""

    def __init__(self, pairs: dict[str, str], python: str) -> None:
        self.pairs = sorted(
            ((k.rstrip("/"), v.rstrip("/")) for k, v in pairs.items()), key=lambda kv: -len(kv[0])
        )
        self.python = python

    def text(self, value: str) -> str:
        for local, remote in self.pairs:
            if value == local or value.startswith(local + "/"):
                return remote + value[len(local) :]
            marker = "=" + local  # options written as -o key=/local/path
            if marker in value and (value.endswith(marker) or marker + "/" in value):
                return value.replace(marker, "=" + remote, 1)
        return value

    def argv(self, argv: list[str], *, interpreter: str | None) -> list[str]:
        mapped = [self.text(a) for a in argv]
        if mapped and interpreter is not None and mapped[0] == interpreter:
            mapped[0] = self.python
        return mapped

    def spec(self, spec: JobSpec, interpreter: str) -> JobSpec:
        update: dict[str, object] = {
            name: self.text(getattr(spec, name))
            for name in (
                "rootdir",
                "invocation_dir",
                "work_dir",
                "log_path",
                "reports_path",
                "nodeids_file",
            )
            if getattr(spec, name)
        }
        update["command"] = self.argv(spec.command, interpreter=interpreter)
        update["rerun_argv"] = self.argv(spec.rerun_argv, interpreter=interpreter)
        update["remote_work_dir"] = self.text(spec.work_dir)
        return spec.model_copy(update=update)


class _FromInner:
    """A read-only attribute of the wrapped executor (``default`` when it has none)."""

    def __init__(self, name: str, default: Any) -> None:
        self.name, self.default = name, default

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else getattr(obj.inner, self.name, self.default)


class RemoteSlurmExecutor:
    """An Executor that maps a spec to the cluster's paths and delegates to ``inner``."""

    def __init__(self, inner: Executor, paths: PathMap, interpreter: str,
                 before_close: Callable[[], None] | None = None) -> None:
        self.inner = inner
        self.before_close = before_close  # e.g. stop the early sessions no batch took
        self.shell: Shell = inner.shell
        self.paths = paths
        self.interpreter = interpreter

    # what the controller reads of a Slurm executor is the inner one's: its discovery
    # (job_spec.json), and what the packer sizes pools by (``pools_from_executors``), as
    # for a local cluster: a persistent allocation's batches are packed into it with a warm
    # worker's start-up, not into the partition with a cold run's measured start-up
    slurm_env = _FromInner("slurm_env", None)
    persistent = _FromInner("persistent", False)
    allocations = _FromInner("allocations", None)
    warm_workers = _FromInner("warm_workers", False)
    poll_hint = _FromInner("poll_hint", None)

    def submit(self, spec: JobSpec) -> JobHandle:
        remote = self.paths.spec(spec, self.interpreter)
        self.shell.mkdir(remote.work_dir)
        if remote.nodeids_file:
            self.shell.write_file(remote.nodeids_file, assignment.dumps(spec.assignment()))
        self.shell.write_file(
            str(PurePosixPath(remote.work_dir) / "job_spec.json"),
            remote.masked().model_dump_json(indent=2) + "\n",
        )
        return self.inner.submit(remote)

    def poll(self, handles: list[JobHandle]) -> dict[str, JobState]:
        return self.inner.poll(handles)

    def expect(self, tests: Mapping[str, str]) -> None:
        expect = getattr(self.inner, "expect", None)
        if expect is not None:
            expect(tests)

    def prepare(self) -> None:
        prepare = getattr(self.inner, "prepare", None)
        if prepare is not None:
            prepare()

    def cancel(self, handle: JobHandle) -> None:
        self.inner.cancel(handle)

    def rerun_command(self, spec: JobSpec, nodeid: str) -> str:
        target = getattr(self.shell, "target", None)
        if target is None:
            where = ["--", self.shell.name]
        else:
            where = ["-p", str(target.port), "--", f"{target.user}@{target.hostname}"]
        return shlex.join(["ssh", *where, self.inner.rerun_command(spec, nodeid)])

    def close(self) -> None:
        if self.before_close is not None:
            self.before_close()
        self.inner.close()
