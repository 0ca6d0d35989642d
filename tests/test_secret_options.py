"""Secrets given as options stay in memory (issue 29, item 5): PYTEST_ADDOPTS reaches the
worker as the variable it was (not as argv: ``ps`` on the node, job_spec.json and the
"re-run:" line would show it); option values are masked by the option's name; what may be
shown of an environment is an allow-list; cloud credential files are not shipped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_trtllm_slurm.execution.remote.secret_files import looks_secret
from pytest_trtllm_slurm.planning.jobspec import JobSpec
from pytest_trtllm_slurm.planning.masking import is_secret, mask_argv, mask_env
from pytest_trtllm_slurm.planning.models import Scenario
from pytest_trtllm_slurm.transport.command_log import masked_argv

TOKEN = "s3cr3t-0ption-value"
DISPATCH = ["--trtllm-remote", "--trtllm-dispatch=all", "--trtllm-scenario=local_direct"]

CONFTEST = '''
def pytest_addoption(parser):
    parser.addoption("--api-token", default=None)
'''
SUITE = '''
import json, os

def test_sees_the_token(request):
    with open(os.environ["SEEN_FILE"], "a") as fh:
        fh.write(json.dumps({"option": request.config.getoption("--api-token"),
                             "cmdline": open("/proc/self/cmdline").read(),
                             "addopts": os.environ.get("PYTEST_ADDOPTS")}) + "\\n")
    assert False, "fails, so that the run prints its re-run line"
'''


def test_pytest_addopts_reaches_the_worker_as_a_variable_not_argv(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(CONFTEST)
    (suite / "test_tok.py").write_text(SUITE)
    seen = tmp_path / "seen.jsonl"
    env = {**os.environ, "PYTEST_ADDOPTS": f"--api-token={TOKEN} -x", "SEEN_FILE": str(seen)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                           "-rA", *DISPATCH], cwd=suite, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    (record,) = [json.loads(line) for line in seen.read_text().splitlines()]
    assert record["option"] == TOKEN  # the test got the option, as in a plain run
    assert TOKEN not in record["cmdline"]  # but not as argv of the worker (ps)
    assert record["addopts"] == f"--api-token={TOKEN}"  # -x is the controller's
    assert "re-run" in out and TOKEN not in out
    specs = list(suite.rglob("job_spec.json"))
    assert specs and all(TOKEN not in p.read_text() for p in specs)


def test_option_values_are_masked_by_the_option_name(tmp_path: Path) -> None:
    argv = ["pytest", "--password", "hunter2", "--api-token=tok-1", "--hf_token", "tok-2",
            "-k", "visible", "--key-file", "/keys/id", "-o", "cache_dir=/c"]
    shown = mask_argv(argv)
    assert shown == ["pytest", "--password", "***", "--api-token=***", "--hf_token", "***",
                     "-k", "visible", "--key-file", "/keys/id", "-o", "cache_dir=/c"]
    line = masked_argv(argv)
    assert "hunter2" not in line and "tok-1" not in line and "tok-2" not in line
    spec = JobSpec(scenario=Scenario.LOCAL_DIRECT, name="b", job_name="t.b",
                   rootdir=str(tmp_path), work_dir=str(tmp_path / "w"),
                   log_path=str(tmp_path / "w/log"), reports_path=str(tmp_path / "w/r.jsonl"),
                   command=argv, rerun_argv=argv)
    text = spec.write().read_text()
    assert "hunter2" not in text and "tok-1" not in text and "tok-2" not in text


@pytest.mark.parametrize("name", ["SSHPASS", "MYSQL_PWD", "CI_JOB_JWT", "SENTRY_DSN",
                                  "SLACK_WEBHOOK_URL", "DATABASE_URL", "SOME_NEW_THING"])
def test_only_what_is_allowed_is_shown(name: str) -> None:
    """What the name rule misses is still hidden: only allowed names are shown."""
    assert mask_env({name: "value-1", "CUDA_VISIBLE_DEVICES": "0,1"}) == {
        name: "***", "CUDA_VISIBLE_DEVICES": "0,1"}


@pytest.mark.parametrize("name", ["SSHPASS", "MYSQL_PWD", "CI_JOB_JWT", "SENTRY_DSN",
                                  "SLACK_WEBHOOK_URL"])
def test_secret_names_the_old_rule_missed(name: str) -> None:
    """Never written to a file (mailboxes): the name rule knows them now."""
    assert is_secret(name, "x")


@pytest.mark.parametrize("path", ["gha-creds-1a2b3c.json", "application_default_credentials.json",
                                  "client_secret_1234.apps.googleusercontent.com.json",
                                  "key.json", "deploy/sa-key.json"])
def test_cloud_credential_files_are_not_shipped(path: str) -> None:
    assert looks_secret(path)
