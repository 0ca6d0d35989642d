"""The warm worker of one node of a persistent allocation (target side): one Slurm step per
node with pytest imported once, forking a ``node.session_server`` session per run; it
re-executes itself when the plugin's files changed."""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import shutil
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from pytest_trtllm_slurm.node.files import (
    LOCK_ROOT,
    UntrustedPath,
    close_own_dirs,
    make_dirs,
    private_lock_dir,
    tree_up_to,
    write_atomic,
)
from pytest_trtllm_slurm.node.forkloop import ForkLoop, redirect_output, spawn
from pytest_trtllm_slurm.node.paths import AGENTS, Agent
from pytest_trtllm_slurm.node.protocol import AGENT_ENV, GPU_LOCKS_ENV, LOCK_ROOT_ENV  # noqa: F401

IDLE_EXIT = 6 * 3600.0
# the agent's step environment wins over a request's for these (they describe the node)
NODE_VARS = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


def code_stamp() -> str:
    """Changes when this package, pytest or the interpreter changes."""
    import pytest

    digest = hashlib.sha1(f"{sys.executable}|{sys.version}|{pytest.__version__}".encode())
    for path in sorted(Path(__file__).resolve().parents[1].glob("**/*.py")):  # the package
        st = path.stat()
        digest.update(f"{path}|{st.st_mtime_ns}|{st.st_size}".encode())
    return digest.hexdigest()[:16]


def preload() -> None:
    """Import what every session needs: pytest, its plugins, this package's worker."""
    import pytest  # noqa: F401

    for module in ("worker", "session_server"):  # warmed here, used by each forked session
        importlib.import_module(f"pytest_trtllm_slurm.node.{module}")

    for ep in importlib.metadata.entry_points(group="pytest11"):
        try:
            ep.load()
        except Exception:  # noqa: BLE001 - a broken plugin fails in the session, visibly
            continue


PATH_VARS = ("PATH", "LD_LIBRARY_PATH")


def env_from_request(request: dict[str, Any]) -> dict[str, str]:
    """The agent's environment under the run's: the run's values win, except the node's
    own (SLURM_*, visible devices) and search-path entries put in front of them."""
    env = dict(os.environ)
    for key, value in (request.get("env") or {}).items():
        if key in NODE_VARS or key.startswith("SLURM_"):
            continue
        if key in PATH_VARS and key in env:
            theirs = value.split(os.pathsep)
            extra = [p for p in env[key].split(os.pathsep) if p and p not in theirs]
            value = os.pathsep.join(extra + theirs)
        env[key] = value
    return env


def start_session(request: dict[str, Any]) -> int:
    """Fork a ``pytest.main`` with the request's argv, cwd, environment and log."""

    def run() -> int:
        import pytest

        os.chdir(request["cwd"])
        env = env_from_request(request)
        os.environ.clear()
        os.environ.update(env)
        for entry in reversed(env.get("PYTHONPATH", "").split(os.pathsep)):
            if entry and entry not in sys.path:
                sys.path.insert(0, entry)
        redirect_output(request["log_path"])
        argv = list(request["argv"])
        sys.argv = argv
        return int(pytest.main(argv[3:] if argv[1:3] == ["-m", "pytest"] else argv[1:]))

    return spawn(run)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pytest_trtllm_slurm.node.agent")
    parser.add_argument("--dir", required=True, help="the mailbox directory (shared FS)")
    parser.add_argument("--node", default=socket.gethostname())
    parser.add_argument("--idle-exit", type=float, default=IDLE_EXIT)
    args = parser.parse_args(argv)
    root = Path(args.dir)
    box = Agent(root)
    try:  # a lock folder or mailbox someone else made: serve nothing, and say why
        locks = private_lock_dir(os.environ.get("SLURM_JOB_ID", "nojob"), args.node,
                                 os.environ.get(LOCK_ROOT_ENV) or LOCK_ROOT)
        make_dirs(box.inbox)
        close_own_dirs([box.inbox, *tree_up_to(root, AGENTS)])
    except (UntrustedPath, OSError) as exc:
        print(f"[trtllm-slurm] agent on {args.node} refuses to start: {exc}", flush=True)
        sys.exit(2)
    os.environ[GPU_LOCKS_ENV] = str(locks)
    os.environ[AGENT_ENV] = str(root)
    preload()
    stamp = code_stamp()

    def before_request(request: dict[str, Any]) -> None:
        # the plugin changed: re-exec (keeping the mail) once no session's exit is pending
        if not loop.running and code_stamp() != stamp:
            write_atomic(box.request(request['name']), json.dumps(request))
            sys.stdout.flush()
            os.execv(sys.executable, [sys.executable, "-m", "pytest_trtllm_slurm.node.agent",
                                      *(argv if argv is not None else sys.argv[1:])])

    print(f"[trtllm-slurm] agent on {args.node} pid {os.getpid()} stamp {stamp}", flush=True)
    loop = ForkLoop(root, start_session, heartbeat=box.heartbeat,
                    info={"node": args.node, "stamp": stamp, "python": sys.executable},
                    idle_exit=args.idle_exit, before_request=before_request)
    # the allocation's end (or scancel of the step) sends SIGTERM: end the sessions too
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        loop.run()
    except SystemExit:
        # the allocation ends with every agent here; one idle agent leaving keeps the folder
        # (another agent of the allocation may still take GPUs in it)
        shutil.rmtree(locks, ignore_errors=True)
        raise


if __name__ == "__main__":
    main()
