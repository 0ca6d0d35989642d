"""Tests that kill, hang or stall the worker process, to exercise the controller."""

import os
import time


def test_before():
    assert True


def test_crash():
    if os.environ.get("CRASH_MODE") == "crash":
        os._exit(3)


def test_hang():
    if os.environ.get("CRASH_MODE") == "hang":
        print("Hang detected after 5 seconds.", flush=True)
        time.sleep(120)


def test_slow():
    if os.environ.get("CRASH_MODE") == "timeout":
        time.sleep(120)


def test_after_one():
    assert True


def test_after_two():
    assert True
