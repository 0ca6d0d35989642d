"""Thousands of dispatched tests read exactly like the plain run: every report, in order.

The replay of a big batch goes through many reads of reports.jsonl (a read stops at 1 MiB,
mid-line) and shares strings between a replayed report and its item (issue 21, 100,000
items): what a user sees must not change. Every test is reported once, its phases in the
plain run's order, with the same outcome, location and keywords, and the junit XML has the
same testcases.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from dispatch_helpers import junit_cases, run_suite

DISPATCH = ["--trtllm-remote", "--trtllm-dispatch=all", "--trtllm-scenario=local_direct"]
TESTS = 3000  # about 3.5 MiB of reports: several reads, lines cut at each read's end
SUITE = '''import pytest


@pytest.mark.slow_marker
@pytest.mark.parametrize("i", range({n}))
def test_item(i):
    if i % 997 == 5:
        pytest.skip("every 997th skips")
    assert i % 1499 != 7, "every 1499th fails"
'''


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory):
    suite = tmp_path_factory.mktemp("many")
    (suite / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow_marker: a keyword\n")
    (suite / "test_many.py").write_text(SUITE.format(n=TESTS))
    # side by side: the runs share nothing but the suite's files (their reports, junit files
    # and the dispatched run's work_dirs are their own), and each is mostly one busy CPU
    with ThreadPoolExecutor(2) as pool:
        plain = pool.submit(run_suite, suite, "-p", "no:cacheprovider", tag="plain",
                            timeout=900)
        dispatched = pool.submit(run_suite, suite, "-p", "no:cacheprovider", *DISPATCH,
                                 tag="dispatched", timeout=900)
        return plain.result(), dispatched.result()


def _phases(reports: list[dict]) -> list[tuple[str, str, str]]:
    return [(r["nodeid"], r["when"], r["outcome"]) for r in reports]


def test_every_report_in_the_plain_order(runs) -> None:
    plain, dispatched = runs
    assert plain.returncode == 1, plain.stdout[-2000:]
    assert dispatched.returncode == plain.returncode, dispatched.stdout[-3000:]
    assert len(plain.reports) == 3 * TESTS
    assert _phases(dispatched.reports) == _phases(plain.reports)
    outcomes = {o for _, when, o in _phases(plain.reports) if when == "call"}
    assert outcomes == {"passed", "failed", "skipped"}


def test_locations_and_keywords_are_the_items_own(runs) -> None:
    plain, dispatched = runs
    for ours, theirs in zip(dispatched.reports, plain.reports, strict=True):
        assert ours["location"] == theirs["location"], ours["nodeid"]
        assert sorted(ours["keywords"]) == sorted(theirs["keywords"]), ours["nodeid"]
    assert "slow_marker" in dispatched.reports[0]["keywords"]


def test_junit_testcases_match(runs) -> None:
    plain, dispatched = runs
    cases = junit_cases(dispatched.junit)
    assert len(cases) == TESTS
    assert cases == junit_cases(plain.junit)


def test_summary_line_matches(runs) -> None:
    plain, dispatched = runs

    def closing(out: str) -> str:
        line = [x for x in out.splitlines() if x.startswith("=") and " in " in x][-1]
        return line.split(" in ")[0]

    assert closing(dispatched.stdout) == closing(plain.stdout)
    assert f"2 failed, {TESTS - 6} passed, 4 skipped" in closing(plain.stdout)


def test_the_work_dir_holds_one_batch(runs) -> None:
    _, dispatched = runs
    suite = Path(dispatched.junit).parent
    batches = [d for d in (suite / "work_dirs").iterdir() if (d / "reports.jsonl").exists()]
    assert len(batches) == 1
    assert (batches[0] / "reports.jsonl").stat().st_size > 3 * (1 << 20)
