"""When a batch's final state may be shown: once its reports file is complete.

Shared file systems lag: a job can end before its last report lines are visible here.
A batch whose process ended (exit code, sacct) has closed its reports file, so after
one refresh of the directory's attribute cache what is there is all there is: a crash
(no ``session_finish`` line, ever) is decided at once. Only a batch that exited 0 (a
clean pytest always writes the line) waits for it, bounded by ``report_wait``. A build job
writes no reports at all: it has nothing to wait for.
"""

from __future__ import annotations

from pytest_trtllm_slurm.execution.outcome import JobStatus
from pytest_trtllm_slurm.execution.slurm.tracking import TrackedJob
from pytest_trtllm_slurm.node.records import SESSION_FINISH
from pytest_trtllm_slurm.transport.shell import Shell

#: workflows whose command writes no reports file (its exit code is all there is)
NO_REPORTS = frozenset({"build"})


def reports_settled(shell: Shell, job: TrackedJob, now: float, report_wait: float) -> bool:
    """True when the batch's reports are complete, or given up on."""
    if job.state.status not in (JobStatus.COMPLETED, JobStatus.FAILED):
        return True
    if job.handle.spec.workflow in NO_REPORTS:
        return True
    if session_finished(shell, job):
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
