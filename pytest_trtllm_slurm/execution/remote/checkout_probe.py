"""What a remote checkout holds, read in one round trip (the code sync's first look): whether
it exists, its HEAD, branch and refs, the last sync's record (``SYNC_RECORD``) and ``git
status``; with the record, a sync with no change sends nothing."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from pydantic import BaseModel, Field, ValidationError

from pytest_trtllm_slurm.errors import ExecutionError
from pytest_trtllm_slurm.node.paths import SYNC_RECORD, WORK_DIRS
from pytest_trtllm_slurm.transport.shell import Shell

STASH_EXCLUDE = f":(exclude,glob)**/{WORK_DIRS}/**"  # the plugin's job folders: never code

# the checkout and everything in its .git (hooks, config: they run code at each git
# command) must be ours, not links, and writable by nobody else; prints the first that is
# not and exits 13 (``verify``: alone after a first clone; in the probe before any git runs)
VERIFY = r"""
uid=$(id -u)
for p in "$repo" "$repo/.git"; do
  if [ -L "$p" ]; then printf '%s\n' "$p"; exit 13; fi
done
bad=$(find "$repo" -maxdepth 0 \( ! -user "$uid" -o -perm -020 -o -perm -002 \) -print)
[ -z "$bad" ] && bad=$(find "$repo/.git" \( -type l -o ! -user "$uid" -o -perm -020 \
  -o -perm -002 \) -print | head -n 1)
if [ -n "$bad" ]; then printf '%s\n' "$bad"; exit 13; fi
"""

# one round trip: presence, trust (``VERIFY``, before any git), HEAD, branch, refs, record, status
_PROBE = r"""
repo=$1
[ -d "$repo/.git" ] || { echo missing; exit 0; }
checked=$( (""" + VERIFY + r""") ) || { echo untrusted; printf '%s\n' "$checked"; exit 0; }
cd "$repo" || exit 1
echo present
git rev-parse -q --verify HEAD || echo none
git symbolic-ref -q --short HEAD || echo detached
git for-each-ref --format='%(objectname) %(*objectname)' | tr '\n' ' '; echo
tr -d '\n' <"$3" 2>/dev/null; echo
GIT_OPTIONAL_LOCKS=0 git status --porcelain -z --untracked-files=all -- . "$2"
"""


class SyncRecord(BaseModel):
    """What the last sync left in the remote checkout (``SYNC_RECORD``)."""

    commit: str
    branch: str
    untracked: dict[str, str] = Field(default_factory=dict)  # name -> blob id



@dataclass
class RemoteCheckout:
    """What ``_PROBE`` found in the remote checkout."""

    present: bool
    untrusted: str = ""  # the first path that makes the checkout unsafe ("" : none)
    head: str = ""
    branch: str = ""
    refs: list[str] = field(default_factory=list)
    record: SyncRecord | None = None
    changed: list[str] = field(default_factory=list)  # tracked files that differ from HEAD
    untracked: set[str] = field(default_factory=set)

    def leftovers(self) -> list[str]:
        """What the remote holds that no sync put there (to be stashed)."""
        shipped = self.record.untracked if self.record else {}
        return self.changed + sorted(n for n in self.untracked if n not in shipped)


def probe(shell: Shell, repo: str) -> RemoteCheckout:
    """What the remote checkout holds (one round trip)."""
    res = shell.run(probe_argv(repo), timeout=300)
    if not res.ok:
        raise ExecutionError(f"code sync to {shell.name} failed while looking at {repo}: "
                             f"{res.describe()}; the local repository was not changed")
    return parse_probe(res.stdout)


def probe_argv(repo: str) -> list[str]:
    """The probe's command (to run alone, or with another look in the same round trip)."""
    return ["sh", "-c", _PROBE, "sh", repo, STASH_EXCLUDE, SYNC_RECORD]


def parse_probe(stdout: str) -> RemoteCheckout:
    """The probe's output read."""
    lines = stdout.split("\n", 5)
    if lines[0] == "untrusted":
        return RemoteCheckout(present=True, untrusted=(lines[1:2] or ["?"])[0] or "?")
    if not lines or lines[0] != "present" or len(lines) < 6:
        return RemoteCheckout(present=False)
    try:
        record = SyncRecord.model_validate(json.loads(lines[4])) if lines[4] else None
    except (ValueError, ValidationError):
        record = None
    found = RemoteCheckout(present=True, head=lines[1].strip(), branch=lines[2].strip(),
                           refs=lines[3].split(), record=record)
    entries = iter(lines[5].split("\0"))
    for entry in entries:
        if len(entry) < 4:
            continue
        code, path = entry[:2], entry[3:]
        if code == "??":
            found.untracked.add(path)
        else:
            found.changed.append(path)
            if code[0] in "RC":
                next(entries, None)  # the rename's source
    return found
