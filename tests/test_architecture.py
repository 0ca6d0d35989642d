"""The layers of DESIGN.md hold in the code: import-linter's contracts (pyproject.toml) are
kept, the execution layer imports without pytest, and the folder tree README shows is the
package's."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

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
