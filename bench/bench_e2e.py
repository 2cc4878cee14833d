"""Benchmark: end-to-end ``truegpu analyze --input FILE`` on a simulated fleet's OpenMetrics history.

Writes the healthy-fleet scenario sized by ``--gpus`` (2 sites x racks of 16 nodes of 8 GPUs) for
``--hours`` at ``--step`` with the simulator's history writer (it streams series by series, so the
fleet is never held whole), then runs the real CLI in a subprocess, so the peak RSS is the
analyzer's alone (imports, ingest, normalize, scores, detectors, output). Prints:

    e2e_file_gpus N             GPUs in the file
    e2e_file_samples N          samples written
    e2e_file_bytes N            file size
    e2e_file_seconds N          wall time of ``truegpu analyze --input FILE --json``
    e2e_file_peak_rss_mb N      its peak RSS
    e2e_file_peak_pss_with_workers_mb N
                                the peak of its and its ingest workers' PSS together (sampled every 50 ms)
    e2e_file_mb_per_gpu_hour N  the larger of the two peaks / (GPUs x hours)

``--baseline DIR`` also runs the analyzer of another checkout (e.g. ``git archive`` of an older
commit unpacked in DIR) on the same file, alternating with this one, and prints the same lines
prefixed ``e2e_file_baseline_``: a before/after measured side by side. Timings are wall clock on
a possibly shared machine; the peak RSS is not affected by other processes.

    .venv/bin/python bench/bench_e2e.py [--gpus 1000] [--hours 1] [--step 15] [--repeat 1]
                                        [--input FILE] [--keep DIR] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.benchutil import checkouts  # noqa: E402
from exporter.simulator import Cluster, load_scenario  # noqa: E402
from exporter.simulator.history import write_history  # noqa: E402

NODES_PER_RACK = 16
GPUS_PER_NODE = 8


def write_fleet(path: Path, gpus: int, hours: float, step: float) -> dict[str, float]:
    """Write the history file; return what it holds (also kept next to it as ``<file>.json``)."""
    per_site_rack = 2 * NODES_PER_RACK * GPUS_PER_NODE
    racks, nodes = ((max(1, round(gpus / per_site_rack)), NODES_PER_RACK) if gpus >= per_site_rack
                    else (1, max(1, round(gpus / (2 * GPUS_PER_NODE)))))  # fmt: skip
    cluster = Cluster(load_scenario("healthy-fleet", racks=racks, nodes_per_rack=nodes,
                                    duration=f"{hours * 3600:g}s"))  # fmt: skip
    start = float(cluster.start)
    stats = write_history(path, cluster, start, start + hours * 3600, step)
    info = {"gpus": len(cluster.gpus), "hours": hours, "samples": stats.samples}
    Path(str(path) + ".json").write_text(json.dumps(info))
    return info


def run_analyze(code: Path, path: Path) -> tuple[float, float, float]:
    """(seconds, peak RSS in MB, peak PSS in MB of it and its workers together) of ``truegpu analyze --input
    path --json`` run from checkout ``code``."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    cmd = [sys.executable, "-c", "import sys; from truegpu.cli import main; sys.exit(main())",
           "analyze", "--input", str(path), "--json", "--quiet"]  # fmt: skip
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=code, env=env, stdout=subprocess.DEVNULL, stderr=err)
        tree = TreePeak(proc.pid)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak, not the bench's
        seconds = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            raise RuntimeError(f"analyze from {code} failed ({proc.returncode}): {err.read()[-2000:].decode()}")
    return seconds, usage.ru_maxrss / 1024.0, tree.stop()  # ru_maxrss is in KiB on Linux


class TreePeak:
    """The largest sum of PSS (shared pages split between their sharers: forked workers' copy-on-write pages are
    not counted twice) over a process and its descendants, sampled every ``every`` s on a thread."""

    def __init__(self, pid: int, every: float = 0.05) -> None:
        self.peak_kb = 0
        self._pid, self._every, self._done = pid, every, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(self._every):
            self.peak_kb = max(self.peak_kb, sum(map(_pss_kb, _tree(self._pid))))

    def stop(self) -> float:
        """Stop sampling; the peak in MB."""
        self._done.set()
        self._thread.join()
        return self.peak_kb / 1024.0


def _tree(root: int) -> list[int]:
    parent: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    parent[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:  # ended meanwhile
                continue
    out = [root]
    for pid in out:
        out += [p for p, pp in parent.items() if pp == pid]
    return out


def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return next((int(line.split()[1]) for line in f if line.startswith("Pss:")), 0)
    except OSError:
        return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=1000)
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--step", type=float, default=15.0)
    ap.add_argument("--repeat", type=int, default=1, help="runs of each analyzer; the best is printed")
    ap.add_argument("--input", type=Path, help="an existing file written by this bench (skips writing one)")
    ap.add_argument("--keep", type=Path, help="write the file here and keep it")
    ap.add_argument("--baseline", type=Path, help="another checkout to run on the same file, side by side")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        if args.input:
            path = args.input
            info = json.loads(Path(str(path) + ".json").read_text())
        else:
            folder = args.keep or Path(tmp)
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"fleet-{args.gpus}.om"
            t0 = time.perf_counter()
            info = write_fleet(path, args.gpus, args.hours, args.step)
            print(f"# wrote {path} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        runs = checkouts(ROOT, args.baseline)
        best = {prefix: (float("inf"), float("inf"), float("inf")) for prefix in runs}
        for _ in range(max(1, args.repeat)):
            for prefix, code in runs.items():
                got = run_analyze(code, path)
                print(f"# {prefix or 'this'}: {got[0]:.1f} s, peak {got[1]:.0f} MB, with workers {got[2]:.0f} MB",
                      file=sys.stderr)
                best[prefix] = tuple(map(min, best[prefix], got))
        gpu_hours = info["gpus"] * info["hours"]
        for prefix, (seconds, peak, together) in best.items():
            name = f"e2e_file_{prefix}"
            print(f"{name}gpus {info['gpus']}")
            print(f"{name}samples {info['samples']}")
            print(f"{name}bytes {path.stat().st_size}")
            print(f"{name}seconds {seconds:.1f}")
            print(f"{name}peak_rss_mb {peak:.0f}")
            print(f"{name}peak_pss_with_workers_mb {together:.0f}")
            print(f"{name}mb_per_gpu_hour {max(peak, together) / gpu_hours:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
