"""What the node side and the controller agree on, as plain constants (no pytest)."""
from __future__ import annotations

# reports.jsonl: the version of the records the worker writes and ``execution.records`` reads
RECORD_VERSION = 1
# starts every line the plugin (not the test) writes to a job log: the hang scan skips them
LOG_MARK = "[trtllm-slurm] "
# the start gate of a step launched before its GPUs were free (node/gate.py)
GATE_ENV = "TRTLLM_SLURM_GATE"
GATE_WAIT_ENV = "TRTLLM_SLURM_GATE_WAIT"  # seconds a rank waits for ``open`` at most
# warm workers (node/agent.py, node/session_server.py)
GPU_LOCKS_ENV = "TRTLLM_SLURM_GPU_LOCKS"  # node-local directory of the GPUs' flock files
LOCK_ROOT_ENV = "TRTLLM_SLURM_LOCK_ROOT"  # node-local folder to put it in (default /tmp)
AGENT_ENV = "TRTLLM_SLURM_AGENT"
EARLY_MISS = 75  # a batch this session did not collect: the controller re-sends it
# a folder the worker makes before the suite starts; a batch with it runs in a process of
# its own (a warm session's options are fixed when it starts)
WORKER_OUTPUTS_FLAG = "--trtllm-worker-outputs"
