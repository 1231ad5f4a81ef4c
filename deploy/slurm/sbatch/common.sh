# Settings shared by the sbatch scripts of this directory; each script sources this file.
# Override any of them in your environment or with `sbatch --export=ALL,NAME=value ...`.

# EDIT: a directory on the shared filesystem (FSx for Lustre, NFS, GPFS) that the login node,
# the scheduler, every worker and the learner see at the same path.
: "${DASKRL_SHARED:=/fsx/$USER/daskrl}"
# EDIT: the venv daskrl is installed in, on the shared filesystem (one venv for all nodes:
# daskrl refuses workers whose torch/gymnasium/zarr/numpy/distributed/daskrl versions differ).
: "${DASKRL_VENV:=$DASKRL_SHARED/venv}"
# Where the scheduler writes its address; workers and the learner read it.
: "${DASKRL_SCHEDULER_FILE:=$DASKRL_SHARED/scheduler.json}"
# Optional TLS: a directory holding ca.pem, cert.pem, key.pem (mode 700). When set, every
# process talks TLS only, and clients need the same files (learner.py --tls-*).
: "${DASKRL_TLS_DIR:=}"
# Optional: network interface (e.g. ib0) or host address for Dask's own traffic.
: "${DASKRL_INTERFACE:=}"
: "${DASKRL_HOST:=}"

# shellcheck disable=SC1091
source "$DASKRL_VENV/bin/activate"

DASK_NET_ARGS=()
[[ -n "$DASKRL_INTERFACE" ]] && DASK_NET_ARGS+=(--interface "$DASKRL_INTERFACE")
[[ -n "$DASKRL_HOST" ]] && DASK_NET_ARGS+=(--host "$DASKRL_HOST")
DASK_TLS_ARGS=()
if [[ -n "$DASKRL_TLS_DIR" ]]; then
    DASK_TLS_ARGS=(--tls-ca-file "$DASKRL_TLS_DIR/ca.pem" --tls-cert "$DASKRL_TLS_DIR/cert.pem"
                   --tls-key "$DASKRL_TLS_DIR/key.pem")
    export DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION=True
fi

wait_for_scheduler_file() {
    local i
    for ((i = 0; i < ${DASKRL_WAIT_SECONDS:-900}; i++)); do
        [[ -s "$DASKRL_SCHEDULER_FILE" ]] && return 0
        sleep 1
    done
    echo "no scheduler file at $DASKRL_SCHEDULER_FILE: is scheduler.sbatch running?" >&2
    return 1
}
