"""The warm workers' mailbox runs only what this user wrote (issue 16 item 2).

A second local user (created here with useradd; real, not a fake) tries what a member
of the user's group could do under umask 002: drop a request into the agent's inbox,
or create the node-local GPU lock folder first. The agent is started by hand, as its
Slurm step starts it (no Slurm needed: it is the agent's own checks under test).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_trtllm_slurm.execution.slurm.warm_pool import send_session
from pytest_trtllm_slurm.node.files import UntrustedPath, private_lock_dir
from pytest_trtllm_slurm.transport.shell import LocalShell

REPO = Path(__file__).resolve().parent.parent
NEIGHBOUR = "trtllm-neighbour"

EVIL_TEST = '''import os
from pathlib import Path

def test_evil():
    Path(os.environ.get("PWNED_AT", "{pwned}")).write_text(str(os.getuid()))
'''


@pytest.fixture(scope="module")
def neighbour() -> str:
    """Another local user (same machine, not in our group)."""
    if os.geteuid() != 0:
        pytest.fail("this test creates a second local user: run the suite as root "
                    "(as the dev cluster's tests do)")
    try:
        pwd.getpwnam(NEIGHBOUR)
    except KeyError:
        subprocess.run(["useradd", "-M", "-s", "/usr/sbin/nologin", NEIGHBOUR],
                       capture_output=True, check=False)
        pwd.getpwnam(NEIGHBOUR)  # KeyError here: useradd failed
    return NEIGHBOUR


def as_user(user: str, script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", user, "--", "sh", "-c", script, "sh", *args],
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A folder other users can reach (pytest's tmp_path is root's 0700)."""
    path = Path(tempfile.mkdtemp(prefix="trtllm-mailbox-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def modes(top: Path) -> dict[str, str]:
    return {str(p.relative_to(top)): f"{stat.S_IMODE(p.stat().st_mode):04o}"
            for p in [top, *sorted(top.rglob("*"))]}


def wait_for(pred, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


class HandAgent:
    """``python -m pytest_trtllm_slurm.node.agent`` as its Slurm step runs it."""

    def __init__(self, mail: Path, log: Path, lock_root: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TRTLLM_"))}
        env.update(SLURM_JOB_ID="t1", TRTLLM_SLURM_LOCK_ROOT=str(lock_root),
                   PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])))
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pytest_trtllm_slurm.node.agent", "--dir", str(mail),
             "--node", "n1", "--idle-exit", "60"],
            env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)
        wait_for(lambda: (mail / "heartbeat.json").exists() or self.proc.poll() is not None,
                 "the agent to start")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


def test_mailbox_folders_and_requests_are_private_whatever_the_umask(tmp_path: Path) -> None:
    agent = tmp_path / "work_dirs" / ".agents" / "123" / "n1-abcd"
    old = os.umask(0o002)  # a shared-group setup: folders would be 0775
    try:
        sdir = send_session(LocalShell(), str(agent), "s1", ["python", "-m", "pytest"],
                            cwd=str(tmp_path), env={"A": "1"}, nodeids="[]")
    finally:
        os.umask(old)
    tree = modes(tmp_path / "work_dirs")
    folders = {k: v for k, v in tree.items() if (tmp_path / "work_dirs" / k).is_dir()}
    files = {k: v for k, v in tree.items() if k not in folders}
    assert set(folders.values()) == {"0700"}, [k for k, v in folders.items() if v != "0700"]
    assert set(files.values()) == {"0600"}, files
    assert Path(sdir, "inbox").is_dir()


