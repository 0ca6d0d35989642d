"""A suite for the test-db stage (tests/data/test_db/l0_dev.yml): each test checks that it
runs where its block says: GPU type (the node's name: n* = h200, g* = gb200), GPU count,
node count."""

import os

import pytest


def where():
    gpus = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
    return (os.environ.get("SLURMD_NODENAME", "here")[:1], len(gpus),
            os.environ.get("SLURM_JOB_NUM_NODES"))


def test_four_h200():
    assert where() == ("n", 4, "1"), where()


class TestParams:
    @pytest.mark.parametrize("p", ["a", "b"])
    def test_param(self, p):
        assert where() == ("n", 4, "1"), where()


def test_one_gb200():
    assert where() == ("g", 1, "1"), where()


def test_two_nodes():
    assert where() == ("n", 4, "2"), where()


def test_post_merge_only():
    raise AssertionError("not in the pre-merge stage")


def test_needs_b300():
    raise AssertionError("no cluster has b300")


def test_tensorrt_backend():
    assert where() == ("n", 4, "1"), where()


def test_not_listed():
    raise AssertionError("in no block")
