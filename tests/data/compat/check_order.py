import pytest


@pytest.mark.order(3)
def test_third():
    pass


@pytest.mark.order(1)
def test_first():
    pass


@pytest.mark.order(2)
def test_second():
    pass
