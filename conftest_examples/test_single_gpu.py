"""Tests needing 0 or 1 device, and a class whose method overrides the class marker."""

import pytest


def test_no_device_needed():
    assert sum(range(4)) == 6


@pytest.mark.skip_less_device(1)
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp8"])
def test_one_gpu(dtype, device_count):
    assert device_count >= 1
    assert dtype.startswith(("fp", "bf"))


@pytest.mark.skip_less_device(1)
class TestOneGpuClass:
    def test_inherits_class_marker(self, device_count):
        assert device_count >= 1

    @pytest.mark.skip_less_device(4)  # closest marker wins: this one needs 4
    def test_method_marker_wins(self, device_count):
        assert device_count >= 4

    @pytest.mark.skip_less_device_memory(80000)
    def test_big_memory(self, device_count):
        assert device_count >= 1
