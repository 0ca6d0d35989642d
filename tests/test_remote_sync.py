"""Code sync (seed Step 4) and preflight against the REAL sshd and REAL git repositories.

origin is a bare repository under tmp_path; "local" is a clone of it (the user's checkout);
the "remote" checkout is another clone under tmp_path, reached only through an SSHShell on
127.0.0.1 (same file system, so the test can look at both sides directly).
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from pytest_trtllm_slurm.errors import ConfigError, ExecutionError
from pytest_trtllm_slurm.execution.remote.secret_files import looks_secret
from pytest_trtllm_slurm.execution.remote.sync import temp_branch_name
from pytest_trtllm_slurm.execution.remote.workspace import (
    preflight,
    remote_paths,
    sync_cluster,
    sync_workspace,
)
from pytest_trtllm_slurm.planning.settings import ClusterConfig
from pytest_trtllm_slurm.transport.shell import LocalShell
from pytest_trtllm_slurm.transport.ssh.paramiko_shell import SSHShell, SSHTarget

pytestmark = pytest.mark.devcluster

ODD_NAME = "dir with space/we'ird $name [1].txt"


def git(repo: Path, *args: str, check: bool = True) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=False, stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise AssertionError(f"git {args} failed: {proc.stderr}")
    return proc.stdout


def make_cluster(ssh: dict[str, Any], **kw: Any) -> ClusterConfig:
    base = {"name": "dev", "ssh_host": ssh["host"], "ssh_port": ssh["port_key"],
            "user": ssh["user"], "identity_file": ssh["identity_file"],
            "known_hosts": ssh["known_hosts"], "sync": "git"}
    return ClusterConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def ssh_shell(devcluster: dict[str, Any]) -> Iterator[SSHShell]:
    ssh = devcluster["ssh"]
    sh = SSHShell(SSHTarget.from_cluster(make_cluster(ssh), ssh_config_path=os.devnull))
    yield sh
    sh.close()


@pytest.fixture
def repos(tmp_path: Path) -> dict[str, Path]:
    """origin (bare), local (the user's clone, with a stash entry) and the remote root."""
    origin, seed, local = tmp_path / "origin.git", tmp_path / "seed", tmp_path / "local" / "proj"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(origin)], check=True)
    subprocess.run(["git", "init", "-q", "-b", "main", str(seed)], check=True)
    (seed / "pkg").mkdir()
    (seed / "tracked.txt").write_text("tracked v1\n")
    (seed / "pkg" / "mod.py").write_text("VALUE = 1\n")
    (seed / "deleted.txt").write_text("to be deleted\n")
    (seed / ".gitignore").write_text("ignored.txt\n")
    git(seed, "add", "-A")
    git(seed, "commit", "-q", "-m", "initial")
    git(seed, "push", "-q", str(origin), "main")
    local.parent.mkdir()
    subprocess.run(["git", "clone", "-q", str(origin), str(local)], check=True)
    (local / "tracked.txt").write_text("stashed edit\n")
    git(local, "stash", "push", "-q", "-m", "user's own stash")
    return {"origin": origin, "local": local, "remote_root": tmp_path / "remote_root"}


