"""pytest-trtllm-slurm: run each test on the hardware it needs, report it as if local."""

__version__ = "0.1.0"
