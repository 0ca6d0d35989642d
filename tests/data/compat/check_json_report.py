import logging
import sys


def test_streams_and_log():
    print("to stdout")
    print("to stderr", file=sys.stderr)
    logging.getLogger("compat").warning("a log record")


def test_metadata(json_metadata, record_property):
    json_metadata["answer"] = 42
    record_property("owner", "team-b")


def test_fails():
    assert [1, 2] == [1, 3]
