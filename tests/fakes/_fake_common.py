"""Shared behaviour of the FAKE trtllm-bench / trtllm-eval in this folder (test doubles).

TensorRT-LLM's tools need GPUs and TensorRT-LLM itself, neither of which exists on the
machines the test suite runs on. The fakes print the real tools' output formats and
misbehave on request, steered by environment variables:

  FAKE_TRTLLM_EXIT_CODE=N   exit with N after printing the results (default 0)
  FAKE_TRTLLM_SLEEP=S       sleep S seconds before the results (a long-running job)
  FAKE_TRTLLM_HANG=S        print TensorRT-LLM's "Hang detected after S seconds." and
                            then sleep (as if stuck) for 600 s
  FAKE_TRTLLM_ALLOC_MB=N    allocate and touch N MiB, hold them 3 s (out-of-memory)
  FAKE_TRTLLM_CHECK_GPUS=0  do not insist on tp*pp GPUs in CUDA_VISIBLE_DEVICES
"""

import os
import sys
import time
from datetime import datetime


def log_prefix() -> str:
    """TensorRT-LLM's logger prefix: ``[11/29/2026-11:47:13] [TRT-LLM] [I] ``."""
    return f"[{datetime.now().strftime('%m/%d/%Y-%H:%M:%S')}] [TRT-LLM] [I] "


def info(message: str) -> None:
    print(log_prefix() + message, flush=True)


def option(argv, names, default=None):
    """Value of the last ``--name V`` / ``--name=V`` in argv."""
    value = default
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                value = argv[i + 1]
            elif arg.startswith(name + "="):
                value = arg.split("=", 1)[1]
    return value


def misbehave_before(world_size: int, tool: str) -> None:
    """Hang / allocate / sleep / check GPUs, as the environment asks."""
    print(f"[fake {tool}] a FAKE stand-in for TensorRT-LLM's {tool} (cannot run here); "
          f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')}",
          file=sys.stderr, flush=True)
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    if os.environ.get("FAKE_TRTLLM_CHECK_GPUS", "1") != "0" and os.environ.get(
            "CUDA_VISIBLE_DEVICES") is not None and len(visible) < world_size:
        print(f"RuntimeError: world size {world_size} needs {world_size} GPUs, "
              f"CUDA_VISIBLE_DEVICES shows {len(visible)}", flush=True)
        sys.exit(1)
    hang = os.environ.get("FAKE_TRTLLM_HANG")
    if hang:
        info("Starting the workload")
        time.sleep(1)
        print(f"{log_prefix()}Hang detected after {hang} seconds.", flush=True)
        time.sleep(600)
    alloc = int(os.environ.get("FAKE_TRTLLM_ALLOC_MB", "0") or 0)
    if alloc:
        info(f"allocating {alloc} MiB")
        block = bytearray(alloc << 20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        time.sleep(3)
    time.sleep(float(os.environ.get("FAKE_TRTLLM_SLEEP", "0") or 0))


def finish() -> None:
    sys.stdout.flush()
    sys.exit(int(os.environ.get("FAKE_TRTLLM_EXIT_CODE", "0") or 0))
