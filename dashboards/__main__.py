"""Regenerate dashboards/generated/*.json: ``python -m dashboards [OUTDIR]``.

``python -m dashboards --site FILE --out DIR`` renders them for a site config instead (its
``selectors.cluster_label``); the committed files keep the defaults.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dashboards import GENERATED, write_all


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboards", description=__doc__)
    parser.add_argument("outdir", nargs="?", help="where to write (default: dashboards/generated)")
    parser.add_argument("--site", metavar="FILE", help="site config YAML (its selectors.cluster_label); needs --out")
    parser.add_argument("--out", metavar="DIR", help="where --site writes the dashboards")
    args = parser.parse_args(argv)
    if args.site or args.out:
        if not (args.site and args.out) or args.outdir:
            parser.error("--site and --out go together (and without OUTDIR)")
        from analyzer.site import load_site

        try:
            cluster_label = load_site(args.site).selectors.cluster_label
        except ValueError as exc:
            print(f"python -m dashboards: error: {exc}", file=sys.stderr)
            return 2
        paths = write_all(Path(args.out), cluster_label)
    else:
        paths = write_all(Path(args.outdir) if args.outdir else GENERATED)
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
