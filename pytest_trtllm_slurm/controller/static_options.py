"""With ``--trtllm-collect=target`` the conftests are never imported (they may need a GPU),
yet their options are on the command line: their literal ``addoption`` calls are read
with ``ast`` so pytest accepts them and passes them on."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

_TYPES = {"int": int, "float": float, "str": str}
_KEPT = {"action", "nargs", "default", "dest", "help", "choices", "metavar", "const",
         "required", "type"}


@dataclass
class StaticOption:
    """One ``addoption`` or ``addini`` call read from a conftest."""

    kind: str  # "addoption" | "addini"
    names: list[str]
    kwargs: dict[str, Any]


def _literal(node: ast.expr) -> tuple[bool, Any]:
    if isinstance(node, ast.Name) and node.id in _TYPES:
        return True, _TYPES[node.id]
    try:
        return True, ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError, RecursionError):
        return False, None


def read_options(path: Path) -> list[StaticOption]:
    """The options ``path``'s ``pytest_addoption`` adds (none if it cannot be parsed)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return []
    found: list[StaticOption] = []
    for func in tree.body:
        if not (isinstance(func, ast.FunctionDef) and func.name == "pytest_addoption"):
            continue
        for node in ast.walk(func):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("addoption", "addini")):
                continue
            names = [n.value for n in node.args if isinstance(n, ast.Constant)
                     and isinstance(n.value, str)]
            if not names or len(names) != len(node.args) and node.func.attr == "addoption":
                continue
            kwargs: dict[str, Any] = {}
            for kw in node.keywords:
                if kw.arg is None or kw.arg not in _KEPT and node.func.attr == "addoption":
                    continue
                ok, value = _literal(kw.value)
                if ok:
                    kwargs[kw.arg] = value
            if node.func.attr == "addini":
                found.append(StaticOption("addini", names[:1], _ini_kwargs(names, kwargs)))
            else:
                found.append(StaticOption("addoption", names, kwargs))
    return found


def _ini_kwargs(names: list[str], kwargs: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"help": names[1] if len(names) > 1 else kwargs.get("help", "")}
    if kwargs.get("type") in ("string", "paths", "pathlist", "args", "linelist", "bool",
                              "int", "float"):
        out["type"] = kwargs["type"]
    if "default" in kwargs:
        out["default"] = kwargs["default"]
    return out


def initial_conftests(rootpath: Path, args: list[str], invocation_dir: Path) -> list[Path]:
    """The conftests pytest would import before parsing the command line: those of each
    argument's folder and its parents down from the rootdir, and of its ``test*`` folders."""
    found: dict[Path, None] = {}
    for arg in args or ["."]:
        path = Path(invocation_dir, arg.split("::", 1)[0])
        folder = path if path.is_dir() else path.parent
        chain = [folder, *folder.parents]
        for parent in reversed(chain):
            if parent == rootpath or rootpath in parent.parents:
                conf = parent / "conftest.py"
                if conf.is_file():
                    found[conf.resolve()] = None
        if path.is_dir():
            for sub in sorted(path.glob("test*")):
                if (sub / "conftest.py").is_file():
                    found[(sub / "conftest.py").resolve()] = None
    return list(found)


class StaticOptionsPlugin:
    """Registered instead of the conftests: adds their options to pytest's parser."""

    def __init__(self, options: list[StaticOption]) -> None:
        self.options = options
        self.skipped: list[str] = []

    def pytest_addoption(self, parser: pytest.Parser) -> None:
        for option in self.options:
            try:
                if option.kind == "addini":
                    parser.addini(option.names[0], **option.kwargs)
                else:
                    parser.addoption(*option.names, **option.kwargs)
            except (ValueError, TypeError) as exc:  # a clash, or a kwarg argparse refuses
                taken = "already added" in str(exc) or "conflicting" in str(exc)
                if option.kind == "addoption" and not taken:
                    action = option.kwargs.get("action")
                    simple = ("store_true", "store_false", "append", "count")
                    try:
                        parser.addoption(*option.names,
                                         action=action if action in simple else "store")
                        continue
                    except (ValueError, TypeError):
                        pass
                self.skipped.append(f"{'/'.join(option.names)} ({exc})")


def static_plugin(rootpath: Path, args: list[str], invocation_dir: Path) -> StaticOptionsPlugin:
    options: list[StaticOption] = []
    for conftest in initial_conftests(rootpath, args, invocation_dir):
        options += read_options(conftest)
    return StaticOptionsPlugin(options)

