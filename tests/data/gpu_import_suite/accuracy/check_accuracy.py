"""Reads its model path at import, as TensorRT-LLM's test modules do (``llm_models_root()``)."""

import os

import pytest
from conftest import llm_models_root, skip_post_blackwell, skip_pre_hopper

MODEL_DIR = llm_models_root() / "llama-3.1-8b"


@skip_pre_hopper
@pytest.mark.skip_less_device(1)
def test_llama_fp8():
    assert os.environ.get("CUDA_VISIBLE_DEVICES"), "no GPU given to the test"


@skip_post_blackwell
@pytest.mark.skip_less_device(2)
@pytest.mark.parametrize("tp", [1, 2], ids=["tp1", "tp2"])
def test_llama_tp(tp):
    assert tp <= len(os.environ["CUDA_VISIBLE_DEVICES"].split(","))


@pytest.mark.skip_less_device(1)
@pytest.mark.timeout(600)
def test_llama_fails():
    assert MODEL_DIR.name == "wrong-model", "accuracy below threshold"


@pytest.mark.skip_less_device(1)
def test_llama_waived():
    raise AssertionError("waived: never runs")


class TestLlama:
    @pytest.mark.skip_less_device(1)
    def test_in_class(self, output_dir):
        assert output_dir, "--output-dir reached the test"
