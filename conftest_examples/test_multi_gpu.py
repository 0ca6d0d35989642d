"""Tests needing 4 and 8 devices, multi-node MPI, and an explicit trtllm_slurm marker."""

import pytest


@pytest.mark.skip_less_device(4)
@pytest.mark.parametrize("tp", [2, 4])
def test_tensor_parallel(tp, device_count):
    assert device_count >= 4 and tp <= device_count


@pytest.mark.skip_less_device(8)
def test_eight_gpus(device_count):
    assert device_count >= 8


@pytest.mark.skip_less_mpi_world_size(8)
def test_multi_node_allreduce():
    """8 ranks; may span nodes (2 x 4 GPUs on a 4-GPU-per-node cluster)."""


@pytest.mark.skip_device_not_contain(["H100", "H200"])
@pytest.mark.skip_less_device(4)
def test_hopper_only(device_count):
    assert device_count >= 4


@pytest.mark.trtllm_slurm(devices=8, nodes=2, time_limit="30m", env={"NCCL_DEBUG": "WARN"})
def test_explicit_two_nodes(device_count):
    """Runs anywhere locally (no skip fixture reads trtllm_slurm); the plan shows 2 x 4."""
    assert device_count >= 0
