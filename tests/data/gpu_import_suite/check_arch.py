"""Skips itself at import on an architecture it does not support (as some TensorRT-LLM
modules do): which tests exist depends on the GPU of the node that collects."""

import pytest
from conftest import get_sm_version

if get_sm_version() >= 100:
    pytest.skip("Hopper only", allow_module_level=True)


@pytest.mark.skip_less_device(1)
def test_hopper_only():
    pass
