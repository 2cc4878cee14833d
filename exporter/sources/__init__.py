"""Registry of exporter sources: ``--source NAME`` -> a factory building it from the parsed CLI args.

Source modules are imported only when their source is asked for, so ``truegpu exporter
--source simulated`` never loads pynvml and the NVML source never loads the simulator.
A new source plugs in with one ``SourceSpec`` in ``SOURCES`` (and its CLI options in its
``add_arguments``); nothing else in the exporter changes.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from exporter.sources.base import Source


class SourceConfigError(ValueError):
    """The command line does not describe a usable source (unknown name, missing option)."""


@dataclass(frozen=True)
class SourceSpec:
    name: str
    summary: str
    factory: Callable[[argparse.Namespace], Source]
    #: Adds this source's options to the ``truegpu exporter`` parser (one argument group).
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None
    #: Parsed-argument names worth logging when the source starts.
    options: tuple[str, ...] = ()


def _simulated_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("simulated source")
    group.add_argument("--scenario", help="scenario name (fixtures/scenarios/NAME.yaml) or path to a scenario YAML")
    group.add_argument(
        "--node", action="extend", nargs="+", dest="nodes", metavar="HOST",
        help="serve only these simulated nodes (repeatable; default: every node of the scenario)",
    )
    group.add_argument("--speed", type=float, default=1.0, help="virtual seconds per wall-clock second (default 1)")
    group.add_argument("--seed", type=int, default=None, help="random seed (default: the scenario's)")
    group.add_argument(
        "--start", default=None, metavar="WHEN",
        help="where the simulation starts: an offset into the scenario (3600, '45m', '1h30m') or an "
        "absolute Unix time (default: the scenario's beginning)",
    )


def _simulated(args: argparse.Namespace) -> Source:
    if not getattr(args, "scenario", None):
        raise SourceConfigError("--source simulated needs --scenario NAME")
    if getattr(args, "speed", 1.0) <= 0:
        raise SourceConfigError("--speed must be > 0")
    from exporter.simulator.scenario import parse_duration
    from exporter.sources.simulated import SimulatedSource

    start = None
    if args.start is not None:
        try:
            start = parse_duration(args.start)
        except ValueError as exc:
            raise SourceConfigError(f"--start: {exc}") from None
    return SimulatedSource(args.scenario, hostnames=args.nodes, speed=args.speed, start=start, seed=args.seed)


SOURCES: dict[str, SourceSpec] = {
    spec.name: spec
    for spec in (
        SourceSpec("simulated", "deterministic cluster simulator driven by a scenario", _simulated,
                   _simulated_arguments, ("scenario", "nodes", "speed", "seed", "start")),
    )
}


def known_sources() -> tuple[str, ...]:
    return tuple(SOURCES)


def source_name(value: str) -> str:
    """argparse ``type=`` for ``--source``: an unknown name is an error that lists the known ones."""
    if value not in SOURCES:
        raise argparse.ArgumentTypeError(f"unknown source {value!r}; known sources: {', '.join(SOURCES)}")
    return value


def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every registered source's options to ``parser``."""
    for spec in SOURCES.values():
        if spec.add_arguments is not None:
            spec.add_arguments(parser)


def create_source(name: str, args: argparse.Namespace) -> Source:
    """Build source ``name`` from parsed args; SourceConfigError when it cannot be built from them."""
    spec = SOURCES.get(name)
    if spec is None:
        raise SourceConfigError(f"unknown source {name!r}; known sources: {', '.join(SOURCES)}")
    return spec.factory(args)


def describe_source(name: str, args: argparse.Namespace) -> str:
    """One human line about how source ``name`` was configured, for the start-up log."""
    spec = SOURCES[name]
    opts = " ".join(f"{o}={getattr(args, o, None)}" for o in spec.options if getattr(args, o, None) is not None)
    return f"{spec.summary}" + (f" ({opts})" if opts else "")
