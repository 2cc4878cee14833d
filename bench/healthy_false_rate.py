"""False findings on healthy fleets (issue 12's gate): <= 0.2 per 1,000 GPU-hours over >= 5,000 healthy
GPU-hours, none critical, on >= 20 seeds (some never used while tuning), with dcgm-exporter's default
counters. Runs ``truegpu evaluate --json`` (whole history, and ``--replay`` the way ``serve`` sees it) over
the healthy scenarios and prints plain number lines, one per (mode, dialect, counter set)::

    false_rate MODE DIALECT COUNTERS gpu_hours=N runs=N false=N critical=N warning=N info=N
               per_1000_gpu_hours=N wall_s=N
    false_kind MODE DIALECT COUNTERS KIND SEVERITY N
    false_finding MODE DIALECT COUNTERS SCENARIO seed=N KIND SEVERITY host/gpu/workload: summary | evidence

then the totals per mode. Every finding on these scenarios is false (they have no ground truth); a
scenario that has ground truth is reported and left out of the rate. Replay severity is the highest any
run gave the finding (a suspected finding confirmed later pages at the confirmed severity).

    .venv/bin/python bench/healthy_false_rate.py [--seeds 10] [--seed-offset 0 --seed-offset 1000]
        [--scenario NAME ...] [--dialect truegpu --dialect dcgm] [--dcgm-counters default]
        [--replay-scenario NAME ...] [--replay-seeds N] [--no-whole] [--no-replay] [--jobs 2] [--json-out F]

Defaults: the four healthy scenarios, seed offsets 0..9 and 1000..1009 (20 seeds, the 1000s never used
while tuning), both dialects, dcgm with the default counter set; replay over the same scenarios and seeds.
A full replay (healthy-long: 1,440 analyses per seed) takes hours on 2 cores: ``--replay-scenario`` and
``--replay-seeds`` choose a subset (the numbers say which).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TRUEGPU = str(Path(sys.executable).with_name("truegpu"))
HEALTHY = ("healthy-fleet", "healthy-long", "noisy-neighbours", "healthy-heterogeneous")
SEVERITIES = ("critical", "warning", "info")


def _evaluate(scenarios: list[str], dialect: str, counters: str, seeds: int, offset: int, replay: bool,
              jobs: int) -> tuple[list[dict[str, Any]], float]:
    """One ``truegpu evaluate --json`` run: its per-run results and its wall time."""
    cmd = [TRUEGPU, "evaluate", "--json", "--dialect", dialect, "--dcgm-counters", counters,
           "--seeds", str(seeds), "--seed-offset", str(offset)]
    for s in scenarios:
        cmd += ["--scenario", s]
    if replay:
        cmd += ["--replay", "--jobs", str(jobs)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout)["results"], wall


def _brief(f: dict[str, Any], replay: bool) -> str:
    where = f"{f.get('hostname') or '-'}/{'-' if f.get('gpu') is None else f['gpu']}/{f.get('job') or '-'}"
    ev = json.dumps(f.get("evidence") or {}, sort_keys=True, default=str)
    when = f"start={f['start']:.0f} end={f['end'] if f['end'] is None else round(f['end'])}"
    if replay:
        when += f" first_cut={f['first_cut']:.0f}"
    return f"{where} {f.get('confidence', '-')} {when}: {f['summary']} | {ev}"


def summarize(mode: str, dialect: str, counters: str, results: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    """Print one group's number lines (rate, per kind and severity, each false finding); return its totals."""
    label = f"{mode} {dialect} {counters}"
    healthy = [r for r in results if not any(k["truth"] for k in r["kinds"].values())]
    for r in results:
        if r not in healthy:
            print(f"# {r['scenario']} seed {r['seed']} has ground truth: not a healthy fleet, left out")
    gpu_hours = sum(float(r["gpu_hours"]) for r in healthy)
    per_kind: Counter[tuple[str, str]] = Counter()
    lines = []
    for r in healthy:
        for kind, k in sorted(r["kinds"].items()):
            for f in k["false_findings"]:
                sev = f.get("severity_max") or f.get("severity", "-")
                per_kind[(kind, sev)] += 1
                lines.append(f"false_finding {label} {r['scenario']} seed={r['seed']} {kind} {sev} "
                             f"{_brief(f, mode == 'replay')}")
    total = sum(per_kind.values())
    by_sev = {s: sum(n for (_, sv), n in per_kind.items() if sv == s) for s in SEVERITIES}
    rate = total / gpu_hours * 1000.0 if gpu_hours else float("nan")
    print(f"false_rate {label} gpu_hours={gpu_hours:.0f} runs={len(healthy)} false={total} "
          + " ".join(f"{s}={n}" for s, n in by_sev.items()) + f" per_1000_gpu_hours={rate:.3f} wall_s={wall:.0f}")
    for (kind, sev), n in sorted(per_kind.items()):
        print(f"false_kind {label} {kind} {sev} {n}")
    for line in lines:
        print(line)
    sys.stdout.flush()
    return {"gpu_hours": gpu_hours, "false": total, **by_sev, "wall_s": wall}


