"""A sample suite covering every report shape pytest produces."""

import logging
import sys
import warnings

import pytest

log = logging.getLogger("sample")


def test_pass():
    assert 1 + 1 == 2


def test_fail_with_diff():
    assert [1, 2, 3, {"a": 1}] == [1, 2, 4, {"a": 2}]


def test_error_in_setup(broken_setup):
    pass


def test_error_in_teardown(broken_teardown):
    assert broken_teardown == 42


@pytest.mark.skip(reason="skipped by marker")
def test_skip_marker():
    pass


def test_skip_inside():
    pytest.skip("skipped from inside")


@pytest.mark.xfail(reason="known bug")
def test_xfail():
    assert 0


@pytest.mark.xfail(reason="should fail", strict=True)
def test_xpass_strict():
    pass


@pytest.mark.xfail(reason="lenient")
def test_xpass_lenient():
    pass


@pytest.mark.parametrize(
    "value",
    ["it's", 'say "hi"', "$(touch MARKER_PATH)", "`id`", "a;b", "with space", "new\nline", "héllo 日本", "x::y", "[b]"],
)
def test_weird_ids(value):
    assert value != "never"


class TestGroup:
    def test_method_pass(self, resource):
        print("inside method")
        assert resource["value"] == 7

    def test_method_fail(self, resource):
        print("to stdout")
        sys.stderr.write("to stderr\n")
        log.warning("a log record")
        assert resource["value"] == 8, "value mismatch"


def test_captured_output():
    print("hello stdout")
    sys.stderr.write("hello stderr\n")
    log.error("logged error")
    assert False


def test_warning():
    warnings.warn("careful now", UserWarning)


def _inner():
    raise KeyError("inner")


def test_chained_exception():
    try:
        _inner()
    except KeyError as exc:
        raise ValueError("outer") from exc


def test_implicit_chain():
    try:
        _inner()
    except KeyError:
        raise RuntimeError("during handling")
