#!/usr/bin/env python3
"""What the one atomic-write helper costs per file: ``node.files.write_atomic`` (temp file,
fsync, rename, fsync of the folder) against the rename-only write several modules made by
hand before it (temp file, rename; no fsync), measured in the same run, same folder.

    python3 benchmarks/bench_atomic_write.py [--dir DIR] [--files N] [--reps R]

The warm workers write an exit file per test and a heartbeat per second through it, so
this is the per-test price of durability. Prints medians (min-max) over the repetitions
and the ratio to the baseline; the machine is shared, so compare within one run only.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_common import summary  # noqa: E402

from pytest_trtllm_slurm.node.files import write_atomic  # noqa: E402


def rename_only(path: Path, text: str) -> None:
    """The old hand-made way (node/forkloop.py before): no fsync of file or folder."""
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def per_file(write: object, folder: Path, files: int) -> float:
    """Seconds per write of a small exit-code-sized file."""
    start = time.perf_counter()
    for i in range(files):
        write(folder / f"exit.{i % 16}", f"{i}\n")  # type: ignore[operator]
    return (time.perf_counter() - start) / files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=None, help="folder to write in (default: a temp dir)")
    parser.add_argument("--files", type=int, default=500)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-atomic-") as tmp:
        folder = Path(tmp)
        base, helper = [], []
        for _ in range(args.reps):  # interleaved: drifting load hits both alike
            base.append(per_file(rename_only, folder, args.files))
            helper.append(per_file(write_atomic, folder, args.files))
    b, h = summary(base), summary(helper)
    print(f"folder: {args.dir or tempfile.gettempdir()} ({args.files} files x {args.reps} reps)")
    print(f"rename only (baseline): {b['median'] * 1e6:8.1f} us/file "
          f"({b['min'] * 1e6:.1f}-{b['max'] * 1e6:.1f})")
    print(f"write_atomic (fsync):   {h['median'] * 1e6:8.1f} us/file "
          f"({h['min'] * 1e6:.1f}-{h['max'] * 1e6:.1f})")
    print(f"ratio write_atomic / baseline: {h['median'] / b['median']:.2f}")


if __name__ == "__main__":
    main()
