"""paramiko is imported without invoke (on a remote run's critical path), and an ssh config's
``Match exec`` lines still work: invoke is imported when a config file has one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PROBE = """
import json, sys
from pytest_trtllm_slurm.transport.ssh import shells  # what a remote run imports first
from pytest_trtllm_slurm.transport.ssh.target import lookup_ssh_config
seen = {"after_import": "invoke" in sys.modules}
seen["plain"] = lookup_ssh_config("plainhost", sys.argv[1])
seen["after_plain"] = "invoke" in sys.modules
seen["matched"] = lookup_ssh_config("somehost", sys.argv[2])
seen["after_match"] = "invoke" in sys.modules
import invoke  # anyone else's import of it works
seen["invoke_usable"] = callable(invoke.run)
print(json.dumps(seen))
"""


def test_paramiko_comes_without_invoke_until_a_config_runs_match_exec(tmp_path: Path) -> None:
    plain = tmp_path / "plain_config"
    plain.write_text("Host plainhost\n    HostName 10.0.0.1\n")
    matched = tmp_path / "match_config"
    matched.write_text(
        'Match host somehost exec "test -d /"\n    HostName 10.0.0.2\n'
        'Match host somehost exec "test -d /no/such/dir"\n    Port 2200\n'
        "Host *\n    User someone\n")
    out = subprocess.run([sys.executable, "-c", PROBE, str(plain), str(matched)],
                         capture_output=True, text=True, check=False, timeout=60)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["after_import"] is False  # ~45 ms not spent before the connection starts
    assert seen["plain"]["hostname"] == "10.0.0.1"
    assert seen["after_plain"] is False
    # the exec that succeeds applies, the one that fails does not: invoke ran them
    assert seen["matched"]["hostname"] == "10.0.0.2"
    assert "port" not in seen["matched"] and seen["matched"]["user"] == "someone"
    assert seen["after_match"] is True and seen["invoke_usable"] is True
