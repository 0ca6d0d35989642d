"""A ``ttl``-second cache of Slurm discovery (about 0.2 s a run), never of one with errors;
keyed by cluster, user and SLURM_CONF (``work_dirs/.cache/slurm_env.json`` locally)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from pytest_trtllm_slurm.execution.work_root import ensure_work_root
from pytest_trtllm_slurm.node.files import write_atomic
from pytest_trtllm_slurm.planning.jobspec import SlurmEnv

DEFAULT_TTL = 300.0


def cache_key(cluster_name: str | None) -> str:
    return f"{cluster_name}|{os.getuid()}|{os.environ.get('SLURM_CONF', '')}"


def cached_discovery(path: Path, key: str, discover: Callable[[], SlurmEnv],
                     ttl: float = DEFAULT_TTL) -> SlurmEnv:
    """The cached SlurmEnv when fresh and for the same key, else ``discover()`` (saved)."""
    if ttl > 0:
        try:
            data = json.loads(path.read_text("utf-8"))
            if data.get("key") == key and time.time() - float(data.get("at", 0)) < ttl:
                return SlurmEnv.model_validate(data["env"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    env = discover()
    if not env.errors and ttl > 0:
        try:
            ensure_work_root(path.parent.parent)  # <work_dirs>/.cache/<file>
            path.parent.mkdir(exist_ok=True)
            write_atomic(path, json.dumps(
                {"key": key, "at": time.time(), "env": env.model_dump(mode="json")}), parents=True)
        except OSError:
            pass  # a read-only checkout still runs, it just discovers every time
    return env
