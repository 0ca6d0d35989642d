"""YAML case files collected as pytest items, each pinned local (it is the job's controller);
format and options in docs/cases.md. Nothing runs unless a case file is named."""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_trtllm_slurm.cases.model import CaseInput, CaseResult
    from pytest_trtllm_slurm.cases.run import CaseContext

PLUGIN_NAME = "trtllm-slurm-cases"
INI = "trtllm_case_files"
ENV_FILES = "TRTLLM_SLURM_CASE_FILES"
ENV_CASES = "TRTLLM_SLURM_CASES"
_CTX_KEY = pytest.StashKey["CaseContext"]()
_SUFFIXES = (".yaml", ".yml")
# case-file keys that are not CaseInput fields
_ALIASES = {"devices": "required_devices", "devices_per_node": "required_devices_per_node",
            "total_devices": "total_required_devices", "env": "custom_env",
            "script": "custom_script"}
_WORKFLOW_KEYS = {"pytest": "test_cmd", "test": "test_cmd", "bench": "bench_cmd",
                  "eval": "eval_cmd", "custom": "custom_cmd"}


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("trtllm-slurm")
    try:
        group.addoption("--trtllm-cases", action="append", dest="trtllm_cases", default=None,
                        metavar="PATH", help="YAML case file or folder of them to collect as "
                        f"test items (repeatable; env {ENV_CASES})")
    except ValueError:
        pass  # registered already
    parser.addini(INI, "fnmatch patterns (relative to the rootdir) of YAML case files to "
                  f"collect, e.g. cases/*.yaml (env {ENV_FILES})", type="linelist", default=[])


def register_if_wanted(config: pytest.Config) -> None:
    """Register the case collector when case files were asked for (cheap otherwise)."""
    if config.pluginmanager.has_plugin(PLUGIN_NAME):
        return
    explicit = list(config.getoption("trtllm_cases", None) or [])
    explicit += [p for p in os.environ.get(ENV_CASES, "").split(os.pathsep) if p.strip()]
    try:
        patterns = list(config.getini(INI) or [])
    except ValueError:  # the ini key is registered only when this module loads at start-up
        patterns = []
    patterns += [p.strip() for p in os.environ.get(ENV_FILES, "").splitlines() if p.strip()]
    if not explicit and not patterns:
        return
    config.pluginmanager.register(CaseCollector(config, explicit, patterns), PLUGIN_NAME)


# the hooks when this module is loaded at start-up (``-p pytest_trtllm_slurm.cases.items``);
# the plugin calls both itself otherwise
pytest_addoption = add_options
pytest_configure = register_if_wanted


class CaseCollector:
    """pytest_collect_file for case files; closes the case executors at the end."""

    def __init__(self, config: pytest.Config, explicit: list[str], patterns: list[str]) -> None:
        self.config = config
        base = Path(config.invocation_params.dir)
        self.files: set[Path] = set()
        for text in explicit:
            path = (base / Path(text).expanduser()).resolve()
            if path.is_dir():
                self.files.update(p.resolve() for p in sorted(path.rglob("*"))
                                  if p.suffix in _SUFFIXES)
            elif path.is_file():
                self.files.add(path)
            else:
                raise pytest.UsageError(f"--trtllm-cases {text}: {path} does not exist")
        self.patterns = patterns
        self._add_to_args(base)

    def _add_to_args(self, base: Path) -> None:
        """Explicit case files outside what pytest was asked to collect are added to it."""
        roots = [(base / a.split("::", 1)[0]).resolve() for a in self.config.args]
        for path in sorted(self.files):
            if not any(path == r or r in path.parents for r in roots):
                self.config.args.append(str(path))

    def wanted(self, path: Path) -> bool:
        resolved = path.resolve()
        if resolved in self.files:
            return True
        try:
            rel = resolved.relative_to(self.config.rootpath.resolve()).as_posix()
        except ValueError:
            rel = None
        return any(fnmatch.fnmatch(str(resolved), p) or (rel is not None and fnmatch.fnmatch(
            rel, p)) for p in self.patterns)

    def pytest_collect_file(self, file_path: Path, parent: pytest.Collector) -> pytest.File | None:
        if file_path.suffix in _SUFFIXES and self.wanted(file_path):
            return CaseFile.from_parent(parent, path=file_path)
        return None

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        ctx = session.config.stash.get(_CTX_KEY, None)
        if ctx is not None:
            from pytest_trtllm_slurm.cases.run import close_executors

            close_executors(ctx)


