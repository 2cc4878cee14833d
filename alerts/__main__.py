"""``python -m alerts``: regenerate the committed rules, Alertmanager config and promtool tests.

``python -m alerts --site FILE --out DIR`` writes this site's rules and Alertmanager config instead
(the site config's ``alerting`` section: scrape job names, runbook URLs, receivers, owner routes).
"""

from __future__ import annotations

import argparse
import sys

from alerts import ROOT, committed_files, write_committed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m alerts", description=__doc__)
    parser.add_argument("--check", action="store_true", help="only report files that differ; exit 1 if any")
    parser.add_argument("--site", metavar="FILE", help="site config YAML (its alerting section); needs --out")
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
        a = load_site(site_file).alerting
        options = {k: v for k, v in (("exporter_job", a.exporter_job), ("analyzer_job", a.analyzer_job),
                                     ("dcgm_job", a.dcgm_job), ("runbook_base", a.runbook_base),
                                     ("dashboard_base", a.dashboard_base)) if v}
        paths = generate(Path(out), webhook_urls=dict(a.receivers), owners=a.owners, **options)
    except ValueError as exc:
        print(f"python -m alerts: error: {exc}", file=sys.stderr)
        return 2
    for p in paths:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
