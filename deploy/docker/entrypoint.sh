#!/bin/bash
# The image's entry point: `scheduler`, `worker`, `learner`, or any command (daskrl, dask,
# dask-worker as the Kubernetes operator runs it, python, bash).
set -euo pipefail
case "${1:-worker}" in
    scheduler)
        shift; exec dask scheduler "$@" ;;
    worker)
        # One thread: a worker runs one batch at a time (its envs and torch use the CPUs).
        shift; exec dask worker --nthreads 1 "$@" ;;
    dask-scheduler)  # the names the dask-kubernetes operator's default specs run
        shift; exec dask scheduler "$@" ;;
    dask-worker)
        shift; exec dask worker "$@" ;;
    learner)
        shift; exec python /opt/daskrl/learner.py "$@" ;;
    *)
        exec "$@" ;;
esac
