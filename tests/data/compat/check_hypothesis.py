from hypothesis import given, settings
from hypothesis import strategies as st


@settings(derandomize=True, database=None)
@given(st.integers())
def test_falsified(x):
    assert x < 10


@given(st.integers(0, 5))
def test_holds(x):
    assert x >= 0
