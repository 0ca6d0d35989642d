"""xdist's ``worker_id`` and ``testrun_uid`` for a test dispatched from an xdist worker, read
when the fixture runs (module-level: pytest 10 refuses session fixtures as methods)."""

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
