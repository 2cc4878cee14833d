"""Benchmark: the daily cost rollups a ``serve --rollup-store`` keeps, at fleet scale, and a 30-day cost report
read back from them (the API's path for windows longer than serve's). Prints plain number lines:

    rollup_gpus N                     GPUs in the fleet (healthy-fleet, 8-GPU nodes)
    rollup_piece_rows N               frame rows of one piece loaded with its context (GPUs x 2 h at the step)
    rollup_day_seconds N              a whole day written in pieces: a restart, or the day's last write
    rollup_day_peak_rss_mb N          peak RSS of that (a piece at a time, whatever the fleet)
    rollup_hour_seconds N             one hourly write later that day (the earlier pieces final: the steady cost)
    rollup_store_rows N               rows in the store after 30 days
    rollup_report_seconds N           30-day report in a fresh process: store read, rollup_report, JSON
    rollup_report_peak_rss_mb N       its peak RSS

IN MEMORY input: the pieces come from the simulator, not from a Prometheus (a day of 10,000 GPUs is ~500 M
samples, too much to backfill here); what is measured is the writer's analysis and the store, and the
report end to end from the store. The 30 days are the measured day written 30 times (a day's rows differ
only in their values).

    .venv/bin/python bench/bench_rollups.py [--gpus 10000] [--step 60] [--days 30]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from analyzer.data.simulated import fleet_from_cluster  # noqa: E402
from analyzer.finops.catalog import default_catalog  # noqa: E402
from analyzer.finops.rollups import CONTEXT_S, PIECE_S, RollupWriter  # noqa: E402
from analyzer.finops.store import open_store  # noqa: E402
from bench.benchutil import healthy_cluster, reset_peak, status_mb  # noqa: E402

#: The child: a 30-day report from the store, as the API's cost source builds it.
REPORT = """
import json, sys, time
sys.path.insert(0, {root!r})
from datetime import date
from analyzer.finops.catalog import default_catalog
from analyzer.finops.outputs import to_json
from analyzer.finops.rollups import rollup_report
from analyzer.finops.store import open_store
from bench.benchutil import status_mb
t0 = time.perf_counter()
with open_store({store!r}) as st:
    rows = st.read(date.fromisoformat({first!r}), date.fromisoformat({last!r}), "namespace", per_day=True)
report = rollup_report(rows, "namespace", date.fromisoformat({first!r}), date.fromisoformat({last!r}),
                       default_catalog())
text = json.dumps(to_json(report), default=str)
print(f"rollup_report_seconds {{time.perf_counter() - t0:.2f}}")
print(f"rollup_report_peak_rss_mb {{status_mb('VmHWM'):.0f}}")
print(f"# {{len(rows)}} stored rows, {{len(text)}} bytes of JSON", file=sys.stderr)
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=10000)
    ap.add_argument("--step", type=float, default=60.0, help="the loader's step (serve's default 60 s)")
    ap.add_argument("--days", type=int, default=30)
    args = ap.parse_args()
    cluster = healthy_cluster(args.gpus, 86400.0 + 2 * 3600.0)
    day = cluster.start - cluster.start % 86400.0
    rows_of_piece = 0

    def loader(start: float, end: float):  # what the service's Prometheus loader returns for the window
        nonlocal rows_of_piece
        fleet = fleet_from_cluster(cluster, start=max(start, cluster.start), end=end, step=args.step)
        rows_of_piece = max(rows_of_piece, len(fleet.frame))
        return fleet

    with tempfile.TemporaryDirectory(prefix="bench-rollups-") as tmp:
        store = str(Path(tmp) / "rollups.db")
        writer = RollupWriter(loader, store, default_catalog())
        reset_peak()
        t0 = time.perf_counter()
        writer.write(day, day + 86400.0 - PIECE_S)  # the day up to its last hour: every earlier piece final
        took_day = time.perf_counter() - t0
        peak = status_mb("VmHWM")
        t0 = time.perf_counter()
        writer.write(day, day + 86400.0)  # an hour later: the newest pieces only
        took_hour = time.perf_counter() - t0
        print(f"rollup_gpus {len(cluster.gpus)}")
        print(f"rollup_piece_rows {rows_of_piece}")
        print(f"rollup_day_seconds {took_day:.1f}")
        print(f"rollup_day_peak_rss_mb {peak:.0f}")
        print(f"rollup_hour_seconds {took_hour:.1f}")
        first = datetime.fromtimestamp(day, UTC).date()
        with open_store(store) as st:
            today = pd.concat([st.read(first, first, g, per_day=True) for g in st.group_bys()], ignore_index=True)
            st.write_rollups(pd.concat([today.assign(day=(first - timedelta(days=k)).isoformat())
                                        for k in range(1, args.days)], ignore_index=True))
            n = sum(len(st.read(first - timedelta(days=args.days - 1), first, g, per_day=True))
                    for g in st.group_bys())
        print(f"rollup_store_rows {n}")
        child = REPORT.format(root=str(ROOT), store=store, first=(first - timedelta(days=args.days - 1)).isoformat(),
                              last=first.isoformat())
        done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(done.stderr[-2000:])
        print(done.stdout, end="")
        print(done.stderr, end="", file=sys.stderr)
        print(f"# context {CONTEXT_S:.0f} s either side of each {PIECE_S:.0f} s piece; {len(today)} rows a day",
              file=sys.stderr)


if __name__ == "__main__":
    main()
