#!/bin/bash
# pytest-trtllm-slurm step launcher (started detached with setsid)
exec >>/work/repo/work_dirs/batch-4gpu-1n-0_20250101_000000_1/job.log 2>&1 </dev/null
for v in $(compgen -e); do case "$v" in SLURM_CONF) ;; SLURM_*) unset "$v" ;; esac; done
finish() { t=$(mktemp /work/repo/work_dirs/batch-4gpu-1n-0_20250101_000000_1/exit_code.XXXXXXXX) && echo "$1" >"$t" && mv -f "$t" /work/repo/work_dirs/batch-4gpu-1n-0_20250101_000000_1/exit_code; }
cd -- /work/repo || { finish 127; exit 127; }
# pytest-trtllm-slurm environment (values inherited from the command that started this launcher, not written here): K
srun --jobid=1234 -N 1 --ntasks=1 --ntasks-per-node=1 --exact --gpus-per-node=1 --kill-on-bad-exit=1 --job-name=acct_a.batch-4gpu-1n-0 --time=01:00:00 sh -c 'export SLURM_JOB_NUM_NODES="$SLURM_STEP_NUM_NODES" SLURM_NNODES="$SLURM_STEP_NUM_NODES" SLURM_JOB_NODELIST="$SLURM_STEP_NODELIST" SLURM_NODELIST="$SLURM_STEP_NODELIST" SLURM_NTASKS="$SLURM_STEP_NUM_TASKS" SLURM_NPROCS="$SLURM_STEP_NUM_TASKS" SLURM_TASKS_PER_NODE="$SLURM_STEP_TASKS_PER_NODE"; [ "${SLURM_PROCID:-0}" != 0 ] || echo "$SLURM_STEP_ID" > "$1"; shift; exec "$@"' trtllm-step /work/repo/work_dirs/batch-4gpu-1n-0_20250101_000000_1/stepid /usr/bin/python3 -m pytest -p pytest_trtllm_slurm.node.worker --trtllm-worker-reports /work/repo/work_dirs/batch-4gpu-1n-0_20250101_000000_1/reports.jsonl --trtllm-worker-nodeids /work/repo/work_dirs/batch-4gpu-1n-0_20250101_000000_1/nodeids.json --rootdir /work/repo -o cache_dir=/work/repo/work_dirs/batch-4gpu-1n-0_20250101_000000_1/.pytest_cache --junitxml /work/repo/work_dirs/batch-4gpu-1n-0_20250101_000000_1/junit.xml --continue-on-collection-errors --capture=tee-sys &
pid=$!
echo "$pid" > /work/repo/work_dirs/batch-4gpu-1n-0_20250101_000000_1/srun.pid
wait "$pid"
rc=$?
finish "$rc"
