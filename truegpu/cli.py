"""Entry point of the ``truegpu`` console script.

Each subcommand module exposes ``register(subparsers)`` which adds its parser and sets
``func`` (called with the parsed namespace, returns an exit code). Modules keep heavy
imports inside their command functions so ``truegpu exporter`` starts fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from exporter import __version__

#: Modules providing subcommands, in the order ``--help`` lists them.
COMMAND_MODULES = (
    "exporter.server",
    "exporter.simulator.cli",
    "analyzer.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="truegpu", description="GPU observability that tells how much of your GPUs really works."
    )
    parser.add_argument("--version", action="version", version=f"truegpu {__version__}")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR (default INFO)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
