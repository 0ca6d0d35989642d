import os
from pathlib import Path


def test_passes_on_its_second_attempt():
    marker = Path(os.environ["COMPAT_STATE"]) / "option-attempt"
    if not marker.exists():
        marker.write_text("1")
        assert False, "first attempt"
