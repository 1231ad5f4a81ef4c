#!/bin/bash
# Start this node's Dask workers for daskrl and wait for them: one worker per GPU of the job
# (CUDA_VISIBLE_DEVICES narrowed to that GPU, DASKRL_DEVICE=cuda), or, with
# DASKRL_CPU_WORKERS=N, N CPU workers (DASKRL_DEVICE=cpu). Each worker has one thread and
# node-local scratch; its nanny unlinks the names of the semaphores it shares with its worker
# (daskrl.deploy.nanny_preload), so a job killed whole leaves no files in /dev/shm. Run once
# per node: `srun bash start-workers.sh` (see workers.sbatch).
set -euo pipefail
# shellcheck source=common.sh
source "${DASKRL_SBATCH_DIR:-$(dirname "${BASH_SOURCE[0]}")}/common.sh"
: "${DASKRL_CPU_WORKERS:=0}"
# Retire before the walltime (set it a little below the job's --time), staggered per worker.
: "${DASKRL_LIFETIME:=}"
: "${DASKRL_LIFETIME_STAGGER:=5m}"

wait_for_scheduler_file
node=$(hostname -s)
scratch="${TMPDIR:-/tmp}/daskrl-${SLURM_JOB_ID:-$$}"   # node-local, never the shared FS
# Gone with the workers: SLURM cleans a per-job $TMPDIR, but nothing cleans /tmp.
trap 'rm -rf "$scratch"' EXIT
lifetime=()
[[ -n "$DASKRL_LIFETIME" ]] && lifetime=(--lifetime "$DASKRL_LIFETIME"
                                         --lifetime-stagger "$DASKRL_LIFETIME_STAGGER")

start_worker() {  # name device [CUDA_VISIBLE_DEVICES]
    CUDA_VISIBLE_DEVICES="$3" DASKRL_DEVICE="$2" dask worker \
        --scheduler-file "$DASKRL_SCHEDULER_FILE" --name "$1" --nthreads 1 \
        --local-directory "$scratch/$1" --no-dashboard ${lifetime[@]+"${lifetime[@]}"} \
        --preload-nanny daskrl.deploy.nanny_preload \
        ${DASK_NET_ARGS[@]+"${DASK_NET_ARGS[@]}"} ${DASK_TLS_ARGS[@]+"${DASK_TLS_ARGS[@]}"} &
}

if [[ "$DASKRL_CPU_WORKERS" -gt 0 ]]; then
    for ((i = 0; i < DASKRL_CPU_WORKERS; i++)); do
        start_worker "$node-cpu$i" cpu ""
    done
else
    # The GPUs SLURM gave this job on this node, e.g. "0,1,2,3" (or UUIDs): one worker each.
    IFS=, read -ra gpus <<< "${CUDA_VISIBLE_DEVICES:?no GPUs in this job: use --gres=gpu:N, or set DASKRL_CPU_WORKERS}"
    for gpu in "${gpus[@]}"; do
        start_worker "$node-gpu$gpu" cuda "$gpu"
    done
fi
trap 'kill $(jobs -p) 2>/dev/null; wait' TERM INT
wait
