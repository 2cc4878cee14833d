#!/bin/bash
# The real-GPU check (device machine, in the repository root; needs nvidia-smi, nvidia-ml-py, PyTorch,
# prometheus-client, requests): the NVML source of `truegpu exporter` against the driver, and a 7-minute
# capture of its /metrics while bench/real_gpu/phases.py runs a known load. Writes $OUT/real.om.gz
# (tests/fixtures/real/h200_nvml_phases.om.gz came from this) and the logs.
set -u
PY=${PY:-python3}; OUT=${OUT:-/tmp/real_gpu}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv
$PY bench/real_gpu/probe.py | tee "$OUT/probe.txt"
$PY -m truegpu --log-level INFO exporter --source nvml --listen 127.0.0.1:9479 --collect-interval 1 \
  > "$OUT/exporter.log" 2>&1 &
EXPORTER=$!
sleep 3
$PY bench/real_gpu/record.py http://127.0.0.1:9479/metrics 425 5 "$OUT/real.om" > "$OUT/record.log" 2>&1 &
RECORDER=$!
$PY bench/real_gpu/phases.py > "$OUT/phases.log" 2>&1
wait $RECORDER
kill $EXPORTER; wait $EXPORTER
cat "$OUT/phases.log" "$OUT/record.log" "$OUT/exporter.log"
gzip -f "$OUT/real.om"
