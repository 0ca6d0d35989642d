"""pytest-timeout limits: a long-limited pair (walltime) and a test the thread method kills."""

import os
import time

import pytest


@pytest.mark.timeout(2400)
def test_long_limit_one():
    assert True


@pytest.mark.timeout(2400)
def test_long_limit_two():
    assert True


def test_t_before():
    assert True


@pytest.mark.timeout(3)
def test_t_sleeper():
    if os.environ.get("TIMEOUT_MODE") == "1":
        time.sleep(60)


def test_t_after_one():
    assert True


def test_t_after_two():
    assert True
