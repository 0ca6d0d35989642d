"""remote_slurm: the same SlurmExecutor over an SSH shell, with the JobSpec's local path
prefixes (rootdir, work root) and interpreter mapped to the cluster's before submission."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from typing import Any

from pytest_trtllm_slurm.execution.protocol import JobHandle
from pytest_trtllm_slurm.execution.slurm.executor import SlurmExecutor, SlurmSettings
from pytest_trtllm_slurm.node import assignment
from pytest_trtllm_slurm.node.paths import Batch
from pytest_trtllm_slurm.planning.jobspec import JobSpec
from pytest_trtllm_slurm.transport import file_ops
from pytest_trtllm_slurm.transport.file_ops import run_ops
from pytest_trtllm_slurm.transport.shell import Shell


class PathMap:
    """Local path prefixes -> remote ones, longest first."""

    def __init__(self, pairs: dict[str, str], python: str) -> None:
        self.pairs = sorted(((k.rstrip("/"), v.rstrip("/")) for k, v in pairs.items()),
                            key=lambda kv: -len(kv[0]))
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
            for name in ("rootdir", "invocation_dir", "work_dir", "log_path", "reports_path",
                         "nodeids_file")
            if getattr(spec, name)
        }
        update["command"] = self.argv(spec.command, interpreter=interpreter)
        update["rerun_argv"] = self.argv(spec.rerun_argv, interpreter=interpreter)
        update["remote_work_dir"] = self.text(spec.work_dir)
        return spec.model_copy(update=update)


class RemoteSlurmExecutor(SlurmExecutor):
    """The SlurmExecutor over the cluster's SSH shell, the spec's paths mapped to the
    cluster's before submission; the rest is the Slurm executor's own."""

    def __init__(self, shell: Shell, settings: SlurmSettings, *, paths: PathMap,
                 interpreter: str, before_close: Callable[[], None] | None = None,
                 **slurm: Any) -> None:
        super().__init__(shell, settings, **slurm)  # ``slurm``: its collaborators
        self.before_close = before_close  # e.g. stop the early sessions no batch took
        self.paths = paths
        self.interpreter = interpreter

    def submit(self, spec: JobSpec) -> JobHandle:
        remote = self.paths.spec(spec, self.interpreter)
        ops = [file_ops.mkdir(remote.work_dir, private=True),
               file_ops.write(Batch(remote.work_dir).job_spec, remote.text())]
        if remote.nodeids_file:
            ops.append(file_ops.write(remote.nodeids_file,
                                      assignment.dumps(spec.assignment())))
        run_ops(self.shell, ops)  # the folder, then its files: one round trip over the relay
        self.launch.made.add(remote.work_dir)  # made and verified: not made again
        return super().submit(remote)

    def rerun_command(self, spec: JobSpec, nodeid: str) -> str:
        target = getattr(self.shell, "target", None)
        if target is None:
            where = ["--", self.shell.name]
        else:
            where = ["-p", str(target.port), "--", f"{target.user}@{target.hostname}"]
        return shlex.join(["ssh", *where, super().rerun_command(spec, nodeid)])

    def close(self) -> None:
        if self.before_close is not None:
            self.before_close()
        super().close()
