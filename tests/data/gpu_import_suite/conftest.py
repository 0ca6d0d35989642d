"""A conftest shaped like TensorRT-LLM's ``tests/integration/defs/conftest.py`` (its conventions,
not its code): importing it needs a GPU, because module-level ``skipif`` markers ask
``nvidia-smi`` for the GPU's architecture through a shell (``check_output``); without one the
import raises ``CalledProcessError`` (exit status 127). Its own options (``--test-list``,
``--waives-file``, ``--output-dir``, ``--test-prefix``, ...) select, reorder and waive tests
at collection, and put the stage name before every node id.

On the dev cluster the only ``nvidia-smi`` is a FAKE one (it lists the GPUs Slurm gave the job),
put on the PATH of jobs by the cluster's TaskProlog; the machine that runs the test suite has
none, as a laptop or a CPU-only CI agent.
"""

import os
import subprocess
from pathlib import Path

import pytest


def get_gpu_name() -> str:
    # a shell, as TensorRT-LLM's conftest (a constant command: nothing user-given in it)
    out = subprocess.check_output("nvidia-smi --query-gpu=name --format=csv,noheader",  # noqa: S602
                                  shell=True, text=True)
    return out.strip().splitlines()[0]


def get_sm_version() -> int:
    name = get_gpu_name()
    return 100 if "GB200" in name else 90 if ("H200" in name or "H100" in name) else 80


def llm_models_root() -> Path:
    root = Path(os.environ.get("LLM_MODELS_ROOT", "/nonexistent/llm-models"))
    assert root.exists(), "You shall set LLM_MODELS_ROOT env to run this test"
    return root


skip_pre_hopper = pytest.mark.skipif(get_sm_version() < 90,
                                     reason="not supported in pre-Hopper architecture")
skip_post_blackwell = pytest.mark.skipif(get_sm_version() >= 100,
                                         reason="not supported in post-Blackwell architecture")


def pytest_addoption(parser):
    parser.addoption("--test-list", "-F", action="store", default=None,
                     help="file of the tests to run, in that order")
    parser.addoption("--waives-file", "-S", action="store", default=None,
                     help="file of waived tests: <id> SKIP (reason)")
    parser.addoption("--output-dir", "-O", action="store", default=None,
                     help="where tests write their output")
    parser.addoption("--test-prefix", "-P", action="store", default=None,
                     help="the stage name, put before every node id (junit buckets by it)")
    parser.addoption("--perf", action="store_true", help="run perf tests")
    parser.addoption("--perf-log-formats", action="append", default=[],
                     help="yaml or csv (repeatable)")


def _lines(path):
    return [line.strip() for line in Path(path).read_text().splitlines()
            if line.strip() and not line.startswith("#")]


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_collection_modifyitems(session, config, items):
    test_list = config.getoption("--test-list")
    if test_list:
        wanted = _lines(test_list)
        by_id = {item.nodeid: item for item in items}
        selected = [by_id[n] for n in wanted if n in by_id]
        deselected = [item for item in items if item.nodeid not in wanted]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
        items[:] = selected
    waives = config.getoption("--waives-file")
    if waives:
        for line in _lines(waives):
            nodeid, _, reason = line.partition(" SKIP ")
            for item in items:
                if item.nodeid == nodeid:
                    item.add_marker(pytest.mark.skip(reason=reason.strip("() ") or "waived"))
    yield
    prefix = config.getoption("--test-prefix")
    for item in items if prefix else ():
        _set_nodeid(item, f"{prefix}/{item.nodeid}")


def _set_nodeid(item, nodeid):
    """``item._nodeid = nodeid`` as TensorRT-LLM writes it (pytest 8, 9.0, 9.1); pytest keeps the
    id in ``item._id`` from 9.2."""
    if hasattr(item, "_nodeid"):  # a slot of Node before pytest 9.2
        item._nodeid = nodeid
    else:
        from _pytest.nodeid import NodeId

        item._id = NodeId.parse(nodeid)


@pytest.fixture
def output_dir(request):
    return request.config.getoption("--output-dir")
