import pytest

pytestmark = pytest.mark.skip(reason="module marked skip")


def test_marked_a():
    pass


def test_marked_b():
    pass
