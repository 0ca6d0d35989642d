"""``python -m pytest_trtllm_slurm``: the ``trtllm-slurm`` command line."""
from __future__ import annotations

from pytest_trtllm_slurm.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
