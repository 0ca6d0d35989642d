"""The layers of DESIGN.md hold in the code: import-linter's contracts (pyproject.toml) are
kept, the execution layer imports without pytest, and the folder tree README shows is the
package's."""
from __future__ import annotations

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
