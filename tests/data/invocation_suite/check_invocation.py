"""One test per promise of a dispatched run (see tests/test_invocation_fidelity.py)."""

import time
from pathlib import Path

import pytest


def test_options_reach_the_test(request):
    opt = request.config.getoption
    assert opt("suite_value") == "v 1"
    assert opt("from_ini") == "ini-value"
    assert opt("from_env") == "env-value"
    assert Path(opt("data_file")).read_text().strip() == "payload from a relative path"


@pytest.mark.flaky(reruns=1)
def test_flaky_fails_every_time():
    assert False, "fails every attempt"


def test_fails_every_time():
    assert False, "fails too"


@pytest.mark.parametrize("label", ["hang detected"])
def test_id_names_a_hang_pattern(label):
    time.sleep(1.5)  # the monitor reads the log meanwhile


def test_records_junit(record_xml_attribute, record_testsuite_property, record_property):
    record_xml_attribute("owner", "team-a")
    record_testsuite_property("build", "42")
    record_property("size", "7")
