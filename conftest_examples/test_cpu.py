"""CPU tests: no marker, the plugin leaves them where they are."""

import json

import pytest


def test_json_round_trip():
    data = {"tp": 4, "pp": 2}
    assert json.loads(json.dumps(data)) == data


@pytest.mark.parametrize("text, words", [("a b", 2), ("", 0), ("x  y z", 3)])
def test_word_count(text, words):
    assert len(text.split()) == words
