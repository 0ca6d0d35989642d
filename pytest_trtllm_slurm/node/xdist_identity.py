"""xdist's ``worker_id`` and ``testrun_uid`` for a test dispatched from an xdist worker.

Under ``pytest -n N`` the dispatching process is an xdist worker: a test it sends to a
target sees that worker's ``worker_id`` and ``testrun_uid`` (the controller puts them in
``PYTEST_XDIST_*``, read when the fixture runs: a served session's batches may come from
different xdist workers). Without them, xdist's own answers.

Module-level functions, registered as this module (``worker.pytest_configure``): pytest 9
deprecates session-scoped fixtures defined as instance methods (``PytestRemovedIn10Warning``)
and pytest 10 refuses them, while plain functions are what every pytest accepts.
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
