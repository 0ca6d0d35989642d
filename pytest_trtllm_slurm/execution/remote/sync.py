"""Code sync to a remote checkout: tracked changes as a snapshot commit, untracked files as
a tar stream; only what the remote lacks is sent.

The snapshot is built in a private index (``GIT_INDEX_FILE``): the user's branch, index,
working tree, stash and refs are never touched. Dated as HEAD is (the same tree gives the
same commit), it travels as a git bundle over the run's SSH connection (``via="ssh"``) or
as a temp branch on origin (``via="origin"``) and is checked out with ``checkout -B``;
``SYNC_RECORD`` says what was synced. Leftovers on the remote are stashed first;
secret-looking files (``secret_files``) are never shipped unless ``ship_secrets``."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Literal

from pydantic import BaseModel, Field

from pytest_trtllm_slurm.errors import ConfigError, ExecutionError
from pytest_trtllm_slurm.execution.remote.checkout_probe import (
    STASH_EXCLUDE,
    VERIFY,
    RemoteCheckout,
    SyncRecord,
    probe,
)
from pytest_trtllm_slurm.execution.remote.secret_files import looks_secret
from pytest_trtllm_slurm.node.paths import WORK_DIRS, Checkout
from pytest_trtllm_slurm.transport.shell import CommandResult, Shell
from pytest_trtllm_slurm.transport.ssh.auth import can_prompt

Via = Literal["ssh", "origin"]
Say = Callable[[str], None]
LISTED_NAMES = 50  # untracked names printed before shipping; the rest are counted

log = logging.getLogger(__name__)

SNAPSHOT_MESSAGE = "sync: temp snapshot for remote execution (pytest-trtllm-slurm)"

class SyncResult(BaseModel):
    """What was synced where (for the run's note and for logs)."""

    branch: str
    commit: str
    remote_repo: str
    via: Via = "ssh"
    cloned: bool = False
    untracked: list[str] = Field(default_factory=list)  # shipped, relative to the repo top
    withheld: list[str] = Field(default_factory=list)  # looked like secrets: not shipped
    bundle_bytes: int = 0  # via ssh: the bundle's size (0: the remote had the commit)
    sent_bytes: int = 0  # every byte streamed to the remote (bundle and untracked files)
    unchanged: bool = False  # the remote already held this code: no commit was sent
    stashed: bool = False  # leftovers on the remote were stashed first
    removed: list[str] = Field(default_factory=list)  # untracked files gone here, removed there
    seconds: float = 0.0
    warnings: list[str] = Field(default_factory=list)

    @property
    def files_changed(self) -> bool:
        """Whether the sync changed any file of the checkout's work tree (the record is none)."""
        return (self.cloned or not self.unchanged or self.stashed or bool(self.untracked)
                or bool(self.removed))

    def warn(self, message: str) -> None:
        self.warnings.append(message)
        log.warning("code sync: %s", message)


@dataclass
class PreparedSync:
    """The local half of a sync: the snapshot and the untracked files, nothing sent yet."""

    git: _Git
    result: SyncResult
    fetch_url: str
    tree: str
    untracked: dict[str, str] = field(default_factory=dict)  # name -> blob id

    @property
    def key(self) -> str:
        """What this code is, the same on every machine with the same files: the snapshot's
        tree and the untracked files' content (not the commit: authors differ)."""
        digest = hashlib.sha1(self.tree.encode())
        for name, blob in sorted(self.untracked.items()):
            digest.update(f"\0{name}\0{blob}".encode())
        return digest.hexdigest()[:16]

    def describe(self) -> str:
        n = len(self.untracked)
        return f"commit {self.result.commit[:10]}" + (f" + {n} untracked file(s)" if n else "")


def without_credentials(url: str) -> str:
    """``url`` without a password or token (``https://TOKEN@host/...``, ``user:secret@``):
    what may be written on the cluster and in messages. An ssh user name stays."""
    match = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*://)([^/@]*)@(.*)$", url)
    if not match:
        return url
    scheme, userinfo, rest = match.groups()
    if ":" in userinfo or scheme.lower() in ("http://", "https://"):
        return scheme + rest
    return url


def _masked(words: list[str] | tuple[str, ...]) -> str:
    """Words for a message, any URL in them without its credentials."""
    return " ".join(re.sub(r"[A-Za-z][A-Za-z0-9+.-]*://\S+",
                           lambda m: without_credentials(m.group(0)), w) for w in words)


def temp_branch_name(user: str, name: str, now: datetime | None = None) -> str:
    """``<user>_<name>_<YYYYmmddHHMMSS>``, each part made git-ref safe."""
    parts = [re.sub(r"[^A-Za-z0-9_-]", "_", text) or "x" for text in (user, name)]
    return "_".join([*parts, (now or datetime.now()).strftime("%Y%m%d%H%M%S")])


class _Git:
    """Local git, never taking optional locks and never waiting for a credential prompt."""

    def __init__(self, top: Path) -> None:
        self.top = top
        self.env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}
        if not can_prompt():
            self.env["GIT_TERMINAL_PROMPT"] = "0"

    def __call__(self, *args: str, env: dict[str, str] | None = None, timeout: float = 120,
                 check: str | None = None, input: str | None = None,
                 cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        argv = ["git", "-c", "gc.auto=0", "-c", "core.splitIndex=false", *args]
        try:
            proc = subprocess.run(argv, cwd=cwd or self.top, env={**self.env, **(env or {})},
                                  capture_output=True, text=True, timeout=timeout, check=False,
                                  input=input,
                                  stdin=subprocess.DEVNULL if input is None else None)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ExecutionError(f"code sync: `git {_masked(args)}` could not run: {exc}; "
                                 "the local repository was not changed") from None
        if check and proc.returncode != 0:
            detail = (proc.stderr or proc.stdout).strip().splitlines()
            raise ExecutionError(
                f"code sync failed while {check}: `git {_masked(args)}` exit code "
                f"{proc.returncode}: {_masked([detail[-1]]) if detail else ''}; the local "
                "repository was not changed")
        return proc


def sync_workspace(local_repo: Path, shell: Shell, remote_repo: str, *, user: str,
                   name: str, now: datetime | None = None, via: Via = "ssh",
                   ship_secrets: bool = False, say: Say | None = None) -> SyncResult:
    """Make ``remote_repo`` match the local working tree, sending only what it lacks; ``say``
    gets the lines a user should see."""
    # the look at the remote (one round trip) overlaps the local snapshot
    with ThreadPoolExecutor(1, thread_name_prefix="sync-probe") as pool:
        probing = pool.submit(probe, shell, remote_repo)
        prepared = prepare_sync(local_repo, user=user, name=name, now=now, via=via,
                                ship_secrets=ship_secrets)
        probed = probing.result()
    return push_sync(prepared, shell, remote_repo, say=say, probed=probed)


def prepare_sync(local_repo: Path, *, user: str, name: str, now: datetime | None = None,
                 via: Via = "ssh", ship_secrets: bool = False) -> PreparedSync:
    """The local half: the snapshot commit and the untracked files to ship; changes nothing."""
    start = time.monotonic()
    top = git_top(local_repo)
    if top is None:
        raise ConfigError(f"code sync: {local_repo} is not inside a git repository "
                          "(sync = \"git\" needs one; use sync = \"none\" otherwise)")
    git = _Git(top)
    head = git("rev-parse", "--verify", "HEAD^{commit}").stdout.strip()
    if not head:
        raise ConfigError(f"code sync: {git.top} has no commit yet; commit something first")
    # the cluster clones origin without the credentials a URL may carry (never on its disk)
    fetch_url = without_credentials(git("remote", "get-url", "origin").stdout.strip())
    result = SyncResult(branch=temp_branch_name(user, name, now), commit="", remote_repo="",
                        via=via)
    result.commit, tree = _snapshot(git, head, ship_secrets, result)
    prepared = PreparedSync(git, result, fetch_url, tree,
                            _untracked(git, ship_secrets, result))
    result.seconds = round(time.monotonic() - start, 3)
    return prepared


def push_sync(prepared: PreparedSync, shell: Shell, remote_repo: str, *,
              say: Say | None = None, shared: bool = False,
              probed: RemoteCheckout | None = None) -> SyncResult:
    """The remote half: send what ``remote_repo`` lacks of ``prepared``. ``shared``: a live
    run tests the same code there (nothing stashed from under it); ``probed``: a fresh look."""
    start = time.monotonic() - prepared.result.seconds
    git, result = prepared.git, prepared.result
    result.remote_repo = remote_repo
    remote = probed if probed is not None else probe(shell, remote_repo)
    if remote.untrusted:  # the probe checked it before running git there
        raise _untrusted(shell, remote_repo, remote.untrusted)
    if not remote.present:
        _first_checkout(shell, remote_repo, prepared.fetch_url, result)
        verify_checkout(shell, remote_repo)
    before = shipped = remote.record.untracked if remote.present and remote.record else {}
    if remote.present and remote.head == result.commit and (shared or not remote.leftovers()):
        result.unchanged = True
        result.branch = remote.branch if remote.branch != "detached" else result.branch
    else:
        if remote.present and remote.leftovers() and not shared:
            _stash_leftovers(shell, remote_repo, result)
            shipped = {}  # the stash took our untracked files too
        if result.via == "origin":
            _sync_via_origin(git, shell, remote_repo, prepared.fetch_url, result)
        else:
            _sync_via_ssh(git, shell, remote_repo, result,
                          remote.refs if remote.present else None)
    missing = {n for n in shipped if n not in remote.untracked}  # removed on the remote
    send = [n for n, blob in prepared.untracked.items()
            if blob == "-" or shipped.get(n) != blob or n in missing]
    _send_untracked(git, shell, remote_repo, send, result, say or log.info)
    result.removed = sorted(n for n in before if n not in prepared.untracked)
    if result.removed and not result.stashed:  # (a stash took them already)
        shell.run(["rm", "-f", "--", *(f"{remote_repo}/{n}" for n in result.removed)],
                  timeout=120)
    record = SyncRecord(commit=result.commit, branch=result.branch,
                        untracked=prepared.untracked)
    if remote.record != record:
        shell.write_file(Checkout(remote_repo).record, record.model_dump_json())
    if result.withheld and say is not None:
        say(f"code sync: NOT shipped to {shell.name} ({len(result.withheld)} file(s) that look "
            f"like secrets; set sync_secrets = true in the cluster's table to ship them): "
            + _listed(result.withheld))
    result.seconds = round(time.monotonic() - start, 3)
    return result


def _first_checkout(shell: Shell, remote_repo: str, fetch_url: str,
                    result: SyncResult) -> None:
    """No checkout there yet: clone origin (read only) for the history, else an empty
    repository (via ssh); via origin, origin must be cloned."""
    if result.via == "origin" and (not fetch_url or shell.exists(Checkout(remote_repo).git)):
        return  # (no origin: _sync_via_origin says what is missing)
    result.cloned = True
    if fetch_url:
        shell.mkdir(remote_repo.rstrip("/").rsplit("/", 1)[0] or "/")
        res = shell.run([*PRIVATE_UMASK, "git", "clone", "--quiet", "--", fetch_url,
                         remote_repo], timeout=3600, retry_on_drop=False)
        if res.ok:
            return
        if result.via == "origin":
            raise _failed(shell, f"cloning {fetch_url} into {remote_repo} (is origin "
                          "reachable from there?)", res)
        result.warn(f"origin ({fetch_url}) could not be cloned on {shell.name} "
                    f"({res.describe()}); the whole history is sent over SSH instead")
        shell.run(["rm", "-rf", "--", remote_repo], timeout=300)  # a half-made clone
    _remote(shell, [*PRIVATE_UMASK, "git", "init", "--quiet", "--", remote_repo],
            f"creating an empty repository at {remote_repo}")


#: a prefix that runs a command under umask 077 (what it creates: 0700 / 0600)
PRIVATE_UMASK = ("sh", "-c", 'umask 077 && exec "$@"', "sh")

# the checkout's trust check alone (the probe runs it too, before any git command)
_VERIFY_CHECKOUT = "repo=$1\n" + VERIFY + "exit 0\n"


def verify_checkout(shell: Shell, remote_repo: str) -> None:
    """ExecutionError naming the first path of the remote checkout (itself, its ``.git``
    and all in it) that is a link, not ours, or writable by group or others: git runs
    hooks and reads config from there, so whoever can write it runs code as the user."""
    res = shell.run(["sh", "-c", _VERIFY_CHECKOUT, "sh", remote_repo], timeout=300)
    if res.ok:
        return
    bad = res.stdout.strip().splitlines()
    if res.returncode == 13 and bad:
        raise _untrusted(shell, remote_repo, bad[0])
    raise ExecutionError(f"code sync: checking the remote checkout {remote_repo} on "
                         f"{shell.name} failed: {res.describe()}")


def _untrusted(shell: Shell, remote_repo: str, bad: str) -> ExecutionError:
    return ExecutionError(
        f"code sync: the remote checkout's {bad} on {shell.name} is a link, is not "
        "yours, or group or others may write it: whoever can write there runs code as "
        "you at the next checkout (git hooks and config). Check it, then fix it (e.g. "
        f"`chmod -R go-w {remote_repo}`) or remove the checkout, and run again")


def _stash_leftovers(shell: Shell, repo: str, result: SyncResult) -> None:
    """Edits and files on the remote that no sync put there are kept in a stash."""
    stash = shell.run(["git", "-C", repo, "stash", "push", "--include-untracked",
                       "--quiet", "-m", f"auto-stash before remote sync {result.branch}", "--",
                       ".", STASH_EXCLUDE], timeout=300)
    if not stash.ok:
        result.warn(f"remote leftovers could not be stashed: {stash.describe()}")
    else:
        result.stashed = True


def _untracked(git: _Git, ship_secrets: bool, result: SyncResult) -> dict[str, str]:
    """Untracked, not ignored files -> blob id; secret-looking ones withheld unless asked."""
    listing = git("ls-files", "-z", "--others", "--exclude-standard",
                  check="listing untracked files").stdout
    # the plugin's own job folders are results, not code: never shipped back and forth
    names = [n for n in listing.split("\0") if n and WORK_DIRS not in n.split("/")[:-1]]
    if not ship_secrets:
        result.withheld.extend(n for n in names if looks_secret(n))
        names = [n for n in names if not looks_secret(n)]
    files = [n for n in names if "\n" not in n and (git.top / n).is_file()
             and not (git.top / n).is_symlink()]
    blobs = git("hash-object", "--no-filters", "--stdin-paths",
                input="".join(f"{n}\n" for n in files),
                check="hashing untracked files").stdout.split() if files else []
    found = dict(zip(files, blobs, strict=False))
    # links and names hash-object cannot take: always shipped (their id is never equal)
    return {n: found.get(n, "-") for n in names}


def _sync_via_origin(git: _Git, shell: Shell, remote_repo: str, fetch_url: str,
                     result: SyncResult) -> None:
    """The seed's way: a temp branch on origin, fetched by the remote, deleted again."""
    push_url = git("remote", "get-url", "--push", "origin").stdout.strip()
    if not push_url or not fetch_url:
        raise ConfigError(f"code sync: {git.top} has no `origin` remote; sync = \"git-origin\" "
                          "pushes the snapshot there (git remote add origin URL); use "
                          "sync = \"git\" to send it over SSH, or sync = \"none\" for a shared "
                          "file system")
    branch = result.branch
    git("push", "--quiet", "--no-progress", push_url, f"{result.commit}:refs/heads/{branch}",
        timeout=600,
        check=f"pushing the snapshot to origin ({without_credentials(push_url)}) as {branch}")
    try:
        _remote_checkout(shell, remote_repo, result, ["origin", f"refs/heads/{branch}"],
                         f"fetching {branch} from origin")
    finally:
        deleted = git("push", "--quiet", "--no-progress", push_url, "--delete", branch,
                      timeout=300)
        if deleted.returncode != 0:
            result.warn(f"temp branch {branch} could not be deleted on origin: "
                        f"{deleted.stderr.strip()}; delete it by hand")


def _sync_via_ssh(git: _Git, shell: Shell, remote_repo: str, result: SyncResult,
                  refs: list[str] | None = None) -> None:
    """A bundle of the commits the remote lacks, over the run's own connection."""
    haves = _remote_commits(git, shell, remote_repo, refs)
    if result.commit in haves:  # nothing to send: the remote already has the snapshot
        _remote_checkout(shell, remote_repo, result, [result.commit], "checking the snapshot")
        return
    bundle_path = Checkout(remote_repo).bundle(result.branch)
    with tempfile.TemporaryDirectory(prefix="trtllm-bundle-") as tmp:
        bundle = _make_bundle(git, Path(tmp), result, haves)
        result.bundle_bytes = bundle.stat().st_size
        result.sent_bytes += result.bundle_bytes

        def produce(stream: IO[bytes]) -> None:
            with bundle.open("rb") as src:
                shutil.copyfileobj(src, stream, 1 << 20)

        res, _ = _stream(shell, ["sh", "-c", 'umask 077 && cat > "$1"', "sh", bundle_path],
                         produce)  # 0600
        if not res.ok:
            raise _failed(shell, f"sending the bundle to {bundle_path}", res)
    try:
        _remote_checkout(shell, remote_repo, result,
                         [bundle_path, f"refs/heads/{result.branch}"],
                         "fetching the snapshot from the bundle sent over SSH", bundle_path)
    except BaseException:  # (the checkout's own clean-up may not have run)
        shell.run(["rm", "-f", "--", bundle_path], timeout=60)
        raise


def _remote_commits(git: _Git, shell: Shell, repo: str,
                    refs: list[str] | None = None) -> set[str]:
    """Commits at the remote's refs that exist here too: the bundle's prerequisites."""
    if refs is None:
        refs = _remote(shell, ["git", "-C", repo, "for-each-ref",
                               "--format=%(objectname) %(*objectname)"],
                       "listing its refs").stdout.split()
    ids = sorted({w for w in refs if re.fullmatch(r"[0-9a-f]{40,64}", w)})
    if not ids:
        return set()
    check = git("cat-file", "--batch-check=%(objectname) %(objecttype)",
                input="\n".join(ids) + "\n")
    return {line.split()[0] for line in check.stdout.splitlines()
            if line.endswith(" commit")}


def _make_bundle(git: _Git, tmp: Path, result: SyncResult, haves: set[str]) -> Path:
    """``git bundle`` of the snapshot minus what the remote has. A bundle needs a ref; it is
    made in a throw-away repository that borrows this one's objects (alternates), so no
    ref of the user's repository is created."""
    objects = git("rev-parse", "--git-path", "objects").stdout.strip()
    shallow = git("rev-parse", "--git-path", "shallow").stdout.strip()
    scratch = tmp / "scratch.git"
    git("init", "--quiet", "--bare", str(scratch), check="creating a scratch repository")
    (scratch / "objects" / "info" / "alternates").write_text(
        str((git.top / objects).resolve()) + "\n")
    if shallow and (git.top / shallow).is_file():
        shutil.copyfile(git.top / shallow, scratch / "shallow")
    env = {"GIT_DIR": str(scratch)}
    ref = f"refs/heads/{result.branch}"
    git("update-ref", ref, result.commit, env=env, cwd=tmp, check="naming the snapshot")
    bundle = tmp / "snapshot.bundle"
    revs = "\n".join([ref, *(f"^{h}" for h in sorted(haves))]) + "\n"
    git("bundle", "create", str(bundle), "--stdin", env=env, cwd=tmp,
        input=revs, timeout=1800, check="writing the bundle")
    return bundle


def git_top(path: Path) -> Path | None:
    """The top of the git work tree holding ``path``; None when it is in none."""
    proc = subprocess.run(["git", "-C", str(path), "rev-parse", "--show-toplevel"],
                          capture_output=True, text=True, timeout=30, check=False,
                          stdin=subprocess.DEVNULL)
    return Path(proc.stdout.strip()) if proc.returncode == 0 else None


def _snapshot(git: _Git, head: str, ship_secrets: bool, result: SyncResult) -> tuple[str, str]:
    """A commit of HEAD + all tracked changes, built in a private index, and its tree; secret-
    looking changes stay out unless asked. Dated as HEAD: the same changes, the same commit."""
    rel_index = git("rev-parse", "--git-path", "index").stdout.strip()
    real_index = str(git.top / rel_index) if rel_index else ""
    with tempfile.TemporaryDirectory(prefix="trtllm-sync-") as tmp:
        index = os.path.join(tmp, "index")
        env = {"GIT_INDEX_FILE": index}
        if real_index and os.path.isfile(real_index):
            # copy2 keeps the index's mtime for git's racy-entry check (else a same-size
            # change in the second the index was written would ship the old content)
            shutil.copy2(real_index, index)
        else:
            git("read-tree", head, env=env, check="reading HEAD into a private index")
        git("add", "-u", env=env, timeout=600, check="staging tracked changes (private index)")
        if not ship_secrets:
            changed = git("diff-index", "--cached", "--name-only", "-z", head, env=env,
                          check="listing tracked changes").stdout.split("\0")
            secret = [n for n in changed if n and looks_secret(n)]
            if secret:
                _keep_head_version(git, head, secret, env)
                result.withheld.extend(secret)
        tree = git("write-tree", env=env, check="writing the snapshot tree").stdout.strip()
    when = git("show", "-s", "--format=%ct %cz", head).stdout.split()
    ident = {f"GIT_{who}_DATE": f"@{when[0]} {when[1]}" for who in ("AUTHOR", "COMMITTER")
             } if len(when) == 2 else {}
    if git("var", "GIT_COMMITTER_IDENT").returncode != 0:  # no user.name/email configured
        ident.update({f"GIT_{who}_{what}": value for who in ("AUTHOR", "COMMITTER")
                      for what, value in (("NAME", "pytest-trtllm-slurm"),
                                          ("EMAIL", "pytest-trtllm-slurm@invalid"))})
    commit = git("commit-tree", tree, "-p", head, "-m", SNAPSHOT_MESSAGE, env=ident,
                 check="creating the snapshot commit").stdout.strip()
    return commit, tree


def _keep_head_version(git: _Git, head: str, paths: list[str], env: dict[str, str]) -> None:
    """In the private index ``env`` names, put ``paths`` back as HEAD has them (dropped when
    HEAD lacks them). update-index --index-info: in every git, no pathspec magic."""
    listed = git("--literal-pathspecs", "ls-tree", "-r", "-z", "--full-tree", head, "--",
                 *paths, check="reading HEAD's version of secret-looking files").stdout
    present = {record.split("\t", 1)[1] for record in listed.split("\0") if "\t" in record}
    removed = "".join(f"0 {'0' * len(head)}\t{p}\0" for p in paths if p not in present)
    git("update-index", "-z", "--index-info", env=env, input=listed + removed,
        check="keeping changes to secret-looking files out of the snapshot")


def _remote(shell: Shell, argv: list[str], what: str) -> CommandResult:
    res = shell.run(argv, timeout=300)
    if not res.ok:
        raise _failed(shell, what, res)
    return res


def _failed(shell: Shell, what: str, res: CommandResult) -> ExecutionError:
    return ExecutionError(f"code sync to {shell.name} failed while {what}: {res.describe()}; "
                          "the local repository was not changed")


# one round trip (see ``_remote_checkout``)
_CHECKOUT = r"""
repo=$1 branch=$2 expect=$3 prefix=$4 bundle=$5; shift 5
[ -n "$bundle" ] && trap 'rm -f -- "$bundle"' EXIT
cd "$repo" || exit 9
if [ $# -gt 1 ]; then git fetch --quiet "$@" || exit 10; start=FETCH_HEAD; else start=$1; fi
git checkout --quiet -f -B "$branch" "$start" || exit 11
got=$(git rev-parse HEAD)
[ "$got" = "$expect" ] || { echo "$got"; exit 12; }
# (the prefix is made of [A-Za-z0-9_-] only: literal in a regular expression)
git for-each-ref --format='%(refname:short)' refs/heads/ | grep -xE -e "${prefix}_[0-9]{14}" |
  grep -vxF -e "$branch" | xargs -r git branch -D --quiet >/dev/null 2>&1
exit 0
"""


def _remote_checkout(shell: Shell, repo: str, result: SyncResult, fetch: list[str],
                     what: str, bundle: str = "") -> None:
    """Fetch ``fetch`` (a remote or bundle and its ref, or a commit the remote has), check
    it out as the temp branch, prune older temp branches (leftovers were stashed first):
    one round trip. ``bundle``: removed there afterwards, whatever happened."""
    branch = result.branch
    prefix = branch.rsplit("_", 1)[0]
    res = shell.run(["sh", "-c", _CHECKOUT, "sh", repo, branch, result.commit, prefix,
                     bundle, *fetch], timeout=1800)
    if res.ok:
        return
    step = {9: f"entering {repo}", 10: f"{what} in {repo}",
            11: f"checking out {branch} in {repo}"}.get(res.returncode)
    if res.returncode == 12:
        raise ExecutionError(f"code sync to {shell.name}: {repo} is at {res.stdout.strip()} "
                             f"after checkout, expected {result.commit}")
    raise _failed(shell, step or what, res)


def _send_untracked(git: _Git, shell: Shell, remote_repo: str, names: list[str],
                    result: SyncResult, say: Say) -> None:
    """Untracked files the remote lacks (or holds otherwise) as one tar stream, said first."""
    result.untracked = names
    if not names:
        return
    say(f"code sync: shipping {len(names)} untracked file(s) to {shell.name}:{remote_repo}: "
        + _listed(names))
    top = git.top

    def produce(stream: IO[bytes]) -> None:
        with tarfile.open(fileobj=stream, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for name in names:
                try:
                    tar.add(top / name, arcname=name, recursive=False, filter=_anonymous)
                except FileNotFoundError:
                    log.debug("code sync: %s vanished before it was sent", name)

    argv = ["tar", "-x", "--no-same-owner", "-f", "-", "-C", remote_repo]
    res, sent = _stream(shell, argv, produce)
    result.sent_bytes += sent
    if not res.ok:
        raise ExecutionError(f"code sync to {shell.name} failed while unpacking untracked "
                             f"files: {res.describe()}")


def _listed(names: list[str]) -> str:
    more = len(names) - LISTED_NAMES
    return ", ".join(names[:LISTED_NAMES]) + (f" and {more} more" if more > 0 else "")


def _anonymous(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


class _Counted:
    """A binary stream that counts what is written through it (what a sync sent)."""

    inner: IO[bytes]
    count = 0

    def write(self, data: bytes) -> int:
        self.count += len(data)
        self.inner.write(data)
        return len(data)

    def flush(self) -> None:
        self.inner.flush()


def _stream(shell: Shell, argv: list[str],
            produce: Callable[[IO[bytes]], None]) -> tuple[CommandResult, int]:
    """Run argv, produce() writing its stdin (over the channel on SSH); the result, bytes sent."""
    counted = _Counted()

    def counting(stream: IO[bytes]) -> None:
        counted.inner = stream
        produce(counted)  # type: ignore[arg-type]

    runner = getattr(shell, "run_stdin_stream", None)
    if runner is not None:
        res: CommandResult = runner(argv, counting, timeout=1800)
        return res, counted.count
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)  # LocalShell: the same machine
    assert proc.stdin is not None
    try:
        counting(proc.stdin)
    finally:
        proc.stdin.close()
    out, err = proc.communicate(timeout=1800)
    return (CommandResult(tuple(argv), proc.returncode, out.decode(errors="replace"),
                          err.decode(errors="replace")), counted.count)