def modify(local: Path) -> None:
    """A tracked edit (unstaged), a staged edit, a staged new file, a deletion, untracked
    files (one with an awkward name), an ignored file."""
    (local / "tracked.txt").write_text("tracked v2 (local edit)\n")
    (local / "pkg" / "mod.py").write_text("VALUE = 2\n")
    git(local, "add", "pkg/mod.py")
    (local / "staged_new.txt").write_text("staged new\n")
    git(local, "add", "staged_new.txt")
    (local / "deleted.txt").unlink()
    (local / "tests").mkdir()
    (local / "tests" / "test_new.py").write_text("def test_new():\n    assert True\n")
    (local / ODD_NAME).parent.mkdir()
    (local / ODD_NAME).write_text("odd\n")
    (local / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (local / "run.sh").chmod(0o755)
    (local / "ignored.txt").write_text("never shipped\n")


def snapshot(repo: Path) -> dict[str, Any]:
    """Everything the user could notice, read without any command that writes the index."""
    gitdir = repo / ".git"
    files: dict[str, object] = {}
    for path in sorted(repo.rglob("*")):
        rel = path.relative_to(repo).as_posix()
        if rel == ".git" or rel.startswith(".git/"):
            continue
        if path.is_file():
            files[rel] = (stat.S_IMODE(path.stat().st_mode),
                          hashlib.sha256(path.read_bytes()).hexdigest())
        else:
            files[rel] = "dir"
    return {
        "HEAD": (gitdir / "HEAD").read_bytes(),
        "head": git(repo, "rev-parse", "HEAD"),
        "index": (gitdir / "index").read_bytes(),
        "refs": git(repo, "for-each-ref", "--format=%(refname) %(objectname)"),
        "stash": git(repo, "stash", "list"),
        "config": (gitdir / "config").read_bytes(),
        "untracked": git(repo, "ls-files", "-z", "--others", "--exclude-standard"),
        "files": files,
    }


def origin_branches(origin: Path) -> list[str]:
    return git(origin, "for-each-ref", "--format=%(refname:short)", "refs/heads/").split()


def cc(**kw: Any) -> ClusterConfig:
    """A validated ClusterConfig (model_validate: mypy sees no pydantic field defaults)."""
    return ClusterConfig.model_validate(kw)


# -- sync ------------------------------------------------------------------------------
def test_sync_tracked_and_untracked_local_repo_untouched(repos: dict[str, Path],
                                                         ssh_shell: SSHShell) -> None:
    local, origin = repos["local"], repos["origin"]
    modify(local)
    before = snapshot(local)
    remote = repos["remote_root"] / "proj"
    result = sync_workspace(local, ssh_shell, str(remote), user="root", name="my model/v1")
    assert result.cloned and len(result.untracked) == 3 and not result.warnings
    assert result.branch.startswith("root_my_model_v1_") and len(result.branch) == len(
        "root_my_model_v1_") + 14
    # tracked changes (staged, unstaged, new, deleted) and untracked files all took effect
    assert (remote / "tracked.txt").read_text() == "tracked v2 (local edit)\n"
    assert (remote / "pkg" / "mod.py").read_text() == "VALUE = 2\n"
    assert (remote / "staged_new.txt").read_text() == "staged new\n"
    assert not (remote / "deleted.txt").exists()
    assert (remote / "tests" / "test_new.py").read_text().startswith("def test_new")
    assert (remote / ODD_NAME).read_text() == "odd\n"
    assert stat.S_IMODE((remote / "run.sh").stat().st_mode) == 0o755
    assert not (remote / "ignored.txt").exists()
    assert git(remote, "rev-parse", "--abbrev-ref", "HEAD").strip() == result.branch
    assert git(remote, "rev-parse", "HEAD").strip() == result.commit
    assert git(remote, "log", "-1", "--format=%s").startswith("sync: temp snapshot")
    # the temp branch is gone from origin; the local repository is exactly as it was
    assert origin_branches(origin) == ["main"]
    assert snapshot(local) == before
    assert git(local, "stash", "list").count("\n") == 1


def test_second_sync_stashes_leftovers_keeps_work_dirs_prunes_branches(
        repos: dict[str, Path], ssh_shell: SSHShell) -> None:
    local = repos["local"]
    remote = repos["remote_root"] / "proj"
    first = sync_workspace(local, ssh_shell, str(remote), user="u", name="m",
                           now=datetime(2026, 1, 1, 10, 0, 0))
    (remote / "tracked.txt").write_text("edited on the cluster\n")
    (remote / "stale_untracked.txt").write_text("left from an old session\n")
    (remote / "work_dirs" / "run_1").mkdir(parents=True)
    (remote / "work_dirs" / "run_1" / "reports.jsonl").write_text("{}\n")
    (local / "tracked.txt").write_text("second\n")
    second = sync_workspace(local, ssh_shell, str(remote), user="u", name="m",
                            now=datetime(2026, 1, 1, 10, 0, 5))
    assert not second.cloned and second.branch != first.branch
    assert (remote / "tracked.txt").read_text() == "second\n"
    assert not (remote / "stale_untracked.txt").exists()
    assert "auto-stash before remote sync" in git(remote, "stash", "list")
    assert (remote / "work_dirs" / "run_1" / "reports.jsonl").read_text() == "{}\n"
    branches = git(remote, "for-each-ref", "--format=%(refname:short)", "refs/heads/").split()
    assert first.branch not in branches and second.branch in branches
    assert origin_branches(repos["origin"]) == ["main"]


def test_push_failure_leaves_local_repo_untouched(repos: dict[str, Path],
                                                  ssh_shell: SSHShell) -> None:
    local, origin = repos["local"], repos["origin"]
    remote = repos["remote_root"] / "proj"
    subprocess.run(["git", "clone", "-q", str(origin), str(remote)], check=True)
    modify(local)
    before = snapshot(local)
    origin.rename(origin.with_name("moved.git"))  # origin unreachable from here on
    with pytest.raises(ExecutionError) as err:
        sync_workspace(local, ssh_shell, str(remote), user="root", name="m", via="origin")
    assert "pushing the snapshot to origin" in str(err.value)
    assert "local repository was not changed" in str(err.value)
    assert snapshot(local) == before


def test_remote_failure_after_push_deletes_temp_branch(repos: dict[str, Path],
                                                       ssh_shell: SSHShell) -> None:
    local, origin = repos["local"], repos["origin"]
    remote = repos["remote_root"] / "proj"
    subprocess.run(["git", "clone", "-q", str(origin), str(remote)], check=True)
    git(remote, "remote", "set-url", "origin", str(remote.parent / "nowhere.git"))
    modify(local)
    before = snapshot(local)
    with pytest.raises(ExecutionError) as err:
        sync_workspace(local, ssh_shell, str(remote), user="root", name="m", via="origin")
    assert "fetching" in str(err.value) and "127.0.0.1" in str(err.value)
    assert origin_branches(origin) == ["main"]  # pushed, then deleted despite the failure
    assert snapshot(local) == before


def test_unreachable_origin_for_first_clone(repos: dict[str, Path], ssh_shell: SSHShell) -> None:
    local = repos["local"]
    git(local, "remote", "set-url", "origin", str(repos["origin"].with_name("gone.git")))
    before = snapshot(local)
    with pytest.raises(ExecutionError, match=r"cloning .* \(is origin reachable"):
        sync_workspace(local, ssh_shell, str(repos["remote_root"] / "proj"), user="u", name="m",
                       via="origin")
    assert snapshot(local) == before
    # over SSH (the default) origin is not needed: the whole history goes as a bundle
    result = sync_workspace(local, ssh_shell, str(repos["remote_root"] / "proj"), user="u",
                            name="m")
    assert result.cloned and "could not be cloned" in result.warnings[0]
    remote = repos["remote_root"] / "proj"
    assert git(remote, "rev-parse", "HEAD").strip() == result.commit
    assert (remote / "tracked.txt").read_text() == "tracked v1\n"
    assert snapshot(local) == before


# -- sync over SSH: nothing reaches origin, only what changed travels, no secrets ----------
def _guard_origin(origin: Path) -> Path:
    """A pre-receive hook that records any push to origin and refuses it."""
    marker = origin / "PUSHED"
    hook = origin / "hooks" / "pre-receive"
    hook.write_text(f"#!/bin/sh\ntouch '{marker}'\nexit 1\n")
    hook.chmod(0o755)
    return marker


def test_default_sync_never_writes_to_origin(repos: dict[str, Path], ssh_shell: SSHShell) -> None:
    """Origin may be a public fork: uncommitted work goes over the run's SSH connection."""
    local, origin = repos["local"], repos["origin"]
    marker = _guard_origin(origin)
    refs_before = git(origin, "for-each-ref")
    modify(local)
    before = snapshot(local)
    remote = repos["remote_root"] / "proj"
    result = sync_workspace(local, ssh_shell, str(remote), user="u", name="m")
    assert result.via == "ssh" and result.bundle_bytes > 0 and not result.warnings
    assert not marker.exists(), "something was pushed to origin"
    assert git(origin, "for-each-ref") == refs_before
    assert (remote / "tracked.txt").read_text() == "tracked v2 (local edit)\n"
    assert (remote / "staged_new.txt").read_text() == "staged new\n"
    assert not (remote / "deleted.txt").exists()
    assert git(remote, "rev-parse", "HEAD").strip() == result.commit
    assert not list((remote / ".git").glob("*.bundle")), "the bundle was left on the cluster"
    assert snapshot(local) == before


def test_second_sync_sends_only_the_new_commits(repos: dict[str, Path],
                                                ssh_shell: SSHShell) -> None:
    """No origin at all: the first sync sends the whole history, the next only the snapshot."""
    local = repos["local"]
    git(local, "remote", "remove", "origin")
    (local / "big.bin").write_bytes(os.urandom(300_000))
    git(local, "add", "big.bin")
    git(local, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "big")
    remote = repos["remote_root"] / "proj"
    first = sync_workspace(local, ssh_shell, str(remote), user="u", name="m",
                           now=datetime(2026, 1, 1, 10, 0, 0))
    assert first.cloned and first.bundle_bytes > 300_000
    (local / "tracked.txt").write_text("small change\n")
    second = sync_workspace(local, ssh_shell, str(remote), user="u", name="m",
                            now=datetime(2026, 1, 1, 10, 0, 5))
    assert not second.cloned and 0 < second.bundle_bytes < 5_000
    assert (remote / "tracked.txt").read_text() == "small change\n"
    assert (remote / "big.bin").read_bytes() == (local / "big.bin").read_bytes()
    assert git(remote, "rev-parse", "HEAD").strip() == second.commit


SECRETS = [".env", "config/.env.local", "certs/server.pem", "deploy/id_ed25519", ".netrc",
           "config/api.key", "home/.ssh/config", "hf_token"]


def test_untracked_files_are_listed_first_and_secrets_never_shipped(
        repos: dict[str, Path], ssh_shell: SSHShell) -> None:
    local = repos["local"]
    (local / "config").mkdir()
    (local / "config" / "app.key").write_text("committed key\n")  # tracked, then edited
    git(local, "add", "config/app.key")
    git(local, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "key")
    (local / "config" / "app.key").write_text("NEW SECRET KEY\n")
    (local / "staged [1].pem").write_text("staged, never committed\n")  # in the index only
    git(local, "add", "staged [1].pem")
    for name in SECRETS:
        (local / name).parent.mkdir(parents=True, exist_ok=True)
        (local / name).write_text("SECRET=1\n")
    (local / "notes.txt").write_text("plain\n")
    (local / "tests").mkdir()
    (local / "tests" / "test_id_map.py").write_text("def test_x():\n    pass\n")
    remote = repos["remote_root"] / "proj"
    said: list[str] = []

    def say(line: str) -> None:
        said.append(line)
        if "shipping" in line:  # listed before anything is unpacked there
            assert not (remote / "notes.txt").exists()

    result = sync_workspace(local, ssh_shell, str(remote), user="u", name="m", say=say)
    assert sorted(result.untracked) == ["notes.txt", "tests/test_id_map.py"]
    assert (remote / "notes.txt").exists() and (remote / "tests" / "test_id_map.py").exists()
    for name in SECRETS:
        assert not (remote / name).exists(), name
    assert (remote / "config" / "app.key").read_text() == "committed key\n"
    assert not (remote / "staged [1].pem").exists()
    assert sorted(result.withheld) == sorted([*SECRETS, "config/app.key", "staged [1].pem"])
    shipping = next(line for line in said if "shipping 2 untracked file(s)" in line)
    assert "notes.txt" in shipping and "tests/test_id_map.py" in shipping
    withheld = next(line for line in said if "NOT shipped" in line)
    assert all(name in withheld for name in SECRETS) and "sync_secrets = true" in withheld

    # asked for: shipped
    again = sync_workspace(local, ssh_shell, str(remote), user="u", name="m2",
                           ship_secrets=True)
    assert not again.withheld and (remote / ".env").read_text() == "SECRET=1\n"
    assert (remote / "config" / "app.key").read_text() == "NEW SECRET KEY\n"
    assert (remote / "staged [1].pem").read_text() == "staged, never committed\n"


@pytest.mark.parametrize(("path", "secret"), [
    (".env", True), (".env.production", True), (".envrc", True), (".env_local", True), ("sub/dir/.env.local", True), ("prod.env", True),
    ("server.pem", True), ("tls/private.KEY", True), ("id_rsa", True), ("keys/id_ed25519", True),
    ("id_work", True), (".netrc", True), (".git-credentials", True), (".pypirc", True),
    ("home/.aws/credentials", True), ("x/.ssh/known_hosts", True), ("cert.p12", True),
    ("id_utils.py", False), ("tests/test_env.py", False), ("environment.yml", False),
    ("keyboard.py", False), ("README.md", False), ("tokenizer.json", False),
    ("docs/env.md", False), ("monkey.py", False),
])
def test_looks_secret(path: str, secret: bool) -> None:
    assert looks_secret(path) is secret


def test_sync_cluster_none_and_paths(repos: dict[str, Path], ssh_shell: SSHShell) -> None:
    local = repos["local"]
    shared = cc(name="shared", sync="none")
    assert sync_cluster(shared, local, ssh_shell, name="m") is None
    assert remote_paths(shared, local) == (str(local.resolve()), f"{local.resolve()}/work_dirs")
    (local / "tests").mkdir()
    cluster = cc(name="c", sync="git", user_root_dir="/scratch/u/")
    paths = remote_paths(cluster, local / "tests")  # pytest rootdir below the repo top
    assert paths == ("/scratch/u/proj", "/scratch/u/proj/tests/work_dirs")
    with pytest.raises(ConfigError, match="user_root_dir"):
        remote_paths(cc(name="c", sync="git"), local)
    assert temp_branch_name("a.b@c", "x y", datetime(2026, 4, 30, 14, 52)) == \
        "a_b_c_x_y_20260430145200"


def test_sync_cluster_end_to_end(repos: dict[str, Path], ssh_shell: SSHShell,
                                 devcluster: dict[str, Any]) -> None:
    local = repos["local"]
    (local / "new_untracked.py").write_text("x = 1\n")
    (local / ".env").write_text("TOKEN=x\n")
    cluster = make_cluster(devcluster["ssh"], user_root_dir=str(repos["remote_root"]))
    result = sync_cluster(cluster, local, ssh_shell, name="e2e")
    assert result is not None and result.remote_repo == f"{repos['remote_root']}/proj"
    assert result.via == "ssh" and result.withheld == [".env"]
    assert (repos["remote_root"] / "proj" / "new_untracked.py").read_text() == "x = 1\n"
    assert not (repos["remote_root"] / "proj" / ".env").exists()
    # the clusters file's keys: the seed's way through origin, and secrets when asked
    (local / "tracked.txt").write_text("through origin\n")
    seed_way = make_cluster(devcluster["ssh"], user_root_dir=str(repos["remote_root"]),
                            sync="git-origin", sync_secrets=True)
    result = sync_cluster(seed_way, local, ssh_shell, name="e2e")
    assert result is not None and result.via == "origin" and not result.withheld
    assert (repos["remote_root"] / "proj" / "tracked.txt").read_text() == "through origin\n"
    assert (repos["remote_root"] / "proj" / ".env").read_text() == "TOKEN=x\n"
    assert origin_branches(repos["origin"]) == ["main"]


# -- preflight ---------------------------------------------------------------------------
def test_preflight_creates_dir_and_records_slurm_version(ssh_shell: SSHShell, tmp_path: Path,
                                                         devcluster: dict[str, Any]) -> None:
    root = tmp_path / "cluster_root" / "u"
    cluster = make_cluster(devcluster["ssh"], user_root_dir=str(root))
    result = preflight(ssh_shell, cluster)
    assert result.created_dir and root.is_dir() and result.host == "127.0.0.1"
    assert result.slurm_version.startswith("22.05")
    assert "git" in result.tools_checked and "sbatch" in result.tools_checked
    assert "flock" in result.tools_checked  # the shared allocation's locks there
    assert not preflight(ssh_shell, cluster).created_dir


def test_preflight_failures_name_host_and_fix(ssh_shell: SSHShell, tmp_path: Path,
                                              devcluster: dict[str, Any],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "nope"
    cluster = make_cluster(devcluster["ssh"], user_root_dir=str(missing))
    with pytest.raises(ExecutionError) as err:
        preflight(ssh_shell, cluster, create_dirs=False)
    assert "127.0.0.1" in str(err.value) and "mkdir -p" in str(err.value)
    with pytest.raises(ConfigError, match="no user_root_dir"):
        preflight(ssh_shell, make_cluster(devcluster["ssh"]))
    # Slurm tools absent (a real shell whose PATH has no Slurm in it)
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    monkeypatch.setenv("PATH", str(empty_bin))
    local = cc(name="here", sync="none")
    with pytest.raises(ExecutionError, match="localhost: Slurm's `sinfo` is not found"):
        preflight(LocalShell(), local)


def test_credentials_in_the_origin_url_never_reach_the_cluster(repos: dict[str, Path],
                                                                ssh_shell: SSHShell) -> None:
    """An https origin with a token in it: the cluster clones without it (here it cannot
    clone at all, so the history goes over SSH), and no message shows it."""
    local = repos["local"]
    git(local, "remote", "set-url", "origin", "https://me:s3cret-token@127.0.0.1:9/proj.git")
    remote = repos["remote_root"] / "proj"
    result = sync_workspace(local, ssh_shell, str(remote), user="u", name="m")
    assert result.cloned and git(remote, "rev-parse", "HEAD").strip() == result.commit
    assert "s3cret" not in " ".join(result.warnings)
    assert "s3cret" not in (remote / ".git" / "config").read_text()
    (local / "tracked.txt").write_text("changed: the snapshot must be pushed\n")
    with pytest.raises(ExecutionError) as err:
        sync_workspace(local, ssh_shell, str(remote), user="u", name="m", via="origin")
    assert "s3cret" not in str(err.value) and "https://127.0.0.1:9/proj.git" in str(err.value)


# -- only what changed is sent (issue 20) ----------------------------------------------
def test_a_sync_with_no_change_sends_nothing_and_a_change_sends_only_itself(
        repos: dict[str, Path], ssh_shell: SSHShell) -> None:
    local = repos["local"]
    remote = repos["remote_root"] / "proj"
    modify(local)
    first = sync_workspace(local, ssh_shell, str(remote), user="u", name="m")
    assert first.cloned and first.sent_bytes > 0 and len(first.untracked) == 3
    again = sync_workspace(local, ssh_shell, str(remote), user="u", name="m")
    # nothing went over the wire: no commit, no file, no checkout, no stash
    assert again.unchanged and again.sent_bytes == 0 and again.bundle_bytes == 0
    assert again.untracked == [] and again.removed == [] and not again.stashed
    assert again.commit == first.commit and again.branch == first.branch
    assert git(remote, "rev-parse", "HEAD").strip() == first.commit
    assert git(remote, "stash", "list") == ""
    # one untracked file changed: only it is shipped
    (local / "tests" / "test_new.py").write_text("def test_new():\n    assert 1\n")
    one = sync_workspace(local, ssh_shell, str(remote), user="u", name="m")
    assert one.unchanged and one.untracked == ["tests/test_new.py"] and one.bundle_bytes == 0
    assert 0 < one.sent_bytes < 20_000
    assert (remote / "tests" / "test_new.py").read_text() == "def test_new():\n    assert 1\n"
    # one tracked file changed: one small commit, no untracked file
    (local / "tracked.txt").write_text("tracked v3\n")
    tracked = sync_workspace(local, ssh_shell, str(remote), user="u", name="m")
    assert not tracked.unchanged and tracked.untracked == [] and not tracked.stashed
    assert 0 < tracked.bundle_bytes == tracked.sent_bytes < 5_000
    assert (remote / "tracked.txt").read_text() == "tracked v3\n"
    assert (remote / ODD_NAME).read_text() == "odd\n"  # untouched, still there
    # an untracked file removed here is removed there (only what a sync shipped)
    (local / "run.sh").unlink()
    (remote / "made_on_the_cluster.txt").write_text("a session's output\n")
    gone = sync_workspace(local, ssh_shell, str(remote), user="u", name="m")
    assert gone.removed == ["run.sh"] and not (remote / "run.sh").exists()
    # a file no sync put there is a leftover: stashed as before, everything shipped again
    assert gone.stashed and not (remote / "made_on_the_cluster.txt").exists()
    assert sorted(gone.untracked) == sorted([ODD_NAME, "tests/test_new.py"])
    last = sync_workspace(local, ssh_shell, str(remote), user="u", name="m")
    assert last.unchanged and last.sent_bytes == 0


def test_a_sync_with_no_change_is_one_round_trip(repos: dict[str, Path],
                                                 ssh_shell: SSHShell) -> None:
    """Nothing changed: the one look at the checkout (its trust check, HEAD, refs, record
    and status in one command) proves it, and nothing else goes over the wire. A checkout
    that became unsafe meanwhile (group-writable hooks) is refused by that same look,
    before git runs there."""
    local = repos["local"]
    remote = repos["remote_root"] / "proj"
    modify(local)
    sync_workspace(local, ssh_shell, str(remote), user="u", name="m")
    assert ssh_shell.relay_up()
    relay = ssh_shell._relay
    assert relay is not None
    before = dict(relay.requests)
    again = sync_workspace(local, ssh_shell, str(remote), user="u", name="m")
    asked = {op: n - before.get(op, 0) for op, n in relay.requests.items()
             if n != before.get(op, 0)}
    assert again.unchanged and again.sent_bytes == 0
    assert asked == {"run": 1}, asked
    (remote / ".git" / "hooks").chmod(0o775)
    before = dict(relay.requests)
    with pytest.raises(ExecutionError, match="hooks"):
        sync_workspace(local, ssh_shell, str(remote), user="u", name="m")
    assert sum(relay.requests.values()) - sum(before.values()) == 1


def test_an_untracked_file_deleted_on_the_cluster_is_shipped_again(
        repos: dict[str, Path], ssh_shell: SSHShell) -> None:
    local = repos["local"]
    remote = repos["remote_root"] / "proj"
    (local / "notes.txt").write_text("notes\n")
    sync_workspace(local, ssh_shell, str(remote), user="u", name="m")
    (remote / "notes.txt").unlink()
    again = sync_workspace(local, ssh_shell, str(remote), user="u", name="m")
    assert again.untracked == ["notes.txt"] and (remote / "notes.txt").read_text() == "notes\n"


def test_a_same_size_edit_in_the_second_the_index_was_written_is_shipped(
        repos: dict[str, Path], ssh_shell: SSHShell) -> None:
    """git trusts an index entry's stat data (seconds) unless the file is not older than
    the index itself (a "racy" entry, hashed again). The snapshot's private index must
    keep that: a same-size edit made in the second `git add` wrote the index is shipped,
    even when the sync comes seconds later."""
    local = repos["local"]
    remote = repos["remote_root"] / "proj"
    target = local / "tracked.txt"
    sync_workspace(local, ssh_shell, str(remote), user="u", name="r")
    for _ in range(20):  # the add and the edit within one second of the clock
        second = int(time.time())
        target.write_text("racy v1\n")
        git(local, "add", "tracked.txt")
        target.write_text("racy v2\n")  # same size, same second: same stat data
        if int(time.time()) == second:
            break
    else:
        pytest.fail("could not write, add and edit within one second")
    time.sleep(1.5)  # the sync's private index is made seconds after the real one
    sync_workspace(local, ssh_shell, str(remote), user="u", name="r")
    assert (remote / "tracked.txt").read_text() == "racy v2\n"
