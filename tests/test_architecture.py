"""The layers of DESIGN.md hold in the code: import-linter's contracts (pyproject.toml) are
kept, the execution layer imports without pytest, and the folder tree README shows is the
package's."""
from __future__ import annotations

import ast
import logging
import re
import subprocess
import sys
import types
from pathlib import Path, PurePath
from typing import TypeVar

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pytest_trtllm_slurm"


def test_import_contracts_are_kept() -> None:
    """Layers, pytest-free planning/execution/transport, a node that imports only itself,
    and no import cycle anywhere."""
    run = subprocess.run([sys.executable, "-c",
                          "import sys; from importlinter.cli import lint_imports; "
                          "sys.exit(lint_imports(no_cache=True, no_logo=True))"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 broken" in run.stdout, run.stdout


@pytest.mark.parametrize("module", [
    "pytest_trtllm_slurm.execution.slurm.executor",
    "pytest_trtllm_slurm.execution.remote.executor",
    "pytest_trtllm_slurm.execution.local.docker",
    "pytest_trtllm_slurm.planning.requirements",
    "pytest_trtllm_slurm.node.protocol",
    "pytest_trtllm_slurm.cli.main",
])
def test_module_imports_without_pytest(module: str) -> None:
    """What runs the jobs (and the CLI) loads no pytest: a controller-free user of the
    executors pays nothing for it, and the layers cannot lean on it by accident."""
    code = (f"import sys, {module}; "
            "loaded = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('pytest', '_pytest', 'pluggy', 'xdist')); print(loaded); sys.exit(bool(loaded))")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, f"{module} loads {run.stdout.strip()} {run.stderr[-2000:]}"


def test_readme_names_every_layer_folder() -> None:
    """The layout README shows is the one on disk: each folder with its own modules."""
    readme = (ROOT / "README.md").read_text()
    folders = sorted(p.parent.relative_to(PACKAGE).as_posix()
                     for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE)
    assert folders, "no layer folders"
    missing = [f for f in folders if f"{f.rsplit('/', 1)[-1]}/" not in readme]
    assert not missing, f"README's package layout lacks {missing}"
    flat = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert flat == ["__init__.py", "__main__.py", "errors.py", "plugin.py"], flat


def test_the_architecture_page_names_every_module() -> None:
    """docs/architecture.md's tree says what each module does: a module it does not name
    (new, or renamed) is one a reader cannot place."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    modules = sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")
                     if p.name != "__init__.py")
    missing = [m for m in modules if not re.search(rf"\b{re.escape(m.rsplit('/', 1)[-1][:-3])}\b",
                                                  page)]
    assert not missing, f"docs/architecture.md's package layout lacks {missing}"


# -- the executor contract is the only way to read an executor ----------------------------
# Where the controller and the planner live: what they read of an executor must be declared
# on execution.protocol.Executor, not probed for.
READERS = ["controller", "planning", "cases", "cli", "plugin.py"]


def _executor_probes(path: Path) -> list[str]:
    """``getattr(X, ...)`` / ``hasattr(X, ...)`` calls in ``path`` whose X is an executor:
    its source names an executor (``executor``, ``self.executors[t]``, ``executors.get(t)``),
    or it is a name bound by a loop or comprehension over executors (``for e in
    executors.values()``), or a ``getattr`` of those (``getattr(getattr(e, "inner", e), ...)``)."""
    tree = ast.parse(path.read_text(), str(path))
    bound = {name.id for node in ast.walk(tree) if isinstance(node, (ast.For, ast.comprehension))
             and "executor" in ast.unparse(node.iter).lower()
             for name in ast.walk(node.target) if isinstance(name, ast.Name)}

    def is_executor(expr: ast.expr) -> bool:
        if isinstance(expr, ast.Name) and expr.id in bound:
            return True
        if (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name)
                and expr.func.id == "getattr" and expr.args):
            return is_executor(expr.args[0])
        return "executor" in ast.unparse(expr).lower()

    return [f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr") and node.args
            and is_executor(node.args[0])]


def test_nothing_probes_an_executor_for_attributes() -> None:
    """Everything the controller and the planner read of an executor is on its typed
    contract (execution.protocol.Executor): no ``getattr``/``hasattr`` on one, so a new
    executor cannot silently lack what the run loop or the packer needs."""
    files = [f for r in READERS for f in ((PACKAGE / r).rglob("*.py") if (PACKAGE / r).is_dir()
                                          else [PACKAGE / r])]
    assert len(files) > 20
    probes = [p for f in sorted(files) for p in _executor_probes(f)]
    assert not probes, "read these through the Executor contract:\n" + "\n".join(probes)


def test_every_executor_is_the_contract_and_forwards_nothing_by_name() -> None:
    """Every executor class subclasses Executor (so it has the whole contract, defaults
    included) and none answers unknown attributes by forwarding them (``__getattr__``):
    a wrapper states what it forwards, typed."""
    import importlib
    import pkgutil

    import pytest_trtllm_slurm
    from pytest_trtllm_slurm.execution.protocol import Executor

    for info in pkgutil.walk_packages(pytest_trtllm_slurm.__path__, "pytest_trtllm_slurm."):
        if ".node." not in info.name and not info.name.endswith("__main__"):
            importlib.import_module(info.name)
    classes: list[type] = []
    todo: list[type] = [Executor]
    while todo:
        cls = todo.pop()
        classes.append(cls)
        todo += cls.__subclasses__()
    names = {c.__name__ for c in classes if c.__module__.startswith("pytest_trtllm_slurm.")}
    assert {"SlurmExecutor", "RemoteSlurmExecutor", "DirectExecutor", "ContainerExecutor",
            "ClusterJobIds", "UnreachableCluster"} <= names, names
    forwarding = [c.__name__ for c in classes if "__getattr__" in vars(c)]
    assert not forwarding, f"executors that forward attributes by name: {forwarding}"
    # a class outside the hierarchy with an executor's methods would dodge the contract
    strays = [f"{m.__name__}.{name}" for m in list(sys.modules.values())
              if (m.__name__ or "").startswith("pytest_trtllm_slurm.")
              for name, obj in vars(m).items()
              if isinstance(obj, type) and obj.__module__ == m.__name__
              and all(callable(getattr(obj, a, None)) for a in ("submit", "poll", "cancel",
                                                                 "rerun_command"))
              and not issubclass(obj, Executor)]
    assert not strays, f"executors outside the contract: {strays}"


# -- no process-wide state ----------------------------------------------------------------
MUTATORS = {"append", "extend", "insert", "add", "update", "setdefault", "pop", "popitem",
            "remove", "discard", "clear"}
# module-level containers a module writes, each with why it may: only tables filled once
# while the module is imported
ALLOWED_STATE = {
    "execution/records.py:MODELS": "record type -> model, filled by @_shape at import",
}


def _module_state(path: Path) -> list[str]:
    """``global`` statements, and module-level lists/dicts/sets (literals or ``list()``,
    ``dict()``, ``set()``) that code in the module writes: a mutating method call, an item
    or slice assignment, or a ``del`` of an item."""
    tree = ast.parse(path.read_text(), str(path))
    where = path.relative_to(PACKAGE).as_posix()
    found = [f"{where}:{n.lineno}: global {', '.join(n.names)}"
             for n in ast.walk(tree) if isinstance(n, ast.Global)]
    containers = set()
    for node in tree.body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        mutable = isinstance(value, (ast.List, ast.Dict, ast.Set)) or (
            isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
            and value.func.id in ("list", "dict", "set"))
        if mutable:
            containers |= {t.id for t in targets if isinstance(t, ast.Name)}
    for node in ast.walk(tree):
        name = None
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in MUTATORS and isinstance(node.func.value, ast.Name)):
            name = node.func.value.id
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
            for target in getattr(node, "targets", None) or [node.target]:  # type: ignore[attr-defined]
                if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
                    name = target.value.id
        if name in containers and f"{where}:{name}" not in ALLOWED_STATE:
            found.append(f"{where}:{node.lineno}: writes module-level {name}")
    return found


def test_no_process_wide_state() -> None:
    """No module-level ``global`` and no module-level container written at run time: what
    a run shares (the early start's sessions and connections) lives in an object the
    plugin owns (``config.stash``), so two runs in one process (pytester, an API user)
    never see each other's state."""
    found = [f for path in sorted(PACKAGE.rglob("*.py")) for f in _module_state(path)]
    assert not found, "\n".join(found)
    for allowed in ALLOWED_STATE:  # each exception still exists, or it goes from the list
        where, name = allowed.split(":")
        assert name in (PACKAGE / where).read_text(), allowed


# module-level values that are neither immutable nor constant tables, each with why it may
ALLOWED_GLOBALS = {
    "execution/records.py:_ADAPTER": "a pydantic TypeAdapter: built once, never changed",
    "execution/records.py:_DICT_ADAPTER": "a pydantic TypeAdapter: built once, never changed",
    "node/worker.py:_encode": "a JSON encoder's encode: it keeps nothing between calls",
    "transport/ssh/commands.py:_relay_source": "the relay's source file of this package",
    "planning/perf_sanity.py:_load_yaml_cached": "keyed by (path, mtime, size): never stale",
    "planning/perf_sanity.py:_find_yaml": "where a perf config is, per (sources, name)",
}
_SIMPLE = (str, bytes, int, float, bool, type(None), tuple, frozenset, type, re.Pattern,
           PurePath, logging.Logger, TypeVar, pytest.StashKey, types.FunctionType,
           types.ModuleType, types.GenericAlias, types.UnionType)


def _frozen(value: object) -> bool:
    """An instance nobody can change: a frozen dataclass, a frozen pydantic model, a bare
    ``object()`` sentinel."""
    params = getattr(type(value), "__dataclass_params__", None)
    config = getattr(type(value), "model_config", None)
    return (type(value) is object or (params is not None and params.frozen)
            or (isinstance(config, dict) and bool(config.get("frozen")))
            or type(value).__module__ == "typing")  # a type alias


def _module_globals(module: types.ModuleType, path: Path) -> list[str]:
    """Names bound at the top of ``module`` whose value a run could change: a container
    whose name is not a CONSTANT table's, or any other object that is not immutable."""
    where = path.relative_to(PACKAGE).as_posix()
    names: set[str] = set()
    for node in ast.parse(path.read_text(), str(path)).body:
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
        if isinstance(node, ast.FunctionDef) and node.decorator_list:
            names.add(node.name)  # a decorated function may be a cache
    functions = {n.name for n in ast.parse(path.read_text()).body
                 if isinstance(n, ast.FunctionDef)}
    found = []
    for name in sorted(names):
        value = getattr(module, name, None)
        if f"{where}:{name}" in ALLOWED_GLOBALS or name.startswith("__"):
            continue
        if isinstance(value, (list, dict, set, bytearray)):
            if not name.lstrip("_").isupper():
                found.append(f"{where}:{name}: a mutable {type(value).__name__}")
        elif hasattr(value, "cache_info") or not (isinstance(value, _SIMPLE) or _frozen(value)
                                                   or name in functions):
            found.append(f"{where}:{name}: {type(value).__name__}")
    return found


def test_module_globals_are_constants() -> None:
    """Every module-level value is a constant: immutable (text, numbers, tuples, frozen
    sets, compiled patterns, frozen dataclasses and models, loggers, stash keys) or a
    CONSTANT-named table nobody writes (``test_no_process_wide_state``); no process-wide
    cache. What a run holds (the one-time code, the early start) lives in ``config.stash``
    or an object the run owns."""
    import importlib

    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found += _module_globals(importlib.import_module(name), path)
    assert not found, "\n".join(found)
    for allowed in ALLOWED_GLOBALS:  # each exception still exists, or it goes from the list
        where, name = allowed.split(":")
        assert name in (PACKAGE / where).read_text(), allowed


# what node/paths.py names: the files and folders of a work root, batch, agent, session, gate,
# run registry, state folder and remote checkout (a name alone is enough for these) ...
FILE_NAMES = {
    "job_spec.json", "nodeids.json", "reports.jsonl", "result.json", "stepid", "srun.pid",
    "batch.pid", "step.sh", "job.sbatch", "job.log", "build.log", "junit.xml", "collection.json",
    "coverage.db", "benchmarks.json", "heartbeat.json", "agent.log", "agent.sh", "agent.lock",
    "agent.starting", "session.log", ".slurm_alloc.json", ".salloc.log", ".runs", ".agents",
    ".cache", ".checkout.lock", ".trtllm-state", "work_dirs", "slurm_env.json", ".gitignore",
    "trtllm-sync.json", ".lock", ".holder", ".pytest_cache",
}
# ... and these only in a path (``f"{d}/inbox"``): alone they are also record fields
PATH_PARTS = {"exit_code", "inbox", "sessions", "gate", "stop", "ready", "open", "runs",
              "outputs"}


def _file_name_literals(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)
                  and isinstance(n.value, ast.Constant)}
    where = path.relative_to(ROOT)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            continue
        if id(node) in docstrings or any(c.isspace() for c in node.value):
            continue  # prose (a message may name a file)
        parts = {p.strip("()[],:;'\"`").rstrip(".") for p in node.value.split("/")}
        named = parts & FILE_NAMES | (parts & PATH_PARTS if "/" in node.value else set())
        if named:
            found.append(f"{where}:{node.lineno}: {sorted(named)} in {node.value!r}")
    return found


def test_one_object_names_every_file() -> None:
    """Every file and folder of a batch, an agent, an allocation and a run, local and
    remote, is named by ``node/paths.py`` alone: a module that spells one of those names
    (``work_dir / "reports.jsonl"``, ``f"{agent}/inbox/{name}.json"``) would drift from what
    the other side (the node, the other machine, another run) reads."""
    names = PACKAGE / "node" / "paths.py"
    text = names.read_text()
    assert all(n.strip(".") in text for n in FILE_NAMES | PATH_PARTS), "name not in paths.py"
    found = [f for path in sorted(PACKAGE.rglob("*.py")) if path != names
             for f in _file_name_literals(path)]
    assert not found, "name these through pytest_trtllm_slurm.node.paths:\n" + "\n".join(found)
