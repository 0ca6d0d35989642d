"""The hot calls the W3 profile named (issue 30), per call, old path vs new: the CPU
microseconds of one call (median of 5 runs of 20,000, ``time.process_time``), a figure that
holds on a loaded machine where whole-run CPU figures vary by 10-20% run to run.

    python benchmarks/bench_hot_calls.py
"""

from __future__ import annotations

import statistics
import time
import timeit
import unicodedata
from typing import Any

from pytest_trtllm_slurm.planning import safe_values
from pytest_trtllm_slurm.transport.shell import LocalShell, PushingShell

WORD = "/work/suite/tests/test_w3.py::test_gpu16[123]"


def per_call(stmt: str, names: dict[str, Any], number: int = 20000) -> float:
    runs = []
    for _ in range(5):
        start = time.process_time()
        timeit.timeit(stmt, number=number, globals=names)
        runs.append((time.process_time() - start) / number * 1e6)
    return statistics.median(runs)


def old_control_chars(value: str) -> list[str]:
    """control_chars without its ASCII fast path: a category look per character."""
    found = []
    for ch in value:
        if unicodedata.category(ch) in ("Cc", "Zl", "Zp") or ch in safe_values._BIDI:
            found.append(repr(ch)[1:-1])
    return list(dict.fromkeys(found))


def main() -> None:
    shell = LocalShell()
    print("| call | CPU us per call |\n|---|---|")
    print(f"| isinstance(LocalShell(), PushingShell) (the monitor did it per read) | "
          f"{per_call('isinstance(s, P)', {'s': shell, 'P': PushingShell}):.2f} |")
    print(f"| control_chars({len(WORD)}-char ASCII word), per-character loop | "
          f"{per_call('f(w)', {'f': old_control_chars, 'w': WORD}):.2f} |")
    print(f"| control_chars, the same word, ASCII fast path | "
          f"{per_call('f(w)', {'f': safe_values.control_chars, 'w': WORD}):.2f} |")


if __name__ == "__main__":
    main()
