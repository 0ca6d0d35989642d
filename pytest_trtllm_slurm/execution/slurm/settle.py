"""When a batch's final state may be shown: once its reports file is complete. Shared file
systems lag, so after one refresh of the directory's cache only a batch that exited 0 (a
clean pytest writes ``session_finish``) waits for that line, at most ``report_wait``."""

from __future__ import annotations

from pytest_trtllm_slurm.execution.outcome import JobStatus
from pytest_trtllm_slurm.execution.slurm.tracking import TrackedJob
from pytest_trtllm_slurm.node.records import SESSION_FINISH
from pytest_trtllm_slurm.transport.shell import Shell

#: workflows whose command writes no reports file (its exit code is all there is)
NO_REPORTS = frozenset({"build"})


def reports_settled(shell: Shell, job: TrackedJob, now: float, report_wait: float) -> bool:
    """True when the batch's reports are complete, or given up on."""
    if job.state.status not in (JobStatus.COMPLETED, JobStatus.FAILED) or (
            job.handle.spec.workflow in NO_REPORTS) or session_finished(shell, job):
        return True
    if job.settle_since is None:
        job.settle_since = now
        shell.run(["ls", "-a", job.handle.spec.work_dir], timeout=30)  # NFS refresh
        if session_finished(shell, job):
            return True
    if job.state.status is not JobStatus.COMPLETED:
        return True
    return now - job.settle_since >= report_wait


def session_finished(shell: Shell, job: TrackedJob) -> bool:
    """The worker wrote its last line (``session_finish``) to the reports file."""
    path = job.handle.spec.reports_path
    tail = shell.read_from(path, max(0, shell.size(path) - 4096))
    return f'"{SESSION_FINISH}"'.encode() in tail