class CaseFile(pytest.File):
    """One YAML case file: ``cases:`` (a list, or a mapping name -> case) and ``defaults:``."""

    def collect(self) -> Iterator[pytest.Item]:
        import yaml

        from pytest_trtllm_slurm.cases.model import CaseInput, classify
        from pytest_trtllm_slurm.errors import ConfigError

        try:
            data = yaml.safe_load(self.path.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise self.CollectError(f"case file {self.path}: not valid YAML ({exc})") from None
        defaults: dict[str, Any] = {}
        if isinstance(data, dict):
            unknown = set(data) - {"cases", "defaults"}
            if unknown:
                raise self.CollectError(f"case file {self.path}: unknown top-level key(s) "
                                        f"{sorted(unknown)}; expected cases: and defaults:")
            defaults = data.get("defaults") or {}
            cases = data.get("cases") or []
        else:
            cases = data
        if isinstance(cases, dict):
            cases = [{"name": name, **(fields or {})} for name, fields in cases.items()]
        if not isinstance(cases, list) or not isinstance(defaults, dict):
            raise self.CollectError(f"case file {self.path}: expected 'cases:' as a list of "
                                    "mappings (or a mapping name -> case) and 'defaults:' as "
                                    "a mapping")
        seen: set[str] = set()
        for index, raw in enumerate(cases):
            where = f"case file {self.path}: cases[{index}]"
            if not isinstance(raw, dict):
                raise self.CollectError(f"{where}: found {raw!r}; expected a mapping")
            try:
                fields = case_fields({**defaults, **raw}, self.path.parent, where)
                name = str(fields.pop("name", None) or f"case{index}")
                inp = CaseInput.build(f"{where} ({name})", name=name, **fields)
                workflow = classify(inp, base=self.path.parent).workflow.value
            except ConfigError as exc:
                raise self.CollectError(str(exc)) from None
            if name in seen:
                raise self.CollectError(f"{where}: duplicate case name {name!r}")
            seen.add(name)
            yield CaseItem.from_parent(self, name=name, case=inp, workflow=workflow,
                                       marks=list(raw.get("marks") or defaults.get("marks")
                                                  or []))


def case_fields(raw: dict[str, Any], base: Path, where: str) -> dict[str, Any]:
    """Case-file keys -> CaseInput fields (aliases, workflow + command, relative paths)."""
    from pytest_trtllm_slurm.errors import ConfigError

    fields = {_ALIASES.get(k, k): v for k, v in raw.items() if k != "marks"}
    workflow, command = fields.pop("workflow", None), fields.pop("command", None)
    if command is not None:
        key = _WORKFLOW_KEYS.get(str(workflow or "pytest").lower())
        if key is None:
            raise ConfigError(f"{where}: workflow {workflow!r}; expected one of "
                              f"{', '.join(sorted(_WORKFLOW_KEYS))}")
        fields[key] = command
    elif workflow is not None:
        raise ConfigError(f"{where}: workflow {workflow!r} without command:")
    for key in ("custom_script", "perf_config_yaml"):
        if fields.get(key) and not Path(str(fields[key])).expanduser().is_absolute():
            fields[key] = str(base / str(fields[key]))
    for key in ("time_limit", "monitor_timeout"):
        if isinstance(fields.get(key), int):
            fields[key] = f"{fields[key]}s"
    return fields


class CaseFailure(Exception):
    """A case that did not pass or a failed metric check (shown without a traceback)."""


class CaseItem(pytest.Item):
    """One case: runs its job through case_run and checks what the log says."""

    def __init__(self, *, case: CaseInput, workflow: str, marks: list[str] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.case = case
        self.workflow = workflow
        self.result: CaseResult | None = None
        # the item is the job's controller: the plugin must never dispatch it
        self.add_marker(pytest.mark.trtllm_slurm(local=True))
        for mark in marks or []:
            self.add_marker(str(mark))

    def runtest(self) -> None:
        from pytest_trtllm_slurm.cases.model import CaseStatus
        from pytest_trtllm_slurm.cases.report import format_result
        from pytest_trtllm_slurm.cases.run import run_case

        result = run_case(self.case, case_context(self.config))
        self.result = result
        props = [("status", result.status.value), ("exit_code", result.exit_code),
                 ("job_id", result.job_id), ("scenario", result.scenario),
                 ("log", result.log_paths.get("log")), ("work_dir", result.work_dir),
                 ("elapsed_seconds", result.elapsed_seconds)]
        self.user_properties += [(k, v) for k, v in props if v is not None]
        self.user_properties += sorted(result.metrics.items())
        self.add_report_section("call", "trtllm-case", format_result(result, head=0, tail=0))
        if result.status is CaseStatus.PASSED:
            return
        # the first line is pytest's short summary: the first reason (a failed check names
        # the metric, its value and the threshold)
        first, *rest = result.errors or [result.status.value]
        code = f" (exit code {result.exit_code})" if result.exit_code is not None else ""
        lines = [f"case {self.name} ({self.workflow}) {result.status.value}{code}: {first}"]
        lines += [f"  {e}" for e in rest]
        lines.append(f"log: {result.log_paths.get('log') or result.work_dir or '?'}")
        if result.job_id:
            lines.append(f"job: {result.job_id} ({result.scenario})")
        if result.log_tail:
            lines.append("--- last lines of the log ---")
            lines += result.log_tail[-20:]
        raise CaseFailure("\n".join(lines))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException],
                     style: Any = None) -> str | Any:
        if isinstance(excinfo.value, CaseFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"{self.name} [{self.workflow} case]"


def case_context(config: pytest.Config) -> CaseContext:
    """The run's CaseContext, built once from the plugin's planning context."""
    cached = config.stash.get(_CTX_KEY, None)
    if cached is not None:
        return cached
    from pytest_trtllm_slurm.cases.run import CaseContext
    from pytest_trtllm_slurm.controller.session import planning_context, terminal_warning

    plan = planning_context(config)
    reporter = config.pluginmanager.get_plugin("terminalreporter")

    def say(message: str) -> None:
        if reporter is not None and config.option.verbose > 0:
            reporter.write_line(f"trtllm-slurm: {message}")

    # remote_env None: the run's remote connections stay the plugin's to close, and cases
    # route by the clusters file alone
    ctx = CaseContext(**{**vars(plan), "remote_env": None},
                      warn=terminal_warning(config), say=say)
    config.stash[_CTX_KEY] = ctx
    return ctx
