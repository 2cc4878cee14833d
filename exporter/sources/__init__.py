"""Registry of exporter sources: ``--source NAME`` -> a factory building it from the parsed CLI args.

Source modules are imported only when their source is asked for, so ``truegpu exporter
--source simulated`` never loads pynvml and the NVML source never loads the simulator.
A new source plugs in with one ``SourceSpec`` in ``SOURCES`` plus its CLI options here (so
building the parser imports no source module) and a ``from_args`` factory in its module;
nothing else in the exporter changes.
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
    from exporter.sources.simulated import SimulatedSource
    from exporter.timeparse import parse_duration

    start = None
    if args.start is not None:
        try:
            start = parse_duration(args.start)
        except ValueError as exc:
            raise SourceConfigError(f"--start: {exc}") from None
    return SimulatedSource(args.scenario, hostnames=args.nodes, speed=args.speed, start=start, seed=args.seed)


def _with_deadline(module: str) -> Callable[[argparse.Namespace], Source]:
    """Factory for a real source: built by ``module.from_args`` and wrapped so a slow device or
    endpoint never holds a collection past ``--deadline`` (the last good values are served, marked)."""

    def factory(args: argparse.Namespace) -> Source:
        from importlib import import_module

        from exporter.sources.deadline import DeadlineSource

        deadline = getattr(args, "deadline", DEFAULT_DEADLINE)
        if deadline <= 0:
            raise SourceConfigError("--deadline must be > 0")
        return DeadlineSource(import_module(module).from_args(args), deadline)

    return factory


def _nvml_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``nvml`` source's options (and who-holds-the-GPU attribution) on ``truegpu exporter``."""
    group = parser.add_argument_group("nvml source")
    group.add_argument("--nvml-hostname", default=None, help="hostname label for NVML series (default: this host's)")
    group.add_argument("--gpm-interval", type=float, default=0.1,
                       help=f"seconds between the two GPM samples of a collection (>= {0.1})")
    group.add_argument("--no-xid-events", dest="xid_events", action="store_false",
                       help="do not watch NVML XID events (truegpu_xid_errors_total then absent)")
    group.add_argument("--kubelet-socket", default=None, metavar="PATH",
                       help="kubelet pod-resources socket for pod attribution "
                       "(e.g. /var/lib/kubelet/pod-resources/kubelet.sock; default: off)")
    group.add_argument("--dra-driver", action="append", default=None, metavar="NAME",
                       help="DRA driver whose ResourceClaim devices are GPUs to attribute (repeatable; "
                       "default gpu.nvidia.com; --dra-driver= alone ignores DRA claims)")
    group.add_argument("--cdi-spec-dir", action="append", default=None, metavar="DIR",
                       help="CDI spec directory (read-only) mapping DRA devices to GPUs (repeatable; "
                       "default /etc/cdi and /var/run/cdi; --cdi-spec-dir= alone: device names only)")
    group.add_argument("--slurm-job-dir", default=None, metavar="DIR",
                       help="Slurm job-mapping directory (files named by GPU index, each holding a job id)")
    group.add_argument("--slurm-meta-dir", default=None, metavar="DIR",
                       help="the prolog's job metadata (<job id>.env: user, account, partition; default: slurm-meta "
                       "beside --slurm-job-dir)")
    group.add_argument("--attribution-ttl", type=float, default=10.0,
                       help="seconds between re-reads of the kubelet / job directory (default 10)")
    group.add_argument("--job-pod-label", default=None, metavar="LABEL",
                       help="pod label naming the job (e.g. training.kubeflow.org/job-name or a team label); "
                       "pod labels are then read from the Kubernetes API server (RBAC: get pods); "
                       "pods without it get the job from their name")
    group.add_argument("--kube-api", default=None, metavar="URL",
                       help="Kubernetes API server for pod labels (default: in-cluster, "
                       "https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT); given without "
                       "--job-pod-label, the well-known training-operator job labels are used")
    group.add_argument("--kube-token-file", default=None, metavar="PATH",
                       help="bearer token for --kube-api (default: the pod's service-account token)")
    group.add_argument("--kube-ca-file", default=None, metavar="PATH",
                       help="CA bundle for --kube-api (default: the pod's service-account ca.crt)")
    group.add_argument("--job-map", default=None, metavar="FILE",
                       help="YAML/JSON mapping of 'namespace/pod: job' that overrides every other job source")
    group.add_argument("--proc-root", default="/proc", metavar="DIR",
                       help="the host's /proc, where the processes on a GPU several pods or jobs share are joined "
                       "with their pod (HOSTNAME) or Slurm job; NVML reports host PIDs, so a containerised exporter "
                       "runs with hostPID: true or gets the host's /proc mounted here, as root to read their "
                       "environment (default /proc)")


def _dcgm_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``dcgm`` source's options on the ``truegpu exporter`` parser."""
    group = parser.add_argument_group("dcgm source")
    group.add_argument("--dcgm-url", default=DEFAULT_DCGM_URL,
                       help=f"dcgm-exporter metrics URL (default {DEFAULT_DCGM_URL})")
    group.add_argument("--dcgm-timeout", type=float, default=2.0, help="seconds per HTTP attempt (default 2)")
    group.add_argument("--dcgm-retries", type=int, default=2, help="retries after a failed attempt (default 2)")
    group.add_argument("--dcgm-budget", type=float, default=5.0,
                       help="total seconds for one fetch including retries (default 5)")
    group.add_argument("--dcgm-hostname", default=None,
                       help="hostname for samples without a Hostname label (default: this host's name)")
    group.add_argument("--dcgm-force-hostname", action="store_true",
                       help="use --dcgm-hostname even when samples carry a Hostname label")


DEFAULT_DCGM_URL = "http://127.0.0.1:9400/metrics"
#: Seconds a real source may take before the scrape is served its last good values.
DEFAULT_DEADLINE = 5.0

SOURCES: dict[str, SourceSpec] = {
    spec.name: spec
    for spec in (
        SourceSpec("simulated", "deterministic cluster simulator driven by a scenario", _simulated,
                   _simulated_arguments, ("scenario", "nodes", "speed", "seed", "start")),
        SourceSpec("nvml", "NVIDIA driver via NVML (GPM profiling on Hopper+, XID events, MIG, topology)",
                   _with_deadline("exporter.sources.nvml"), _nvml_arguments,
                   ("gpm_interval", "kubelet_socket", "slurm_job_dir", "slurm_meta_dir", "job_pod_label", "kube_api",
                    "job_map", "dra_driver", "cdi_spec_dir", "proc_root", "deadline")),
        SourceSpec("dcgm", "scrape a node-local NVIDIA dcgm-exporter",
                   _with_deadline("exporter.sources.dcgm"), _dcgm_arguments,
                   ("dcgm_url", "deadline")),
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
