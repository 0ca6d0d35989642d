"""The plugin's work root (``<rootdir>/work_dirs`` by default), created git-ignored.

Why: a run writes logs, job specs and state there, inside the user's repository. Like
pytest's ``.pytest_cache``, the folder ignores itself when the plugin creates it, so
``git status`` stays clean and a code sync's list of untracked files never picks up old logs.
A folder that already exists is left as the user has it.
"""

from __future__ import annotations

from pathlib import Path

from pytest_trtllm_slurm.node.files import SHARED, write_atomic

GITIGNORE_TEXT = "# Created by pytest-trtllm-slurm automatically.\n*\n"


def ensure_work_root(path: Path) -> Path:
    """Create ``path`` (and parents) if missing; a folder this call creates gets a
    ``.gitignore`` of ``*``. Returns ``path``."""
    path = Path(path)
    if path.is_dir():
        return path
    try:
        path.mkdir(parents=True)
    except FileExistsError:  # another run created it first: it writes the .gitignore
        return path
    write_atomic(path / ".gitignore", GITIGNORE_TEXT, mode=SHARED)  # git's to read, as always
    return path
