"""Entry point of the ``truegpu`` console script.

Each subcommand module exposes ``register(subparsers)`` which adds its parser and sets
``func`` (called with the parsed namespace, returns an exit code). Only the module of the
command being run is imported, so ``truegpu exporter`` on a GPU node never loads the
analyzer (whose modules also keep pandas/scikit-learn inside their functions).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from exporter import __version__

#: Subcommand -> the module that registers it, in the order ``--help`` lists them.
COMMANDS: dict[str, str] = {
    "exporter": "exporter.server",
    "simulate": "exporter.simulator.cli",
    "analyze": "analyzer.cli.analyze",
    "demo": "analyzer.cli.analyze",
    "evaluate": "analyzer.cli.analyze",
    "serve": "analyzer.cli.serve",
    "report": "analyzer.cli.report",
    "job": "analyzer.cli.job",
}


def _modules_for(argv: list[str] | None) -> list[str]:
    """The command's module alone when argv names one; all of them for --help or a typo."""
    words = [a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")]
    for word in words[:2]:  # the command follows at most one option value (--log-level X)
        if word in COMMANDS:
            return [COMMANDS[word]]
    return list(dict.fromkeys(COMMANDS.values()))


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="truegpu", description="GPU observability that tells how much of your GPUs really works."
    )
    parser.add_argument("--version", action="version", version=f"truegpu {__version__}")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR (default INFO)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _modules_for(argv):
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser(argv).parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # `truegpu ... | head`: the reader left, which is not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
