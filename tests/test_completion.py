"""``trtllm-slurm completion bash``: the script, loaded into a real bash, completes what the
parser has (subcommands, options, an option's fixed values) and nothing else."""
from __future__ import annotations

import subprocess
import sys

import pytest

from pytest_trtllm_slurm.cli.main import build_parser


@pytest.fixture(scope="module")
def script() -> str:
    run = subprocess.run([sys.executable, "-m", "pytest_trtllm_slurm", "completion", "bash"],
                         capture_output=True, text=True, timeout=60, check=True)
    return run.stdout


def complete(script: str, *words: str) -> list[str]:
    """COMPREPLY for ``trtllm-slurm <words>`` with the cursor on the last word."""
    line = " ".join(["trtllm-slurm", *words])
    driver = (script + "\nCOMP_WORDS=(trtllm-slurm \"$@\"); COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))"
              "\n_trtllm_slurm\nprintf '%s\\n' \"${COMPREPLY[@]}\"\n")
    run = subprocess.run(["bash", "-c", driver, "bash", *words], capture_output=True,
                         text=True, timeout=30)
    assert run.returncode == 0, (line, run.stderr)
    return sorted(w for w in run.stdout.splitlines() if w)


def test_subcommands_from_the_parser(script: str) -> None:
    parser_commands = set(build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    assert set(complete(script, "")) - {"-h", "--help"} == parser_commands
    assert complete(script, "al") == ["alloc"]
    assert complete(script, "alloc", "") == ["--help", "-h", "release", "status"]


def test_options_and_their_values(script: str) -> None:
    assert "--json" in complete(script, "alloc", "status", "--")
    assert "--json" not in complete(script, "alloc", "release", "--")
    assert complete(script, "env", "--format", "") == ["json", "text"]
    assert complete(script, "run", "--scenario", "local_") == [
        "local_direct", "local_docker", "local_slurm"]
    assert complete(script, "completion", "") == ["--help", "-h", "bash"]


def test_a_hostile_word_is_only_text(script: str, tmp_path) -> None:
    """What the user typed is matched, never run."""
    marker = tmp_path / "PWNED"
    assert complete(script, f"$(touch {marker})", "") == complete(script, "")
    assert complete(script, f"`touch {marker}`") == []
    assert not marker.exists()
