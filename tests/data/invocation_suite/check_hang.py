"""A test that says it hangs (what the hang scan must still see among pytest's -v lines)."""

import time


def test_says_it_hangs():
    print("the test says: hang detected", flush=True)
    time.sleep(120)
