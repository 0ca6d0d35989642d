import os
import signal

import pytest


@pytest.mark.forked
def test_crashes_in_its_fork():
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.forked
def test_passes_in_its_fork():
    assert os.getpid()
