import sys

import pytest


def test_prints_and_records(record_property):
    record_property("owner", "team-a")
    print("to stdout")
    print("to stderr", file=sys.stderr)


def test_fails():
    assert 1 + 1 == 3


@pytest.mark.skip(reason="not today")
def test_skipped():
    pass


@pytest.mark.xfail(reason="known bug")
def test_xfails():
    assert False


def test_has_an_extra(extras):
    import pytest_html

    extras.append(pytest_html.extras.text("some text", name="note"))