def test_a_request_from_another_user_is_refused_and_removed(neighbour: str,
                                                            shared_tmp: Path) -> None:
    mail = shared_tmp / "work_dirs" / ".agents" / "t1" / "n1-abcd"
    (mail / "inbox").mkdir(parents=True)
    for folder in (mail / "inbox", mail, mail.parent, mail.parent.parent):
        folder.chmod(0o777)  # the tree an older version left under a permissive umask
    pwned = shared_tmp / "PWNED"
    evil = shared_tmp / "test_evil.py"
    evil.write_text(EVIL_TEST.format(pwned=pwned))
    evil.chmod(0o644)
    agent = HandAgent(mail, shared_tmp / "agent.log", shared_tmp / "locks")
    try:
        assert agent.proc.poll() is None, agent.log.read_text()
        # the agent closed its tree: nobody else can drop anything any more
        for folder in (mail / "inbox", mail, mail.parent, mail.parent.parent):
            assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
        # someone (the user, by mistake) opens the tree again; the neighbour drops a request
        for folder in (mail / "inbox", mail, mail.parent, mail.parent.parent):
            folder.chmod(0o777)
        request = {"name": "evil", "argv": [sys.executable, "-m", "pytest", str(evil)],
                   "cwd": str(shared_tmp), "env": {}, "log_path": str(shared_tmp / "evil.log"),
                   "exit_path": str(shared_tmp / "evil.exit")}
        dropped = as_user(neighbour, 'umask 000; printf %s "$1" > "$2"', json.dumps(request),
                          str(mail / "inbox" / "evil.json"))
        assert dropped.returncode == 0, dropped.stderr
        wait_for(lambda: not (mail / "inbox" / "evil.json").exists(), "the agent to remove it")
        # our own request, but group-writable (anyone in the group could have changed it)
        # (made under a temporary name and renamed: the agent never sees it 0644 first)
        loose = mail / "inbox" / "loose.json"
        staged = mail / "inbox" / ".loose.tmp"
        staged.write_text(json.dumps({**request, "name": "loose"}))
        staged.chmod(0o664)
        staged.rename(loose)
        wait_for(lambda: not loose.exists(), "the agent to remove the group-writable request")
        # a link to a file of ours elsewhere (it may hold anything): refused, not followed
        decoy = shared_tmp / "decoy.json"
        decoy.write_text(json.dumps({**request, "name": "decoy"}))
        (mail / "inbox" / "linked.json").symlink_to(decoy)
        wait_for(lambda: not (mail / "inbox" / "linked.json").is_symlink(),
                 "the agent to remove the link")
        # a request that is the user's own and private still runs (the agent is serving)
        ours = {**request, "name": "ours", "env": {"PWNED_AT": str(shared_tmp / "ours-ran")},
                "exit_path": str(shared_tmp / "ours.exit")}
        LocalShell().write_file(str(mail / "inbox" / "ours.json"), json.dumps(ours))
        wait_for(lambda: (shared_tmp / "ours.exit").exists(), "our own request to run")
    finally:
        agent.stop()
    log = agent.log.read_text()
    assert (shared_tmp / "ours-ran").exists(), log
    assert not pwned.exists(), "a request of another user ran"
    assert not (shared_tmp / "evil.exit").exists()
    uid = pwd.getpwnam(neighbour).pw_uid
    assert f"refused {mail / 'inbox' / 'evil.json'}: it is owned by uid {uid}" in log, log
    assert f"refused {loose}: group or others may write it (mode 0664)" in log, log
    assert "linked.json: it is a symbolic link" in log and decoy.exists(), log


def test_a_lock_folder_another_user_made_first_is_not_used(neighbour: str,
                                                           shared_tmp: Path) -> None:
    lock_root = shared_tmp / "locks"
    lock_root.mkdir()
    lock_root.chmod(0o1777)  # like /tmp
    taken = lock_root / f"trtllm-slurm-{os.geteuid()}"
    made = as_user(neighbour, 'mkdir -m 777 "$1"', str(taken))
    assert made.returncode == 0, made.stderr
    mail = shared_tmp / "work_dirs" / ".agents" / "t1" / "n1-abcd"
    agent = HandAgent(mail, shared_tmp / "agent.log", lock_root)
    try:
        assert agent.proc.wait(timeout=60) == 2
    finally:
        agent.stop()
    log = agent.log.read_text()
    assert "refuses to start" in log and str(taken) in log, log
    assert f"owned by uid {pwd.getpwnam(neighbour).pw_uid}" in log, log
    assert list(taken.iterdir()) == [], "the agent used the other user's folder"


def test_the_lock_folder_is_verified_not_guessed(tmp_path: Path) -> None:
    locks = private_lock_dir("77", "n1", str(tmp_path))
    assert locks == tmp_path / f"trtllm-slurm-{os.geteuid()}" / "77-n1"
    assert stat.S_IMODE(locks.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(locks.stat().st_mode) == 0o700
    elsewhere = tmp_path / "other"
    elsewhere.mkdir()
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / f"trtllm-slurm-{os.geteuid()}").symlink_to(elsewhere)
    with pytest.raises(UntrustedPath, match="symbolic link"):
        private_lock_dir("77", "n1", str(linked))
    assert list(elsewhere.iterdir()) == []