def _groups(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(dialect, counter set) pairs: the counter set matters only for dcgm."""
    out = []
    for d in args.dialect:
        out += [(d, c) for c in args.dcgm_counters] if d == "dcgm" else [(d, "-")]
    return out


def run_mode(args: argparse.Namespace, replay: bool) -> dict[str, dict[str, Any]]:
    """Every (dialect, counters, seed block) of one mode; whole-history blocks run ``--jobs`` at a time
    (one process each), replay blocks one at a time with ``--jobs`` processes inside."""
    mode = "replay" if replay else "whole"
    scenarios = args.replay_scenario or args.scenario if replay else args.scenario
    seeds = args.replay_seeds or args.seeds if replay else args.seeds
    work = [(d, c, off) for d, c in _groups(args) for off in args.seed_offset]
    print(f"# {mode}: {', '.join(scenarios)}; seed offsets "
          + ", ".join(f"{o}..{o + seeds - 1}" for o in args.seed_offset), flush=True)

    def one(w: tuple[str, str, int]) -> tuple[list[dict[str, Any]], float]:
        d, c, off = w
        return _evaluate(scenarios, d, "default" if c == "-" else c, seeds, off, replay, args.jobs)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=1 if replay else max(1, args.jobs)) as pool:
        done = list(pool.map(one, work))
    print(f"# {mode}: elapsed {time.perf_counter() - t0:.0f} s (wall_s below: per group, summed over its blocks)")
    totals: dict[str, dict[str, Any]] = {}
    for d, c in _groups(args):
        parts = [res for w, res in zip(work, done, strict=True) if w[:2] == (d, c)]
        results = [r for rs, _ in parts for r in rs]
        args.raw.setdefault(mode, []).extend(results)
        totals[f"{mode} {d} {c}"] = summarize(mode, d, c, results, sum(wall for _, wall in parts))
    return totals


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", action="append", help=f"healthy scenario (repeatable; default {', '.join(HEALTHY)})")
    ap.add_argument("--seeds", type=int, default=10, help="seeds per offset block (default 10)")
    ap.add_argument("--seed-offset", type=int, action="append", help="seed offset block (default 0 and 1000)")
    ap.add_argument("--dialect", action="append", choices=("truegpu", "dcgm"), help="default both")
    ap.add_argument("--dcgm-counters", action="append", choices=("default", "all"), help="default: default")
    ap.add_argument("--replay-scenario", action="append", help="replay only these (default: --scenario's)")
    ap.add_argument("--replay-seeds", type=int, default=0, help="seeds per offset block in replay (default --seeds)")
    ap.add_argument("--no-whole", action="store_true", help="skip the whole-history evaluation")
    ap.add_argument("--no-replay", action="store_true", help="skip the replay")
    ap.add_argument("--jobs", type=int, default=2, help="parallel processes (default 2)")
    ap.add_argument("--json-out", type=Path, help="also write every run's results as JSON")
    args = ap.parse_args()
    args.scenario = args.scenario or list(HEALTHY)
    args.seed_offset = args.seed_offset or [0, 1000]
    args.dialect = args.dialect or ["truegpu", "dcgm"]
    args.dcgm_counters = args.dcgm_counters or ["default"]
    args.raw = {}
    totals: dict[str, dict[str, Any]] = {}
    if not args.no_whole:
        totals.update(run_mode(args, replay=False))
    if not args.no_replay:
        totals.update(run_mode(args, replay=True))
    for mode in ("whole", "replay"):
        group = [t for k, t in totals.items() if k.startswith(mode)]
        if group:
            hours, false = sum(t["gpu_hours"] for t in group), sum(t["false"] for t in group)
            print(f"false_rate_total {mode} gpu_hours={hours:.0f} false={false} "
                  + " ".join(f"{s}={sum(t[s] for t in group)}" for s in SEVERITIES)
                  + f" per_1000_gpu_hours={false / hours * 1000.0 if hours else float('nan'):.3f} "
                  f"wall_s={sum(t['wall_s'] for t in group):.0f}")
    if args.json_out:
        args.json_out.write_text(json.dumps(args.raw, default=str))


if __name__ == "__main__":
    main()
