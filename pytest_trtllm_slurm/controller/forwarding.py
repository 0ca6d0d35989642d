"""The user's invocation as the worker gets it; which tokens form one option is read from
pytest's own parser, so unknown plugins' options pass through (docs/forwarding.md)."""

from __future__ import annotations

import argparse
import os
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_trtllm_slurm.controller.output_dirs import OutputOption, output_flags

# dests of pytest's own options (and of the report writers users commonly add) that
# the controller owns; an option of a plugin not named here is forwarded
SELECTION = {
    "file_or_dir", "keyword", "markexpr", "deselect", "ignore", "ignore_glob", "lf",
    "failedfirst", "newfirst", "last_failed_no_failures", "cacheclear", "cacheshow",
    "stepwise", "stepwise_skip", "stepwise_reset", "keepduplicates", "collectonly",
    "pyargs", "continue_on_collection_errors",
    "splits", "group",  # pytest-split's shard: a re-run line runs one test, unsharded
}
STOPPING = {"maxfail", "exitfirst"}
OUTPUT_FILES = {
    "xmlpath", "junitprefix", "resultlog", "report_log", "htmlpath", "self_contained_html",
    "css", "json_report_file", "json_report_indent", "clean_alluredir", "log_file",
    "pastebin", "debug",
    "cov_report", "cov_fail_under", "benchmark_json", "benchmark_save",
    "benchmark_autosave", "benchmark_save_data", "benchmark_histogram",
}
SETUP = {"rootdir", "inifilename", "help", "version"}
NO_TERMINAL = {"usepdb", "trace", "usepdb_cls"}  # need the user's terminal
CONTROLLER_DESTS = SELECTION | STOPPING | OUTPUT_FILES | SETUP | NO_TERMINAL
# a report writer whose per-test half runs with the test (pytest-xdist's workers run it):
# when its switch is on here, the worker gets these options too, so it writes no file
WORKER_HALF = {"json_report": ["--json-report-file=none"]}
# values a plugin resolves once for the run, at configure (dest -> flag): the worker gets
# this run's value, never its own (pytest-xdist's workers get them through workerinput)
RESOLVED_HERE = {"randomly_seed": "--randomly-seed"}
CONTROLLER_GROUPS = ("trtllm-slurm", "xdist")  # group names (prefixes) the controller owns
NEVER_A_PATH = {"plugins", "pythonwarnings", "override_ini", "verbose", "reportchars"}
_PATH_WORDS = ("path", "file", "dir", "basetemp", "storage", "config")
# what such an option's value is, when it is not the path: --log-file-level DEBUG
_NOT_PATH_ENDINGS = ("_level", "_format", "_mode")


@dataclass
class Occurrence:
    """One option as written (its tokens), or one positional argument (action None)."""

    tokens: list[str]
    action: argparse.Action | None
    flag: str = ""
    value_at: int | None = None  # tokens[value_at:] are values (a joined value: its own token)


def _argparser(parser: Any) -> argparse.ArgumentParser:
    optparser = getattr(parser, "optparser", None)  # pytest 9
    return optparser if optparser is not None else parser._getparser()  # pytest 8


def _nargs_taken(action: argparse.Action, rest: list[str]) -> int:
    """How many of ``rest`` (the tokens after the flag) argparse gives ``action``."""
    nargs = action.nargs
    if nargs == 0:
        return 0
    if nargs is None:
        return min(1, len(rest))
    if isinstance(nargs, int):
        return min(nargs, len(rest))
    count = 0
    for token in rest:
        if token.startswith("-") and token != "-":
            break
        count += 1
        if nargs == "?":
            break
    return count


def split_options(args: list[str], actions: dict[str, argparse.Action]) -> Iterator[Occurrence]:
    """``args`` cut into options and positional arguments, as argparse reads them."""
    i = 0
    while i < len(args):
        token = args[i]
        if token == "--":
            for rest in args[i + 1 :]:
                yield Occurrence([rest], None)
            return
        if not token.startswith("-") or token == "-":
            yield Occurrence([token], None)
            i += 1
            continue
        flag, eq, joined = token.partition("=")
        action = actions.get(token)
        if action is None and eq and flag in actions:
            yield Occurrence([flag, joined], actions[flag], flag, 1)
            i += 1
            continue
        parts = [Occurrence([token], action, token)] if action is not None else (
            _short_cluster(token, actions) if not token.startswith("--") else [])
        if not parts:  # not pytest's: passed on as written, the worker says what it is
            yield Occurrence([token], None, token)
            i += 1
            continue
        last = parts[-1]
        if last.value_at is None and last.action is not None:
            taken = _nargs_taken(last.action, args[i + 1 :])
            if taken:
                last.tokens += args[i + 1 : i + 1 + taken]
                last.value_at = 1
            i += taken
        yield from parts
        i += 1


def _short_cluster(token: str, actions: dict[str, argparse.Action]) -> list[Occurrence]:
    """Short options run together, one occurrence each: ``-vvx`` (flags), ``-rA`` and
    ``-pno:cacheprovider`` (a flag and its value); [] when it is no such thing."""
    parts: list[Occurrence] = []
    rest = token[1:]
    while rest:
        flag = "-" + rest[0]
        action = actions.get(flag)
        if action is None:
            return []
        rest = rest[1:]
        if action.nargs != 0 and rest:
            parts.append(Occurrence([flag, rest], action, flag, 1))
            return parts
        parts.append(Occurrence([flag], action, flag))
    return parts


