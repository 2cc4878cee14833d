#!/bin/sh
# Slurm prolog (Prolog= in slurm.conf, runs as root on each node of the job): record which job
# holds which GPU in the job-mapping directory that `truegpu exporter --slurm-job-dir` and
# dcgm-exporter (--hpc-job-mapping-dir) both read: one file per GPU index, one job id per line
# (a GPU shared by several jobs lists each). The job's user, account and partition go to a
# separate metadata directory, so dcgm-exporter never sees a file it cannot parse.
#
# Environment: SLURM_JOB_ID and SLURM_JOB_GPUS (set by slurmd for the prolog; the GPU indexes of
# this node given to the job) -- SLURM_JOB_USER, SLURM_JOB_ACCOUNT, SLURM_JOB_PARTITION when set.
# TRUEGPU_JOB_DIR (default /run/truegpu/slurm-jobs), TRUEGPU_JOB_META_DIR (default
# /run/truegpu/slurm-meta). MIG slices are recorded as their parent GPU. Exits 0 on a job without
# GPUs; never fails the job for a bookkeeping problem it can report (exit 0, message on stderr).
set -eu
dir=${TRUEGPU_JOB_DIR:-/run/truegpu/slurm-jobs}
meta=${TRUEGPU_JOB_META_DIR:-/run/truegpu/slurm-meta}
job=${SLURM_JOB_ID:?SLURM_JOB_ID is not set: run this as the Slurm prolog}
gpus=${SLURM_JOB_GPUS:-}
[ -n "$gpus" ] || exit 0
case $job in *[!0-9_.]*) echo "truegpu-prolog: job id '$job' is not a Slurm job id" >&2; exit 0;; esac
mkdir -p "$dir" "$meta"
chmod 0755 "$dir" "$meta"
(
  flock -w 10 9 || { echo "truegpu-prolog: $dir/.lock busy; job $job not recorded" >&2; exit 0; }
  for gpu in $(echo "$gpus" | tr ',' ' '); do
    case $gpu in ''|*[!0-9]*) echo "truegpu-prolog: GPU index '$gpu' skipped" >&2; continue;; esac
    file="$dir/$gpu"
    tmp="$dir/.$gpu.$$"
    { [ -f "$file" ] && grep -vx "$job" "$file" || true; echo "$job"; } > "$tmp"
    chmod 0644 "$tmp"
    mv -f "$tmp" "$file"   # atomic: a reader sees the old or the new list, never half of one
  done
  tmp="$meta/.$job.$$"
  printf 'job=%s\nuser=%s\naccount=%s\npartition=%s\n' "$job" "${SLURM_JOB_USER:-}" \
    "${SLURM_JOB_ACCOUNT:-}" "${SLURM_JOB_PARTITION:-}" > "$tmp"
  chmod 0644 "$tmp"
  mv -f "$tmp" "$meta/$job.env"
) 9>"$dir/.lock"
