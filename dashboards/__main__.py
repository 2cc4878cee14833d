"""Regenerate dashboards/generated/*.json: ``python -m dashboards [OUTDIR]``."""

from __future__ import annotations

import sys
from pathlib import Path

from dashboards import write_all

if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "generated"
    for path in write_all(target):
        print(path)