def addopts_args(config: pytest.Config) -> list[str]:
    """What pytest put before the command line: the ini's addopts, then PYTEST_ADDOPTS."""
    env = os.environ.get("PYTEST_ADDOPTS", "")
    return [*config.getini("addopts"), *shlex.split(env)]


class Forwarder:
    """Decides, option by option, what the worker gets."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        parser = config._parser  # type: ignore[attr-defined]
        self.actions = dict(_argparser(parser)._option_string_actions)
        self.groups = {name: group.name for group in parser._groups for opt in group.options
                       for name in opt.names()}
        self.here = Path(config.invocation_params.dir)
        self.refused: list[str] = []  # options the run cannot honour on a target
        self.output_flags = output_flags(config)
        self.outputs: list[OutputOption] = []  # each batch writes them a place of its own

    def owned(self, occurrence: Occurrence) -> bool:
        action = occurrence.action
        if action is None:
            return not occurrence.flag  # a positional argument (test selection)
        if action.dest in NO_TERMINAL:
            self.refused.append(occurrence.flag)
        group = self.groups.get(occurrence.flag, "")
        if any(group.startswith(g) for g in CONTROLLER_GROUPS):
            return True
        value = occurrence.tokens[-1] if occurrence.value_at is not None else ""
        if action.dest == "plugins":
            return value.startswith("pytest_trtllm_slurm")
        if action.dest == "override_ini":
            return value.split("=", 1)[0].strip() == "addopts"  # folded in already
        return action.dest in CONTROLLER_DESTS or action.dest in RESOLVED_HERE

    def render(self, occurrence: Occurrence) -> list[str]:
        tokens = list(occurrence.tokens)
        if occurrence.value_at is None or occurrence.action is None:
            return tokens
        values = [self._path(occurrence.action, v) for v in tokens[occurrence.value_at :]]
        if len(tokens) == 2 and occurrence.flag.startswith("--"):
            return [f"{occurrence.flag}={values[0]}"]  # a value that starts with '-' stays its
        return [*tokens[: occurrence.value_at], *values]

    def _path(self, action: argparse.Action, value: str) -> str:
        """``value`` made absolute when it names a path relative to the invocation dir."""
        if (not value or os.path.isabs(value) or action.choices or action.dest in NEVER_A_PATH
                or action.dest.endswith(_NOT_PATH_ENDINGS)
                or action.type in (int, float) or value.startswith("-") or "://" in value):
            return value
        named = f"{action.dest} {action.metavar or ''}".lower()
        if any(word in named for word in _PATH_WORDS) or (self.here / value).exists():
            return str(self.here / value)
        return value

    def output(self, occurrence: Occurrence) -> bool:
        """An option naming where the suite writes (``output_dirs``): kept in ``outputs``."""
        action = occurrence.action
        if (action is None or occurrence.value_at is None
                or not self.output_flags.intersection(action.option_strings)):
            return False
        flag = next((s for s in action.option_strings if s.startswith("--")), occurrence.flag)
        value = occurrence.tokens[-1]
        self.outputs.append(OutputOption.of(flag, os.path.join(self.here, value)))
        return True

    def forwarded(self, *, with_ini: bool = True) -> list[str]:
        """The options of the ini's addopts (with ``with_ini``) and of the command line, with
        ``WORKER_HALF``'s and ``RESOLVED_HERE``'s (PYTEST_ADDOPTS: ``forwarded_addopts``)."""
        ini = list(self.config.getini("addopts")) if with_ini else []
        out = self._kept([*ini, *map(str, self.config.invocation_params.args)])
        option = self.config.option
        out += [token for dest, tokens in WORKER_HALF.items() if getattr(option, dest, None)
                for token in tokens]
        for dest, flag in RESOLVED_HERE.items():  # of the plugins that are active
            value = getattr(option, dest, None)
            if flag in self.actions and value is not None:
                out.append(f"{flag}={value}")
        return out

    def _kept(self, args: list[str]) -> list[str]:
        out: list[str] = []
        for occurrence in split_options(args, self.actions):
            if not self.owned(occurrence) and not self.output(occurrence):
                out += self.render(occurrence)
        return out


def forwarded_addopts(config: pytest.Config) -> str:
    """The worker's PYTEST_ADDOPTS: the ini's addopts and the user's, less what the
    controller owns; not argv, so a ``--api-token=...`` stays out of ``ps`` and files."""
    return shlex.join(Forwarder(config)._kept(addopts_args(config)))


def forwarding_plan(config: pytest.Config, *, with_ini: bool = True
                    ) -> tuple[list[str], list[str], list[OutputOption]]:
    """(the options every worker gets, less the output options; the flags a target cannot
    honour; the output options, whose values each batch gets of its own)."""
    forwarder = Forwarder(config)
    options = forwarder.forwarded(with_ini=with_ini)
    # the output options wherever the user gave them, the last of each flag winning
    finder = Forwarder(config)
    finder._kept([*addopts_args(config), *map(str, config.invocation_params.args)])
    outputs = list({option.flag: option for option in finder.outputs}.values())
    return options, sorted(set(forwarder.refused)), outputs
