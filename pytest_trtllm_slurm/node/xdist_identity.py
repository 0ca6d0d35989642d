"""xdist's ``worker_id`` and ``testrun_uid`` for a test dispatched from an xdist worker
(``PYTEST_XDIST_*``, read when the fixture runs: a session's batches may come from
different workers); without them, xdist's own. Module-level functions: pytest 10 refuses
session-scoped fixtures defined as instance methods.
"""

from __future__ import annotations

import os
import uuid

import pytest


@pytest.fixture(scope="session")
def worker_id() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER") or "master"


@pytest.fixture(scope="session")
def testrun_uid() -> str:
    return os.environ.get("PYTEST_XDIST_TESTRUNUID") or uuid.uuid4().hex
