"""The five-minute cache of the local Slurm discovery: reused while fresh and for the same
cluster, rediscovered otherwise, never written when discovery reported errors."""

from __future__ import annotations

import json
from pathlib import Path

from pytest_trtllm_slurm.execution.slurm.client import cached_discovery
from pytest_trtllm_slurm.planning.jobspec import SlurmEnv


class Discover:
    def __init__(self, env: SlurmEnv) -> None:
        self.env, self.calls = env, 0

    def __call__(self) -> SlurmEnv:
        self.calls += 1
        return self.env


def test_fresh_cache_is_reused_for_the_same_key_only(tmp_path: Path) -> None:
    path = tmp_path / ".cache" / "slurm_env.json"
    discover = Discover(SlurmEnv(cluster_name="dev", user="u", default_account="a"))
    first = cached_discovery(path, "dev|0|", discover)
    again = cached_discovery(path, "dev|0|", discover)
    assert discover.calls == 1 and again == first
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    cached_discovery(path, "other|0|", discover)  # another cluster: discovered anew
    assert discover.calls == 2


def test_an_old_cache_is_rediscovered(tmp_path: Path) -> None:
    path = tmp_path / "slurm_env.json"
    discover = Discover(SlurmEnv(cluster_name="dev"))
    cached_discovery(path, "k", discover)
    data = json.loads(path.read_text())
    data["at"] -= 301
    path.write_text(json.dumps(data))
    cached_discovery(path, "k", discover)
    assert discover.calls == 2


def test_a_discovery_with_errors_is_not_cached_and_a_corrupt_file_is_ignored(
        tmp_path: Path) -> None:
    path = tmp_path / "slurm_env.json"
    failing = Discover(SlurmEnv(errors=["accounts: sacctmgr timed out"]))
    cached_discovery(path, "k", failing)
    assert not path.exists()
    path.write_text("{not json")
    good = Discover(SlurmEnv(cluster_name="dev"))
    assert cached_discovery(path, "k", good).cluster_name == "dev" and good.calls == 1
    assert json.loads(path.read_text())["env"]["cluster_name"] == "dev"
