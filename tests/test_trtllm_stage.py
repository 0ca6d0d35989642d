"""A TensorRT-LLM-shaped stage (tests/data/trtllm_stage: its conftest conventions, not its
code) run plain and dispatched with its CI command line: the stage prefix on every node id
(a hookwrapper takes it off around its ``yield``), empty parameter ids dropped
(``CallSpec2.id``), a test list that filters and reorders, waives (SKIP, XFAIL,
``full:<stage>/``), ``--regexp``, pytest-split's shard. The dispatched run must read as
the plain one (exit code, summary, every report under the same id, junit) and run each
assigned test once, in the controller's order; a test the worker cannot find fails alone.

local_direct here; the dev cluster's local Slurm in a warm allocation and its sshd in
test_trtllm_stage_cluster.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import pytest_split  # noqa: F401  (the stage shards with it: without it this fails, not skips)
from dispatch_helpers import copy_suite, run_suite
from test_invocation_fidelity import compare, summary

PREFIX = "H100-PyTorch-1"
# what a CI stage types (jenkins/L0_Test.groovy), less its own periodic-junit plugin
STAGE = ["-p", "no:cacheprovider", "-vv", "--timeout-method=thread", "--timeout=3600",
         f"--test-prefix={PREFIX}", "--waives-file=waives.txt", "--test-list=test_list.txt",
         "-o", "junit_logging=out-err"]
SPLIT = ["--splits", "2", "--group", "1", "--splitting-algorithm", "least_duration",
         "--durations-path", ".test_durations"]
LOCAL = ["--trtllm-remote", "--trtllm-dispatch=all", "--trtllm-scenario=local_direct"]


def copy_stage(dest: Path) -> Path:
    return copy_suite("trtllm_stage", dest)


def started_per_batch(suite: Path) -> list[list[str]]:
    """The node ids each batch's worker started, in its order (its reports.jsonl)."""
    batches = []
    for reports in sorted(suite.glob("work_dirs/*/reports.jsonl")):
        records = [json.loads(line) for line in reports.read_text().splitlines() if line]
        batches.append([r["nodeid"] for r in records if r.get("type") == "start"])
    return batches


def assert_same_run(plain, dispatched, suite: Path) -> None:
    """``compare`` (exit code, summary, reports, junit), and each test ran once on a
    worker, in the plain run's order within its batch (the assigned order)."""
    compare(plain, dispatched)
    order = list(plain.outcomes())
    batches = started_per_batch(suite)
    ran = [nodeid for batch in batches for nodeid in batch]
    assert sorted(ran) == sorted(order), (ran, order)
    for batch in batches:
        assert batch == sorted(batch, key=order.index), (batch, order)


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    return copy_stage(tmp_path)


def check_plain_stage(plain) -> None:
    """The plain stage is what the comparisons expect: prefixed ids, the list's order,
    an empty parameter id dropped, waives and the list applied."""
    assert plain.returncode == 1, plain.stdout
    # (pytest 9.2 warns that CallSpec2 is now CallSpec)
    assert summary(plain).startswith("2 failed, 10 passed, 2 skipped, 4 deselected, "
                                     "1 xfailed"), plain.stdout
    ids = list(plain.outcomes())
    assert all(i.startswith(f"{PREFIX}/") for i in ids), ids
    assert ids[0] == f"{PREFIX}/llmapi/test_llm.py::test_fails"  # the list's order
    assert f"{PREFIX}/llmapi/test_llm.py::test_generate[]" in ids  # an empty id dropped
    assert f"{PREFIX}/accuracy/test_accuracy.py::TestLlama::test_dtype[fp8]" in ids


@pytest.mark.parametrize("extra", [[], ["--regexp", "dtype|sharded|waived"], SPLIT],
                         ids=["stage", "regexp", "split"])
def test_a_stage_dispatched_reads_as_the_plain_run(suite: Path, extra: list[str]) -> None:
    plain = run_suite(suite, *STAGE, *extra, tag="plain")
    if not extra:
        check_plain_stage(plain)
    dispatched = run_suite(suite, *STAGE, *extra, *LOCAL, tag="dispatched")
    assert "file or directory not found" not in dispatched.stdout, dispatched.stdout
    assert_same_run(plain, dispatched, suite)


def test_a_stage_with_rootdir_and_ini_named_from_elsewhere_reads_as_the_plain_run(
        suite: Path) -> None:
    """``--rootdir`` and ``-c`` name another directory than the one pytest runs in (a
    sub-directory): the worker finds the tests by their rootdir-relative keys all the
    same."""
    here = suite / "llmapi"
    args = ["--rootdir", "..", "-c", "../pytest.ini",
            *[a.replace("=", "=../") if a.startswith(("--waives", "--test-list")) else a
              for a in STAGE], ".."]
    plain = run_suite(suite, *args, tag="plain", cwd=here)
    check_plain_stage(plain)
    dispatched = run_suite(suite, *args, *LOCAL, tag="dispatched", cwd=here)
    assert_same_run(plain, dispatched, suite)


def test_a_test_the_worker_cannot_find_fails_alone(suite: Path) -> None:
    """The target's code differs: a parameter it does not make (``$DRIFT``) and a file its
    checkout lacks (``$VANISH_FILE``). Those tests fail with the reason; the batch's
    other tests run and pass."""
    env = {"DRIFT": "1", "VANISH_FILE": str(suite / "llmapi" / "test_vanish.py")}
    run = run_suite(suite, "-p", "no:cacheprovider", "-v", f"--test-prefix={PREFIX}",
                    "accuracy/test_drift.py", "llmapi/test_vanish.py",
                    "llmapi/test_llm.py::test_generate", *LOCAL, env=env, tag="missing")
    calls = {n: o for n, r in run.outcomes().items() for w, o in r if w == "call"}
    assert calls == {
        f"{PREFIX}/accuracy/test_drift.py::test_drift[kept]": "passed",
        f"{PREFIX}/accuracy/test_drift.py::test_drift[gone]": "failed",
        f"{PREFIX}/llmapi/test_vanish.py::test_vanished": "failed",
        f"{PREFIX}/llmapi/test_llm.py::test_generate[]": "passed",
        f"{PREFIX}/llmapi/test_llm.py::test_generate[2]": "passed",
    }, run.stdout
    assert summary(run).startswith("2 failed, 3 passed"), run.stdout
    for gone in ("accuracy/test_drift.py::test_drift[gone]", "llmapi/test_vanish.py::test_vanished"):
        assert f"the target could not collect {PREFIX}/{gone}" in run.stdout, run.stdout
    assert "file or directory not found" not in run.stdout
    assert "INTERNALERROR" not in run.stdout
