"""What a test sees of pytest-xdist (tests/test_invocation_fidelity.py compares)."""

import json
import os
from pathlib import Path

import pytest


@pytest.mark.parametrize("n", range(6))
def test_xdist_identity(n, worker_id, testrun_uid):
    seen = {"worker_id": worker_id, "testrun_uid": testrun_uid,
            **{k: v for k, v in os.environ.items() if k.startswith("PYTEST_XDIST_")}}
    Path(os.environ["IDENTITY_DIR"], f"{n}.json").write_text(json.dumps(seen))
