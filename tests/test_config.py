"""config.py: the clusters file and Settings, and how their errors reach the user."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from pytest_trtllm_slurm.errors import ConfigError
from pytest_trtllm_slurm.planning.settings import (
    ClustersFile,
    Settings,
    default_clusters_paths,
    load_clusters_file,
)

pytest_plugins = ["pytester"]

GOOD = """
[clusters.Dev]
ssh_host = "login.example"
partition = "batch"
account = "acct_a"
gpus_per_node = 4
mounts = ["/data:/data"]
container_install_command = "pip install -e ."
env = { NCCL_DEBUG = "WARN" }
time_limit = "04:00:00"

[clusters.local]
partition = "gb200"
"""


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith("TRTLLM_SLURM_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_load_good_file(tmp_path: Path) -> None:
    path = write(tmp_path / "c.toml", GOOD)
    clusters = load_clusters_file(path, tmp_path)
    dev = clusters.get("dev")  # case-insensitive
    assert (dev.name, dev.partition, dev.gpus_per_node, dev.is_remote) == ("Dev", "batch", 4, True)
    assert dev.mounts == ["/data:/data"] and dev.env == {"NCCL_DEBUG": "WARN"}
    assert dev.container_install_command == "pip install -e ."
    assert clusters.get("LOCAL").is_remote is False
    assert clusters.path == str(path)


def test_default_locations(tmp_path: Path) -> None:
    assert load_clusters_file(None, tmp_path).clusters == {}
    write(tmp_path / "home" / ".config" / "trtllm-slurm" / "clusters.toml", GOOD)
    assert "local" in load_clusters_file(None, tmp_path).clusters
    write(tmp_path / "trtllm-slurm.toml", '[clusters.root]\npartition = "p"\n')
    assert list(load_clusters_file(None, tmp_path).clusters) == ["root"]  # rootdir first
    assert default_clusters_paths(tmp_path)[0] == tmp_path / "trtllm-slurm.toml"


def test_unknown_cluster_lists_known(tmp_path: Path) -> None:
    clusters = load_clusters_file(write(tmp_path / "c.toml", GOOD), tmp_path)
    with pytest.raises(ConfigError) as info:
        clusters.get("nosuch")
    text = str(info.value)
    assert "'nosuch'" in text and "Dev" in text and "local" in text and "c.toml" in text
    with pytest.raises(ConfigError, match="no clusters file found"):
        ClustersFile().get("x")


@pytest.mark.parametrize(
    "text, needles",
    [
        ("[clusters.a]\npartiton = 'p'\n", ["clusters.a.partiton", "Extra inputs"]),
        ("[clusters.a]\ngpus_per_node = 0\n", ["clusters.a.gpus_per_node", "found 0"]),
        ("[clusters.a]\ntransport = 'telnet'\n", ["clusters.a.transport", "'telnet'"]),
        ("[clusters.a]\ncontainer_install_command = ''\n",
         ["clusters.a.container_install_command", "found ''"]),
        ("[clusters.a]\ncontainer_install_command = ['pip']\n",
         ["clusters.a.container_install_command", "string"]),
        ("[cluster.a]\npartition = 'p'\n", ["unknown top-level", "cluster"]),
        ("[clusters]\na = 1\n", ["clusters.a must be a table"]),
        ("[clusters.a\n", ["not valid TOML"]),
    ],
)
def test_malformed_files(tmp_path: Path, text: str, needles: list[str]) -> None:
    path = write(tmp_path / "bad.toml", text)
    with pytest.raises(ConfigError) as info:
        load_clusters_file(path, tmp_path)
    assert str(path) in str(info.value)
    for needle in needles:
        assert needle in str(info.value)


def test_missing_explicit_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--trtllm-config"):
        load_clusters_file(tmp_path / "nope.toml", tmp_path)


def test_settings_reject_unknown_fields_and_values() -> None:
    with pytest.raises(ValidationError):
        Settings(partiton="x")  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        Settings(scenario="cloud")  # type: ignore[arg-type]
    assert Settings(scenario="local_slurm").scenario.value == "local_slurm"  # type: ignore[union-attr]


# --------------------------------------------------------------------------- end to end


@pytest.mark.parametrize(
    "files, args, needles",
    [
        ({"trtllm-slurm.toml": GOOD}, ["--trtllm-plan", "--slurm-cluster=nosuch"],
         ["unknown cluster 'nosuch'", "Dev, local"]),
        ({"c.toml": "[clusters.a]\npartiton = 'p'\n"},
         ["--trtllm-plan", "--trtllm-config=c.toml"], ["c.toml", "clusters.a.partiton"]),
        ({"c.toml": "[clusters.a]\ntime_limit = 'forever'\n"},
         ["--trtllm-plan", "--trtllm-config=c.toml", "--slurm-cluster=a"],
         ["c.toml", "clusters.a.time_limit", "'forever'"]),
        ({}, ["--trtllm-remote", "--trtllm-config=missing.toml"],
         ["missing.toml", "does not exist"]),
    ],
)
def test_cluster_errors_are_usage_errors(pytester: pytest.Pytester, files: dict[str, str],
                                         args: list[str], needles: list[str]) -> None:
    for name, text in files.items():
        write(pytester.path / name, text)
    pytester.makepyfile("def test_a():\n    pass\n")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "Traceback" not in err + result.stdout.str()
    for needle in needles:
        assert needle in err


def test_cluster_values_reach_the_plan(pytester: pytest.Pytester) -> None:
    write(pytester.path / "trtllm-slurm.toml", GOOD)
    pytester.makepyfile(
        "import pytest\n\n@pytest.mark.skip_less_device(2)\ndef test_a():\n    pass\n"
    )
    result = pytester.runpytest("--trtllm-plan", "--slurm-cluster=dev")
    assert result.ret == 0, result.stderr.str()
    result.stdout.fnmatch_lines(["*test_a: 2 x any GPU = 1 node(s) x 2 -> remote_slurm partition=batch*"])
