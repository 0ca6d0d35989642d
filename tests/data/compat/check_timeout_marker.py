import time

import pytest


@pytest.mark.timeout(1)
def test_times_out():
    time.sleep(10)
