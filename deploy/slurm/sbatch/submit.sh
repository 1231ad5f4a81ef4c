#!/bin/bash
# Submit scheduler, workers and learner; workers and learner start once the scheduler runs.
# Run from the repository root: bash deploy/slurm/sbatch/submit.sh [learner.py arguments]
set -euo pipefail
dir=deploy/slurm/sbatch
scheduler=$(sbatch --parsable "$dir/scheduler.sbatch")
sbatch --dependency="after:$scheduler" "$dir/workers.sbatch"
sbatch --dependency="after:$scheduler" "$dir/learner.sbatch" "$@"
echo "scheduler job $scheduler; cancel all with: scancel --name daskrl-scheduler,daskrl-workers,daskrl-learner"
