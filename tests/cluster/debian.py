#!/usr/bin/env python3
"""The Debian packages the test suite uses, and how the suite installs them by itself.

Why one list: README's test command must work on a fresh machine. A package that only
`.ci/run` installs makes CI green and a newcomer's run red, so every group the tests need is
listed here, and the code that needs it (``tests/cluster/up``, the pyxis double's build,
``tests/containers_fixture.py``) calls ``ensure(group)`` before use. ``.ci/run`` may call
``python3 tests/cluster/debian.py all`` first, only to save time; nothing depends on it.

Installing needs root and apt-get; otherwise ``ensure`` raises with the exact commands to run.
Concurrent callers (xdist workers, two sessions) are serialized by a file lock and by apt's
own lock timeout. Package scripts are kept from starting services (policy-rc.d), as the dev
cluster starts its daemons on its own ports.

Usage: ``python3 tests/cluster/debian.py [GROUP ...|all]``  (no argument: list the groups)
"""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

# group -> (packages, files that prove the group is usable)
GROUPS: dict[str, tuple[list[str], list[str]]] = {
    # the dev cluster: Slurm with accounting, munge, MariaDB for slurmdbd, the test sshd
    # (key and one-time code), git for the code-sync tests
    "cluster": (
        ["slurm-wlm", "slurmdbd", "munge", "mariadb-server", "openssh-server", "oathtool",
         "libpam-oath", "git"],
        ["/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/slurmdbd", "/usr/bin/sbatch",
         "/usr/bin/sacctmgr", "/usr/sbin/munged", "/usr/bin/munge", "/usr/sbin/mariadbd",
         "/usr/bin/mariadb-install-db", "/usr/bin/mariadb-admin", "/usr/bin/mariadb",
         "/usr/sbin/sshd", "/usr/bin/ssh-keygen", "/usr/bin/oathtool", "/usr/bin/git"],
    ),
    # the pyxis test double: a SPANK plugin compiled against Slurm's header
    "spank": (
        ["libslurm-dev", "gcc", "libc6-dev"],
        ["/usr/include/slurm/spank.h", "/usr/bin/gcc"],
    ),
    # local container engines (their daemons/stores are started by the tests) and the
    # busybox that the test image is built from
    "containers": (
        ["docker.io", "containerd", "podman", "runc", "crun", "fuse-overlayfs", "slirp4netns",
         "uidmap", "busybox-static"],
        ["/usr/bin/docker", "/usr/sbin/dockerd", "/usr/bin/podman", "/usr/sbin/runc",
         "/usr/bin/crun", "/bin/busybox"],
    ),
}

LOCK = Path("/var/lock/trtllm-tests-apt.lock")


class PackagesMissing(RuntimeError):
    """A group cannot be installed here (not root, no apt-get, or apt failed)."""


def _log(msg: str) -> None:
    print(f"[debian] {msg}", file=sys.stderr, flush=True)


def all_packages() -> list[str]:
    return [p for pkgs, _ in GROUPS.values() for p in pkgs]


def missing_files(group: str) -> list[str]:
    return [f for f in GROUPS[group][1] if not os.path.exists(f)]


def _missing_packages(packages: list[str]) -> list[str]:
    if not shutil.which("dpkg-query"):
        return list(packages)
    r = subprocess.run(["dpkg-query", "-W", "-f=${Package} ${db:Status-Abbrev}\n", *packages],
                       capture_output=True, text=True, check=False)
    ok = {f[0] for f in (line.split() for line in r.stdout.splitlines())
          if len(f) > 1 and f[1] == "ii"}
    return [p for p in packages if p not in ok]


def _apt(args: list[str], env: dict[str, str], timeout: int) -> subprocess.CompletedProcess:
    cmd = ["apt-get", "-o", "DPkg::Lock::Timeout=600", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout,
                          stdin=subprocess.DEVNULL, check=False)


def _install(packages: list[str], log) -> None:
    cmd_text = "apt-get install -y --no-install-recommends " + " ".join(packages)
    if os.geteuid() != 0:
        raise PackagesMissing(
            f"missing Debian packages: {' '.join(packages)}\nInstall them as root:\n"
            f"  sudo env DEBIAN_FRONTEND=noninteractive apt-get update\n"
            f"  sudo env DEBIAN_FRONTEND=noninteractive {cmd_text}")
    if not shutil.which("apt-get"):
        raise PackagesMissing(f"missing packages {' '.join(packages)} and no apt-get here")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["DEBIAN_FRONTEND"] = "noninteractive"
    policy = Path("/usr/sbin/policy-rc.d")
    made_policy = not policy.exists()
    if made_policy:  # keep package scripts from starting services (mariadb :3306, sshd :22)
        policy.write_text("#!/bin/sh\n# temporary, tests/cluster/debian.py\nexit 101\n")
        policy.chmod(0o755)
    try:
        lists = Path("/var/lib/apt/lists")
        have_lists = lists.is_dir() and any("_Packages" in p.name for p in lists.iterdir())
        if not have_lists:
            log("apt-get update")
            _apt(["update"], env, 600)
        log(cmd_text)
        args = ["install", "-y", "--no-install-recommends", *packages]
        r = _apt(args, env, 1800)
        if r.returncode != 0 and have_lists:
            log("install failed; apt-get update and retry")
            _apt(["update"], env, 600)
            r = _apt(args, env, 1800)
        if r.returncode != 0:
            raise PackagesMissing(f"`{cmd_text}` failed:\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
    finally:
        if made_policy:
            policy.unlink(missing_ok=True)


def ensure(*groups: str, log=_log) -> None:
    """Install what the groups need, if anything is missing (idempotent; cheap when present)."""
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        raise ValueError(f"unknown package group(s) {unknown}; known: {sorted(GROUPS)}")
    if not any(missing_files(g) for g in groups) and not _missing_packages(
            [p for g in groups for p in GROUPS[g][0]]):
        return
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        packages = _missing_packages([p for g in groups for p in GROUPS[g][0]])
        broken = [g for g in groups if missing_files(g)]
        if broken and not packages:  # dpkg says installed but files are gone: reinstall
            packages = [p for g in broken for p in GROUPS[g][0]]
        if packages:
            _install(packages, log)
    still = [f for g in groups for f in missing_files(g)]
    if still:
        raise PackagesMissing("still missing after apt-get install: " + ", ".join(still))


def main(argv: list[str]) -> int:
    if not argv:
        for name, (pkgs, _) in GROUPS.items():
            print(f"{name}: {' '.join(pkgs)}")
        return 0
    groups = list(GROUPS) if argv == ["all"] else argv
    try:
        ensure(*groups)
    except (PackagesMissing, ValueError) as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
