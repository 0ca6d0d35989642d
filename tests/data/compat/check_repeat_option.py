def test_repeated():
    pass
