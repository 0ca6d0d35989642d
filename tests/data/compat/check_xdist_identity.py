import os


def test_sees_its_xdist_worker(worker_id, testrun_uid):
    assert worker_id.startswith("gw"), worker_id
    assert os.environ.get("PYTEST_XDIST_WORKER") == worker_id
    assert os.environ.get("PYTEST_XDIST_TESTRUNUID") == testrun_uid
