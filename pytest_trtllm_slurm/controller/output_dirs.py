"""A suite's own output paths: one place per batch on the target, brought back after it
(as written, every batch would write the user's path); docs/output-files-and-timeouts.md."""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_trtllm_slurm.errors import ExecutionError
from pytest_trtllm_slurm.node.files import PRIVATE, publish, temp_name
from pytest_trtllm_slurm.node.paths import Batch
from pytest_trtllm_slurm.node.protocol import WORKER_OUTPUTS_FLAG
from pytest_trtllm_slurm.transport.shell import Shell

DEFAULT_OUTPUT_OPTIONS = ("--output-dir", "--periodic-junit-xmlpath", "--csv")
INI = "trtllm_output_options"
MAX_FILES = 10_000
MAX_BYTES = 4 << 30
READ_CHUNK = 1 << 20
_SAFE_LABEL = re.compile(r"[^A-Za-z0-9._-]+")


def add_ini(parser: Any) -> None:
    parser.addini(INI, "more options that name where the suite writes its own output (one "
                  f"flag per line, beside {', '.join(DEFAULT_OUTPUT_OPTIONS)}): each batch "
                  "writes a place of its own, brought back here after it",
                  type="linelist", default=[])


def output_flags(config: Any) -> set[str]:
    """The flags whose value is where the suite writes (defaults and the ini list)."""
    try:
        extra = config.getini(INI) or []
    except (ValueError, AttributeError):
        extra = []
    return set(DEFAULT_OUTPUT_OPTIONS) | {flag.strip() for flag in extra if flag.strip()}


@dataclass(frozen=True)
class OutputOption:
    """One output option as the user gave it: ``flag`` and the absolute path ``local``."""

    flag: str
    local: str
    directory: bool  # a folder of files (else one file, written by the controller's hooks)

    @staticmethod
    def of(flag: str, local: str) -> OutputOption:
        directory = "dir" in flag.lower() or os.path.isdir(local)
        return OutputOption(flag, os.path.normpath(local), directory)


def mirror(work_dir: str, local: str) -> str:
    """Where the batch in ``work_dir`` writes what the user named ``local``."""
    return Batch(work_dir).outputs + local


def worker_tokens(outputs: Iterable[OutputOption], work_dir: str) -> list[str]:
    """The batch's own values of the output options, and the folders the worker makes
    before the suite starts (the output folder, a file's folder: as they exist here)."""
    tokens: list[str] = []
    folders: set[str] = set()
    for out in outputs:
        path = mirror(work_dir, out.local)
        tokens.append(f"{out.flag}={path}")
        folders.add(path if out.directory else os.path.dirname(path))
    return tokens + [f"{WORKER_OUTPUTS_FLAG}={folder}" for folder in sorted(folders)]


@dataclass
class OutputCollector:
    """Brings each ended batch's output files to the paths the user gave."""

    outputs: list[OutputOption]
    say: Callable[[str], None]
    started: float = field(default_factory=time.time)
    written: dict[str, str] = field(default_factory=dict)  # local path -> batch label

    def owned_here(self, local: str) -> bool:
        """A file one of the controller's own writers produces (a file-valued option)."""
        return any(not o.directory and o.local == local for o in self.outputs)

    def wanted(self, local: str) -> bool:
        """Only what lies below an output folder the user named comes back."""
        return any(o.directory and (local == o.local or local.startswith(o.local.rstrip("/")
                                                                          + "/"))
                   for o in self.outputs)

    def collect(self, shell: Shell, work_dir: str, label: str) -> None:
        """Copy what the batch in ``work_dir`` wrote; what cannot be read is said, no more."""
        if not self.outputs:
            return
        root = Batch(work_dir).outputs
        try:
            files = self._list(shell, root)
            total = 0
            for size, rel in files:
                local = os.path.normpath("/" + rel)
                if local != "/" + rel or not self.wanted(local) or self.owned_here(local):
                    continue  # not below a folder the user named, or the controller's file
                total += size
                if total > MAX_BYTES:
                    self.say(f"the output files of batch {label} exceed {MAX_BYTES >> 30} GiB;"
                             f" the rest stay in {root}")
                    return
                self._bring(shell, f"{root}/{rel}", size, local, label)
        except (OSError, ExecutionError) as exc:
            self.say(f"the output files of batch {label} in {root} could not be brought "
                     f"back: {exc}")

    def _list(self, shell: Shell, root: str) -> list[tuple[int, str]]:
        """(size, path relative to ``root``) of every regular file below it."""
        if not shell.exists(root):
            return []
        res = shell.run(["find", root, "-type", "f", "-printf", "%s %P\\0"], timeout=300)
        if not res.ok:
            raise ExecutionError(res.describe())
        entries = []
        for entry in res.stdout.split("\0"):
            size, _, rel = entry.partition(" ")
            if rel and size.isdigit():
                entries.append((int(size), rel))
        if len(entries) > MAX_FILES:
            self.say(f"{root} holds {len(entries)} files; the first {MAX_FILES} come back")
        return sorted(entries, key=lambda e: e[1])[:MAX_FILES]

    def _bring(self, shell: Shell, source: str, size: int, local: str, label: str) -> None:
        dest = local
        earlier = self.written.get(local)
        with contextlib.suppress(OSError):
            if earlier is None and os.lstat(local).st_mtime >= self.started:
                earlier = "a test run here"
        if earlier is not None:
            dest = f"{local}.{_SAFE_LABEL.sub('_', label)}"
            note = (f"output file conflict: {local} was written by {earlier} and by batch "
                    f"{label}; the first is kept, batch {label}'s copy is {dest}")
            self.say(note)
        _copy_in(shell, source, size, Path(dest))
        self.written.setdefault(local, f"batch {label}")


def _copy_in(shell: Shell, source: str, size: int, dest: Path) -> None:
    """``size`` bytes of the target's ``source`` into ``dest`` here, in chunks, published
    atomically (a link planted at ``dest`` is replaced, never followed)."""
    folder = dest.parent
    if not folder.is_dir():
        os.makedirs(folder, mode=0o700, exist_ok=True)
    tmp = temp_name(dest)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 PRIVATE)
    try:
        with os.fdopen(fd, "wb") as out:
            offset = 0
            while offset < size:
                chunk = shell.read_from(source, offset, min(READ_CHUNK, size - offset))
                if not chunk:
                    break
                out.write(chunk)
                offset += len(chunk)
    except BaseException:
        os.unlink(tmp)
        raise
    publish(tmp, dest)
