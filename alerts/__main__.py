"""``python -m alerts``: regenerate the committed rules, Alertmanager config and promtool tests."""

from __future__ import annotations

import argparse
import sys

from alerts import ROOT, committed_files, write_committed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m alerts", description=__doc__)
    parser.add_argument("--check", action="store_true", help="only report files that differ; exit 1 if any")
    args = parser.parse_args(argv)
    if args.check:
        stale = [p for p, text in committed_files().items() if not p.exists() or p.read_text() != text]
        for p in stale:
            print(f"out of date: {p.relative_to(ROOT)}", file=sys.stderr)
        return 1 if stale else 0
    for p in write_committed():
        print(p.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
