"""Tests that write under --output-dir, in two batch shapes (1 and 2 GPUs)."""

import os

import pytest


def _write(output_dir, name, text):
    folder = os.path.join(output_dir, name)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "log.txt"), "w") as fh:
        fh.write(text)


def _shared(output_dir, who):
    if os.environ.get("OUTPUT_CONFLICT") == "1":
        with open(os.path.join(output_dir, "shared.txt"), "w") as fh:
            fh.write(f"written by {who}\n")


@pytest.mark.skip_less_device(1)
def test_one_a(output_dir):
    _write(output_dir, "one_a", "one a\n")
    _shared(output_dir, "one_a")


@pytest.mark.skip_less_device(1)
def test_one_b(output_dir):
    _write(output_dir, "one_b", "one b\n" * 1000)


@pytest.mark.skip_less_device(1)
def test_one_fails(output_dir):
    _write(output_dir, "one_fails", "about to fail\n")
    assert 1 == 2, "wrong answer"


@pytest.mark.skip_less_device(2)
def test_two_a(output_dir):
    _write(output_dir, os.path.join("two", "nested"), "two a\n")
    _shared(output_dir, "two_a")


@pytest.mark.skip_less_device(2)
def test_two_skips(output_dir):
    pytest.skip("not on this machine")
