#!/bin/bash
# Submit scheduler, workers and learner; workers and learner start once the scheduler runs.
#   bash deploy/slurm/sbatch/submit.sh [learner.py arguments]
# The #SBATCH lines of the three scripts are defaults for a GPU cluster. sbatch flags given
# here override them (a flag on sbatch's command line wins over the script's #SBATCH line):
#   DASKRL_SBATCH_ARGS            for all three jobs, e.g. "--partition=debug --account=me"
#   DASKRL_SCHEDULER_SBATCH_ARGS  scheduler.sbatch, e.g. "--mem=2G"
#   DASKRL_WORKERS_SBATCH_ARGS    workers.sbatch, e.g. "--nodes=1 --gres=none --cpus-per-task=2"
#   DASKRL_LEARNER_SBATCH_ARGS    learner.sbatch, e.g. "--gres=none --cpus-per-task=1 --mem=2G"
# The jobs read their DASKRL_* settings (common.sh) from the environment, which sbatch passes
# on (--export=ALL, its default; where a site sets SBATCH_EXPORT=NONE, add
# "--export=ALL" to DASKRL_SBATCH_ARGS).
set -euo pipefail
dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export DASKRL_SBATCH_DIR="$dir"   # the jobs find common.sh here, whatever the submit directory
read -ra common <<< "${DASKRL_SBATCH_ARGS:-}"
read -ra sched_args <<< "${DASKRL_SCHEDULER_SBATCH_ARGS:-}"
read -ra worker_args <<< "${DASKRL_WORKERS_SBATCH_ARGS:-}"
read -ra learner_args <<< "${DASKRL_LEARNER_SBATCH_ARGS:-}"
scheduler=$(sbatch --parsable ${common[@]+"${common[@]}"} ${sched_args[@]+"${sched_args[@]}"} \
    "$dir/scheduler.sbatch")
workers=$(sbatch --parsable --dependency="after:$scheduler" ${common[@]+"${common[@]}"} \
    ${worker_args[@]+"${worker_args[@]}"} "$dir/workers.sbatch")
learner=$(sbatch --parsable --dependency="after:$scheduler" ${common[@]+"${common[@]}"} \
    ${learner_args[@]+"${learner_args[@]}"} "$dir/learner.sbatch" "$@")
echo "scheduler job $scheduler, workers job $workers, learner job $learner"
echo "cancel all with: scancel $scheduler $workers $learner"
