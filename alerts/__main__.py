"""``python -m alerts``: regenerate the committed rules, Alertmanager config and promtool tests.

``python -m alerts --site FILE --out DIR`` writes this site's rules and Alertmanager config instead
(its ``selectors``: scrape job names and cluster label; ``thresholds``; ``alerting``: runbook and
dashboard URLs, receivers, owner routes).
"""

from __future__ import annotations

import argparse
import sys

from alerts import ROOT, committed_files, write_committed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m alerts", description=__doc__)
    parser.add_argument("--check", action="store_true", help="only report files that differ; exit 1 if any")
    parser.add_argument("--site", metavar="FILE", help="site config YAML; needs --out")
    parser.add_argument("--out", metavar="DIR", help="where --site writes the rule files and alertmanager.yml")
    args = parser.parse_args(argv)
    if args.site or args.out:
        return _site(parser, args.site, args.out)
    if args.check:
        stale = [p for p, text in committed_files().items() if not p.exists() or p.read_text() != text]
        for p in stale:
            print(f"out of date: {p.relative_to(ROOT)}", file=sys.stderr)
        return 1 if stale else 0
    for p in write_committed():
        print(p.relative_to(ROOT))
    return 0


def _site(parser: argparse.ArgumentParser, site_file: str | None, out: str | None) -> int:
    from pathlib import Path

    from alerts import generate
    from analyzer.site import load_site

    if not (site_file and out):
        parser.error("--site and --out go together")
    try:
        paths = generate(Path(out), site=load_site(site_file))
    except ValueError as exc:
        print(f"python -m alerts: error: {exc}", file=sys.stderr)
        return 2
    for p in paths:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
