"""``trtllm-slurm run``: one TensorRT-LLM case as a job, with the plugin's settings,
routing, executors and monitor; the exit codes per status are in docs/cases.md."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from pytest_trtllm_slurm.cases.model import (
    EXIT_CODES,
    EXIT_CONFIG,
    EXIT_INTERRUPTED,
    CaseResult,
    CaseStatus,
)
from pytest_trtllm_slurm.cases.report import format_result
from pytest_trtllm_slurm.errors import ConfigError

EPILOG = (
    "exit codes: 0 PASSED, 1 FAILED, 2 ERROR, 3 TIMEOUT, 4 bad input (nothing ran), "
    "5 CANCELLED, 6 OUT_OF_MEMORY, 7 HANG_DETECTED, 8 BUILD_FAILED, 130 interrupted. "
    "Workflow order when classifying: custom, bench, eval, test (one of them only)."
)

# the options.OPTIONS names this command takes (each is also its argparse dest)
SETTING_FLAGS = frozenset({
    "slurm_cluster", "slurm_partition", "slurm_account", "slurm_time_limit", "device_type",
    "container_image", "scenario", "persistent", "alloc_time_limit", "alloc_nodes", "config",
    "work_dir", "monitor_timeout", "hang_pattern"})


def add_run_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "run",
        help="run a TensorRT-LLM test, bench, eval or custom command as a job",
        description="Run one case where it fits (here, a container, or Slurm), watch it "
        "(hang detection, wall-clock limit) and report status, exit code, elapsed time, log "
        "paths and a summary by workflow.",
        epilog=EPILOG,
    )
    what = p.add_argument_group("what to run (one of)")
    what.add_argument("--test-cmd", metavar="CMD", help="pytest (or other test) command line")
    what.add_argument("--bench-cmd", metavar="CMD", help="trtllm-bench command (chain)")
    what.add_argument("--eval-cmd", metavar="CMD", help="trtllm-eval command")
    what.add_argument("--custom-cmd", metavar="CMD", help="any command line")
    what.add_argument("--custom-script", metavar="PATH",
                      help="a script run as `bash PATH` (its folder is mounted)")
    what.add_argument("--job-spec", metavar="PATH",
                      help="re-run a job_spec.json as written (in a fresh work dir)")
    case = p.add_argument_group("case options")
    case.add_argument("--custom-env", metavar="KEY=VALUE", nargs="+", action="extend",
                      default=[], help="environment for the command (KEY=VALUE pairs)")
    case.add_argument("--perf-config-yaml", metavar="PATH",
                      help="perf-sanity YAML that sizes a test_e2e[...] test command")
    case.add_argument("--model-name", metavar="NAME", help="short name for the job and work dir")
    case.add_argument("--required-devices", type=int, metavar="N",
                      help="GPUs (default: derived from the command, else 1)")
    case.add_argument("--total-required-devices", type=int, metavar="N",
                      help="GPUs across all nodes")
    case.add_argument("--required-devices-per-node", type=int, metavar="N",
                      help="GPUs per node (node count = ceil(total / per node))")
    case.add_argument("--mem-mb", type=int, metavar="MB", help="memory per node (Slurm --mem)")
    case.add_argument("--success-pattern", action="append", default=[], metavar="REGEX",
                      help="log line that must appear for PASSED (repeatable: any one)")
    case.add_argument("--failure-pattern", action="append", default=[], metavar="REGEX",
                      help="log line that means FAILED (repeatable)")
    case.add_argument("--check", action="append", default=[], metavar="CHECK",
                      help="metric check, e.g. 'accuracy >= 79.0' or 'Total Output Throughput "
                      "(tokens/sec) >= 1000 (tolerance 5%%)'; a failed one makes the case FAILED")
    case.add_argument("--monitor-timeout", metavar="DURATION",
                      help="wall-clock limit once running (1h, 30m, 3600s, HH:MM:SS; default 1h)")
    target = p.add_argument_group("where (same as the plugin's options)")
    target.add_argument("--slurm-cluster", metavar="NAME")
    target.add_argument("--slurm-partition", metavar="NAME")
    target.add_argument("--slurm-account", metavar="NAME")
    target.add_argument("--slurm-time-limit", metavar="DURATION",
                        help="Slurm wall time (default 02:00:00)")
    target.add_argument("--device-type", metavar="TYPE", help="e.g. H200")
    target.add_argument("--container-image", metavar="IMAGE")
    target.add_argument("--scenario", choices=("auto", "local_direct", "local_docker",
                                               "local_slurm", "remote_slurm"))
    target.add_argument("--persistent", dest="persistent", action="store_const", const=True,
                        default=None, help="run as a step of the persistent allocation (default)")
    target.add_argument("--one-shot", dest="persistent", action="store_const", const=False,
                        help="one sbatch job for this case")
    target.add_argument("--alloc-time-limit", metavar="DURATION",
                        help="wall time of a new persistent allocation (default 4h)")
    target.add_argument("--alloc-nodes", metavar="N",
                        help="nodes of the persistent allocation (default: as many as the "
                        "case needs)")
    target.add_argument("--config", metavar="PATH", help="clusters file (TOML)")
    target.add_argument("--rootdir", metavar="PATH", default=None,
                        help="repository root: the job's working directory and where "
                        "work_dirs/ lives (default: the current directory)")
    target.add_argument("--work-dir", metavar="PATH", help="where job folders are written")
    target.add_argument("--hang-pattern", action="append", metavar="TEXT",
                        help="log text that means a hang (default 'hang detected')")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(handler=run_run)
    return p


# --------------------------------------------------------------------------- settings


def settings_from_args(args: argparse.Namespace, rootdir: Path) -> tuple[Any, Any]:
    """(Settings, ClustersFile) as the plugin resolves them: CLI > env > clusters file."""
    import pytest_trtllm_slurm.controller.options as options

    def raw(opt: options.Opt) -> tuple[Any, str | None]:
        value = getattr(args, opt.name, None) if opt.name in SETTING_FLAGS else None
        if value is not None:
            return value, "cli"
        text = os.environ.get(opt.env)
        if text not in (None, ""):
            return text, "env"
        return None, None

    cwd = Path.cwd()
    return options.build_settings(raw, bases={"cli": cwd, "env": cwd}, rootdir=rootdir)


# the case inputs whose argparse dest is CaseInput's own name
_CASE_FLAGS = ("test_cmd", "bench_cmd", "eval_cmd", "custom_cmd", "custom_script",
               "perf_config_yaml", "model_name", "required_devices", "total_required_devices",
               "required_devices_per_node", "mem_mb")


def case_input_from_args(args: argparse.Namespace) -> Any:
    from pytest_trtllm_slurm.cases.model import CaseInput, parse_custom_env

    return CaseInput.build(
        "trtllm-slurm run", **{name: getattr(args, name) for name in _CASE_FLAGS},
        custom_env=parse_custom_env(args.custom_env), monitor_timeout=args.monitor_timeout,
        success_patterns=args.success_pattern, failure_patterns=args.failure_pattern,
        checks=args.check,
    )


# --------------------------------------------------------------------------- handler


def run_run(args: argparse.Namespace) -> int:
    from pytest_trtllm_slurm.controller.interrupts import signals_as_interrupt

    try:
        with signals_as_interrupt():  # SIGTERM / SIGHUP cancel the job as Ctrl-C does
            result = _run(args)
    except ConfigError as exc:
        if args.json:
            print(json.dumps({"status": CaseStatus.ERROR.value, "exit_code": None,
                              "errors": [f"bad input: {exc}"]}, indent=2))
        print(f"trtllm-slurm run: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except KeyboardInterrupt as exc:
        partial = getattr(exc, "result", None)
        if partial is not None:
            _print(partial, args.json)
        print("trtllm-slurm run: interrupted; the job was cancelled", file=sys.stderr)
        return EXIT_INTERRUPTED
    _print(result, args.json)
    return EXIT_CODES[result.status]


def _run(args: argparse.Namespace) -> CaseResult:
    from pytest_trtllm_slurm.cases.run import (
        close_executors,
        discover_context,
        rerun_job_spec,
        run_case,
    )

    rootdir = Path(args.rootdir or os.getcwd()).resolve()
    if args.job_spec:
        given = [f"--{d.replace('_', '-')}" for d in _CASE_FLAGS if getattr(args, d) is not None]
        given += ["--custom-env"] * bool(args.custom_env) + ["--check"] * bool(args.check)
        if given:
            raise ConfigError(f"--job-spec re-runs a job_spec.json as written; it takes no "
                              f"case inputs (found {', '.join(given)})")
    inp = None if args.job_spec else case_input_from_args(args)
    if inp is not None:
        from pytest_trtllm_slurm.cases.model import classify

        classify(inp, base=rootdir)  # bad input fails before any probe
    settings, clusters = settings_from_args(args, rootdir)
    ctx = discover_context(settings, clusters, rootdir, held=getattr(args, "held_code", None))
    try:
        if args.job_spec:
            timeout = settings.monitor_timeout_seconds if args.monitor_timeout else None
            return rerun_job_spec(Path(args.job_spec).resolve(), ctx,
                                  monitor_timeout_seconds=timeout)
        assert inp is not None
        return run_case(inp, ctx)
    finally:
        close_executors(ctx)


def _print(result: CaseResult, as_json: bool) -> None:
    print(result.model_dump_json(indent=2) if as_json else format_result(result))
