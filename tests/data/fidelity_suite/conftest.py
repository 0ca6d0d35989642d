"""Fixtures of the fidelity sample suite."""

import pytest


@pytest.fixture
def broken_setup():
    raise RuntimeError("setup exploded")


@pytest.fixture
def broken_teardown():
    yield 42
    raise RuntimeError("teardown exploded")


@pytest.fixture
def resource():
    print("resource setup output")
    yield {"value": 7}
    print("resource teardown output")
