import pytest


@pytest.mark.dependency()
def test_base_fails():
    assert False


@pytest.mark.dependency()
def test_base_passes():
    pass


@pytest.mark.dependency(depends=["test_base_fails"])
def test_needs_the_failed_one():
    pass


@pytest.mark.dependency(depends=["test_base_passes"])
def test_needs_the_passed_one():
    pass
