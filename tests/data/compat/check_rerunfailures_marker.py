import os
from pathlib import Path

import pytest


@pytest.mark.flaky(reruns=1)
def test_always_fails():
    assert False, "fails every attempt"


@pytest.mark.flaky(reruns=2)
def test_passes_on_its_second_attempt():
    marker = Path(os.environ["COMPAT_STATE"]) / "marker-attempt"
    if not marker.exists():
        marker.write_text("1")
        assert False, "first attempt"
