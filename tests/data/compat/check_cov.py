import mymod


def test_covered():
    assert mymod.covered(1) == "positive"
