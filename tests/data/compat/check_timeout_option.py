import time


def test_times_out_by_the_option():
    time.sleep(3)
