"""Code sync to a remote checkout (seed Step 4): a temp branch for tracked changes, a tar
stream for untracked files.

The snapshot commit is built with a private index file (``GIT_INDEX_FILE`` + ``add -u`` +
``write-tree`` + ``commit-tree``) and pushed to origin's URL by commit id, so the user's
branch, index, working tree, stash and refs (remote-tracking ones included) are never
touched -- even when a step fails halfway. The remote checkout uses ``checkout -B
<temp branch>`` so ``git status`` there names the snapshot; older temp branches of the
same ``<user>_<name>_`` prefix are pruned from the remote clone.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import IO

from pydantic import BaseModel, Field

from ..errors import ConfigError, ExecutionError
from .shell import CommandResult, Shell
from .ssh_auth import can_prompt

log = logging.getLogger(__name__)

SNAPSHOT_MESSAGE = "sync: temp snapshot for remote execution (pytest-trtllm-slurm)"
_STASH_EXCLUDE = ":(exclude,glob)**/work_dirs/**"


class SyncResult(BaseModel):
    """What was synced where (for the run's note and for logs)."""

    branch: str
    commit: str
    remote_repo: str
    cloned: bool = False
    untracked_files: int = 0
    seconds: float = 0.0
    warnings: list[str] = Field(default_factory=list)


def temp_branch_name(user: str, name: str, now: datetime | None = None) -> str:
    """``<user>_<name>_<YYYYmmddHHMMSS>``, each part made git-ref safe."""
    stamp = (now or datetime.now()).strftime("%Y%m%d%H%M%S")
    return f"{_safe(user)}_{_safe(name)}_{stamp}"


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", text) or "x"


class _Git:
    """Local git, never taking optional locks and never waiting for a credential prompt."""

    def __init__(self, top: Path) -> None:
        self.top = top
        self.env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}
        if not can_prompt():
            self.env["GIT_TERMINAL_PROMPT"] = "0"

    def __call__(self, *args: str, env: dict[str, str] | None = None, timeout: float = 120,
                 check: str | None = None) -> subprocess.CompletedProcess[str]:
        argv = ["git", "-c", "gc.auto=0", "-c", "core.splitIndex=false", *args]
        try:
            proc = subprocess.run(argv, cwd=self.top, env={**self.env, **(env or {})},
                                  capture_output=True, text=True, timeout=timeout, check=False,
                                  stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ExecutionError(f"code sync: `git {' '.join(args)}` could not run: {exc}; "
                                 "the local repository was not changed") from None
        if check and proc.returncode != 0:
            detail = (proc.stderr or proc.stdout).strip().splitlines()
            raise ExecutionError(
                f"code sync failed while {check}: `git {' '.join(args)}` exit code "
                f"{proc.returncode}: {detail[-1] if detail else ''}; the local repository was "
                "not changed"
            )
        return proc


def sync_workspace(local_repo: Path, shell: Shell, remote_repo: str, *, user: str,
                   name: str, now: datetime | None = None) -> SyncResult:
    """Make ``remote_repo`` (on ``shell``) match the local working tree: tracked changes via
    a temp branch through origin, untracked (not ignored) files via a tar stream."""
    start = time.monotonic()
    git = _Git(_toplevel(local_repo))
    head = git("rev-parse", "--verify", "HEAD^{commit}").stdout.strip()
    if not head:
        raise ConfigError(f"code sync: {git.top} has no commit yet; commit something first")
    push_url = git("remote", "get-url", "--push", "origin").stdout.strip()
    fetch_url = git("remote", "get-url", "origin").stdout.strip()
    if not push_url or not fetch_url:
        raise ConfigError(f"code sync: {git.top} has no `origin` remote; the remote side fetches "
                          "the snapshot from origin (git remote add origin URL), or set "
                          "sync = \"none\" for a shared file system")
    branch = temp_branch_name(user, name, now)
    result = SyncResult(branch=branch, commit="", remote_repo=remote_repo)
    result.cloned = _ensure_clone(shell, remote_repo, fetch_url)
    result.commit = _snapshot(git, head)
    git("push", "--quiet", "--no-progress", push_url, f"{result.commit}:refs/heads/{branch}",
        timeout=600, check=f"pushing the snapshot to origin ({push_url}) as {branch}")
    try:
        _remote_checkout(shell, remote_repo, branch, result)
    finally:
        deleted = git("push", "--quiet", "--no-progress", push_url, "--delete", branch,
                      timeout=300)
        if deleted.returncode != 0:
            msg = (f"temp branch {branch} could not be deleted on origin: "
                   f"{deleted.stderr.strip()}; delete it by hand")
            result.warnings.append(msg)
            log.warning("code sync: %s", msg)
    result.untracked_files = _send_untracked(git, shell, remote_repo)
    result.seconds = round(time.monotonic() - start, 3)
    return result


def _toplevel(path: Path) -> Path:
    proc = subprocess.run(["git", "-C", str(path), "rev-parse", "--show-toplevel"],
                          capture_output=True, text=True, timeout=30, check=False,
                          stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise ConfigError(f"code sync: {path} is not inside a git repository "
                          "(sync = \"git\" needs one; use sync = \"none\" otherwise)")
    return Path(proc.stdout.strip())


def _snapshot(git: _Git, head: str) -> str:
    """A commit of HEAD + all tracked changes (staged or not), built in a private index."""
    rel_index = git("rev-parse", "--git-path", "index").stdout.strip()
    real_index = str(git.top / rel_index) if rel_index else ""
    with tempfile.TemporaryDirectory(prefix="trtllm-sync-") as tmp:
        index = os.path.join(tmp, "index")
        env = {"GIT_INDEX_FILE": index}
        if real_index and os.path.isfile(real_index):
            shutil.copyfile(real_index, index)
        else:
            git("read-tree", head, env=env, check="reading HEAD into a private index")
        git("add", "-u", env=env, timeout=600, check="staging tracked changes (private index)")
        tree = git("write-tree", env=env, check="writing the snapshot tree").stdout.strip()
    ident = {}
    if git("var", "GIT_COMMITTER_IDENT").returncode != 0:  # no user.name/email configured
        ident = {f"GIT_{who}_{what}": value for who in ("AUTHOR", "COMMITTER")
                 for what, value in (("NAME", "pytest-trtllm-slurm"),
                                     ("EMAIL", "pytest-trtllm-slurm@invalid"))}
    return git("commit-tree", tree, "-p", head, "-m", SNAPSHOT_MESSAGE, env=ident,
               check="creating the snapshot commit").stdout.strip()


def _remote(shell: Shell, argv: list[str], what: str, *, timeout: float = 300,
            retry: bool = True) -> CommandResult:
    res = shell.run(argv, timeout=timeout, retry_on_drop=retry)
    if not res.ok:
        raise ExecutionError(f"code sync to {shell.name} failed while {what}: {res.describe()}; "
                             "the local repository was not changed")
    return res


def _ensure_clone(shell: Shell, remote_repo: str, url: str) -> bool:
    if shell.exists(f"{remote_repo}/.git"):
        return False
    parent = remote_repo.rstrip("/").rsplit("/", 1)[0] or "/"
    shell.mkdir(parent)
    _remote(shell, ["git", "clone", "--quiet", "--", url, remote_repo],
            f"cloning {url} into {remote_repo} (is origin reachable from there?)",
            timeout=3600, retry=False)
    return True


def _remote_checkout(shell: Shell, repo: str, branch: str, result: SyncResult) -> None:
    stash = shell.run(["git", "-C", repo, "stash", "push", "--include-untracked", "--quiet",
                       "-m", f"auto-stash before remote sync {branch}", "--", ".",
                       _STASH_EXCLUDE], timeout=300)
    if not stash.ok:
        result.warnings.append(f"remote leftovers could not be stashed: {stash.describe()}")
        log.warning("code sync: %s", result.warnings[-1])
    _remote(shell, ["git", "-C", repo, "fetch", "--quiet", "origin", f"refs/heads/{branch}"],
            f"fetching {branch} from origin in {repo}", timeout=1800)
    _remote(shell, ["git", "-C", repo, "checkout", "--quiet", "-f", "-B", branch, "FETCH_HEAD"],
            f"checking out {branch} in {repo}")
    got = _remote(shell, ["git", "-C", repo, "rev-parse", "HEAD"], "reading HEAD").stdout.strip()
    if got != result.commit:
        raise ExecutionError(f"code sync to {shell.name}: {repo} is at {got} after checkout, "
                             f"expected {result.commit}")
    prefix = branch.rsplit("_", 1)[0]
    refs = shell.run(["git", "-C", repo, "for-each-ref", "--format=%(refname:short)",
                      "refs/heads/"], timeout=60).stdout.split()
    old = [r for r in refs if r != branch and re.fullmatch(re.escape(prefix) + r"_\d{14}", r)]
    if old:
        shell.run(["git", "-C", repo, "branch", "-D", "--quiet", *old], timeout=60)


def _send_untracked(git: _Git, shell: Shell, remote_repo: str) -> int:
    """Untracked, not ignored files as one tar stream into ``tar -x`` on the remote side."""
    listing = git("ls-files", "-z", "--others", "--exclude-standard",
                  check="listing untracked files").stdout
    # the plugin's own job folders are results, not code: never shipped back and forth
    names = [n for n in listing.split("\0") if n and "work_dirs" not in n.split("/")[:-1]]
    if not names:
        return 0
    top = git.top

    def produce(stream: IO[bytes]) -> None:
        with tarfile.open(fileobj=stream, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for name in names:
                try:
                    tar.add(top / name, arcname=name, recursive=False, filter=_anonymous)
                except FileNotFoundError:
                    log.debug("code sync: %s vanished before it was sent", name)

    argv = ["tar", "-x", "--no-same-owner", "-f", "-", "-C", remote_repo]
    res = _stream(shell, argv, produce)
    if not res.ok:
        raise ExecutionError(f"code sync to {shell.name} failed while unpacking untracked "
                             f"files: {res.describe()}")
    return len(names)


def _anonymous(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _stream(shell: Shell, argv: list[str], produce: Callable[[IO[bytes]], None]) -> CommandResult:
    """Run argv with produce() writing its stdin: SSH shells stream over the channel."""
    runner = getattr(shell, "run_stdin_stream", None)
    if runner is not None:
        return runner(argv, produce, timeout=1800)
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)  # LocalShell: the same machine
    assert proc.stdin is not None
    try:
        produce(proc.stdin)
    finally:
        proc.stdin.close()
    out, err = proc.communicate(timeout=1800)
    return CommandResult(tuple(argv), proc.returncode, out.decode(errors="replace"),
                         err.decode(errors="replace"))
