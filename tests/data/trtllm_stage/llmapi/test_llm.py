import pytest


@pytest.mark.skip_less_device(1)
@pytest.mark.parametrize("tp", [pytest.param(1, id=""), 2])
def test_generate(tp):
    assert tp in (1, 2)


@pytest.mark.skip_less_device(1)
def test_fails():
    assert 1 + 1 == 3


@pytest.mark.skip_less_device(1)
def test_other_stage_waive():
    pass


@pytest.mark.skip_less_device(1)
@pytest.mark.parametrize("n", range(4))
def test_sharded(n):
    pass
