import os


def test_patch(mocker):
    mocker.patch("os.getcwd", return_value="/mocked")
    assert os.getcwd() == "/mocked"


def test_spy(mocker):
    spy = mocker.spy(os.path, "join")
    os.path.join("a", "b")
    assert spy.call_count == 1
