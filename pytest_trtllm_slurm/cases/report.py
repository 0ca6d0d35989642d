"""A case's result as people read it (the CLI prints it; a case item adds it to its report).
The JSON form carries every field."""
from __future__ import annotations

from pytest_trtllm_slurm.cases.model import CaseResult, CaseStatus


def format_result(result: CaseResult, *, head: int = 20, tail: int = 40) -> str:
    """The result for people (the JSON form carries every field)."""
    code = f"exit code {result.exit_code}" if result.exit_code is not None else "no exit code"
    lines = [f"Status:     {result.status.value} ({code})",
             f"Workflow:   {result.workflow}" + (f" ({result.model_name})"
                                                  if result.model_name else ""),
             f"Command:    {result.command}"]
    where = result.scenario or "not run"
    if result.partition:
        where += f", partition {result.partition}"
    if result.account:
        where += f", account {result.account}"
    lines.append(f"Scenario:   {where}")
    if result.job_id:
        lines.append(f"Job:        {result.job_id} ({result.job_name})"
                     + (f" on {result.nodelist}" if result.nodelist else ""))
    if result.devices is not None:
        d = result.devices
        src = f" [{d.source}]" if d.source else ""
        lines.append(f"Devices:    {d.total} = {d.nodes} node(s) x {d.per_node}{src}")
    if result.container_image:
        lines.append(f"Image:      {result.container_image}")
    if result.elapsed_seconds is not None:
        lines.append(f"Elapsed:    {result.elapsed_seconds:.1f} s "
                     f"(wall {result.wall_seconds or 0:.1f} s)")
    if result.work_dir:
        lines.append(f"Work dir:   {result.work_dir}")
    lines += [f"  {name + ':':<10}{path}" for name, path in result.log_paths.items()]
    lines += _summary_lines(result)
    lines += [f"Check:      {check['message']}" for check in result.checks]
    lines += [f"Note:       {note}" for note in result.notes]
    if result.errors:
        lines.append("Errors:")
        lines += [f"  {e}" for e in result.errors]
    if result.log_head and head > 0:
        lines.append(f"--- first {min(head, len(result.log_head))} lines of the log ---")
        lines += result.log_head[:head]
    if result.log_tail and tail > 0:
        lines.append(f"--- last {min(tail, len(result.log_tail))} lines of the log ---")
        lines += result.log_tail[-tail:]
    return "\n".join(lines)


def _summary_lines(result: CaseResult) -> list[str]:
    summary = result.summary
    out: list[str] = []
    if summary.get("pytest"):
        out.append(f"Summary:    {summary['pytest']['line']}")
    if summary.get("accuracy"):
        out.append("Summary:    accuracy")
        out += [f"  {a['task']}: {a['value']:.10g}" + (f" ({a['samples']} samples)"
                                                    if a.get("samples") else "")
                for a in summary["accuracy"]]
    elif "accuracy" in summary:
        out.append("Summary:    no accuracy line found in the log")
    if summary.get("performance"):
        out.append("Summary:    PERFORMANCE OVERVIEW")
        out += [f"  {k}: {v:.10g}" for k, v in summary["performance"].items()]
    elif "performance" in summary:
        out.append("Summary:    no PERFORMANCE OVERVIEW block in the log")
    if summary.get("last_lines") and result.status is CaseStatus.PASSED:
        out.append("Summary:    last lines")
        out += [f"  {line}" for line in summary["last_lines"]]
    return out
