#!/bin/sh
# Slurm epilog (Epilog= in slurm.conf): remove the job from every GPU file of the job-mapping
# directory the prolog wrote (a file left empty is removed: the GPU is free) and its metadata.
# Same environment as truegpu-prolog.sh; it looks at every GPU file, not only SLURM_JOB_GPUS, so
# a job whose GPU list changed (or a prolog that ran twice) leaves nothing stale behind.
set -eu
dir=${TRUEGPU_JOB_DIR:-/run/truegpu/slurm-jobs}
meta=${TRUEGPU_JOB_META_DIR:-/run/truegpu/slurm-meta}
job=${SLURM_JOB_ID:?SLURM_JOB_ID is not set: run this as the Slurm epilog}
[ -d "$dir" ] || exit 0
(
  flock -w 10 9 || { echo "truegpu-epilog: $dir/.lock busy; job $job left in place" >&2; exit 0; }
  for file in "$dir"/*; do
    name=${file##*/}
    case $name in ''|*[!0-9.]*) continue;; esac
    [ -f "$file" ] || continue
    grep -qx "$job" "$file" || continue
    tmp="$dir/.$name.$$"
    grep -vx "$job" "$file" > "$tmp" || true
    if [ -s "$tmp" ]; then chmod 0644 "$tmp"; mv -f "$tmp" "$file"; else rm -f "$tmp" "$file"; fi
  done
  rm -f "$meta/$job.env"
) 9>"$dir/.lock"
