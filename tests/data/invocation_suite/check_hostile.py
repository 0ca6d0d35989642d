"""A test that writes into its batch's reports.jsonl (HOSTILE_LINE); plain runs pass."""

import os


def test_before():
    pass


def test_hostile(hostile_line):
    hostile_line(os.environ.get("HOSTILE_LINE", ""))


def test_after():
    pass
