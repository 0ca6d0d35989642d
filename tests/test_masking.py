"""Secrets by name and by value: what job_spec.json and the re-run lines may show."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from pytest_trtllm_slurm.planning.jobspec import JobSpec
from pytest_trtllm_slurm.planning.masking import is_secret_name, mask_env, mask_text
from pytest_trtllm_slurm.planning.models import Scenario

SECRET_NAMES = ["HF_TOKEN", "GITHUB_PAT", "GH_PAT", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD",
                "NETRC_PASSWD", "API_KEY", "OPENAI_APIKEY", "MY_CREDENTIAL", "GOOGLE_CREDENTIALS",
                "BASIC_AUTH", "OAUTH_CLIENT", "JFROG_COOKIE", "BROWSER_SESSION", "TRTLLM_SLURM_OTP",
                "githubToken", "hfToken", "SMTP_PASS", "NGC_API_KEY", "CI_JOB_TOKEN"]
PLAIN_NAMES = ["PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "KEYBOARD", "KEYBOARD_LAYOUT",
               "TOKENIZERS_PARALLELISM", "AUTHOR", "PWD", "HOME", "CUDA_VISIBLE_DEVICES",
               "PATCH_LEVEL", "PASSTHROUGH", "SPATH", "LLM_MODELS_ROOT", "OMP_NUM_THREADS",
               # they say where something is, and change with every login
               "SSH_AUTH_SOCK", "SSL_KEY_FILE", "XDG_SESSION_ID", "XDG_SESSION_TYPE",
               "DBUS_SESSION_BUS_ADDRESS", "SESSION_MANAGER"]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", PLAIN_NAMES)
def test_plain_names_are_not_secrets(name: str) -> None:
    assert not is_secret_name(name)


def test_credentials_in_values_are_hidden() -> None:
    env = mask_env({
        "HTTPS_PROXY": "http://alice:s3cr3t@proxy.corp:3128",
        "PIP_INDEX_URL": "https://__token__:pypi-AgEIcHlwaS5vcmc@pypi.corp/simple",
        "REPO": "https://ghp_0123456789abcdefghijABCDEFGHIJ@github.com/o/r.git",
        "SOME_VALUE": "hf_0123456789abcdefghijABCDEFGH",
        "NO_PROXY": "localhost,127.0.0.1",
        "GIT_URL": "ssh://git@github.com/o/r.git",
    })
    text = json.dumps(env)
    for secret in ("s3cr3t", "pypi-AgEIcHlwaS5vcmc", "ghp_0123", "hf_0123"):
        assert secret not in text
    assert env["HTTPS_PROXY"] == "http://alice:***@proxy.corp:3128"  # still says which proxy
    assert env["NO_PROXY"] == "localhost,127.0.0.1"
    assert env["GIT_URL"] == "***"  # not on the allow-list of what may be shown
    assert mask_text("fetch http://u:pw@h/x failed") == "fetch http://u:***@h/x failed"


def test_job_spec_json_holds_no_secret(tmp_path: Path) -> None:
    spec = JobSpec(scenario=Scenario.LOCAL_DIRECT, name="b", job_name="t.b", rootdir=str(tmp_path),
                   work_dir=str(tmp_path / "w"), log_path=str(tmp_path / "w/log"),
                   reports_path=str(tmp_path / "w/r.jsonl"),
                   env={"HTTPS_PROXY": "http://user:hunter2@proxy:3128", "GITHUB_PAT": "pat-value-1",
                        "KEYBOARD": "us", "PATH": "/usr/bin"})
    path = spec.write()
    text = path.read_text()
    assert "hunter2" not in text and "pat-value-1" not in text
    written = JobSpec.read(path).env
    assert written["KEYBOARD"] == "***" and written["PATH"] == "/usr/bin"  # an allow-list
    assert written["GITHUB_PAT"] == "***"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
