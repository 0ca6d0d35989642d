import os


def test_ini_env_is_set():
    assert os.environ["COMPAT_FROM_INI"] == "set-by-pytest-env"
