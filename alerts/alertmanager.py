"""Alertmanager configuration: routing by team and severity, grouping, inhibitions, webhook receivers.

Routing tree (first match wins unless ``continue``):

* ``severity=info``                      -> ``info-log`` (no page, no ticket)
* ``team=finops``                        -> ``finops-ticket``, grouped per (alertname, namespace, workload)
* thermal alerts of other teams          -> ``facilities-ticket`` and continue (SRE gets them too)
* ``team=training, severity=critical``   -> ``training-page`` (stragglers, GPU faults)
* ``team=training``                      -> ``training-ticket``
* ``team=sre, severity=critical``        -> ``sre-page``
* ``team=sre``                           -> ``sre-ticket``
* ``team=facilities``                    -> ``facilities-ticket``
* anything else                          -> ``sre-ticket`` (the root receiver)

Inhibitions: a GPU that fell off the bus mutes its own symptom alerts (straggler, thermal,
utilization, degraded links) on the same ``hostname``+``gpu`` and the collection-failing alert of
its node; a down exporter mutes them for
its whole ``hostname``; a critical alert mutes the warning of the same alertname on the same
``hostname``+``gpu``. Every receiver is a webhook whose URL :func:`config` can override.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from alerts.rules import (
    COLLECTION_FAILING,
    DCGM_EXPORTER_DOWN,
    EXPORTER_DOWN,
    FELL_OFF_BUS,
    GPU_SYMPTOM_ALERTS,
    HARDWARE_ALERTS,
    SELECTORS,
    Timing,
    alternatives,
    fmt_duration,
)
from exporter.schema import GPU, HOSTNAME, WORKLOAD

TRAINING_PAGE = "training-page"
TRAINING_TICKET = "training-ticket"
SRE_PAGE = "sre-page"
SRE_TICKET = "sre-ticket"
FACILITIES_TICKET = "facilities-ticket"
FINOPS_TICKET = "finops-ticket"
INFO_LOG = "info-log"
RECEIVERS: tuple[str, ...] = (
    TRAINING_PAGE, TRAINING_TICKET, SRE_PAGE, SRE_TICKET, FACILITIES_TICKET, FINOPS_TICKET, INFO_LOG,
)
#: Default webhook target (Alertmanager's documented example webhook port); ``<base>/<receiver>``.
DEFAULT_WEBHOOK_BASE = "http://127.0.0.1:5001"
#: ``webhook_urls`` key that sets the URL of every receiver not named explicitly.
ANY_RECEIVER = "*"
THERMAL_ALERTS = ("GpuThermalThrottling", "GpuNearThermalLimit", "GpuThermal")


def webhook_url_map(webhook_urls: Mapping[str, str] | None = None,
                    extra: Sequence[str] = ()) -> dict[str, str]:
    receivers = (*RECEIVERS, *extra)
    urls = dict(webhook_urls or {})
    unknown = set(urls) - set(receivers) - {ANY_RECEIVER}
    if unknown:
        raise ValueError(f"unknown receivers {sorted(unknown)}; known: {', '.join(receivers)}")
    fallback = urls.get(ANY_RECEIVER)
    return {r: urls.get(r) or fallback or f"{DEFAULT_WEBHOOK_BASE}/{r}" for r in receivers}


def config(timing: Timing | None = None, webhook_urls: Mapping[str, str] | None = None,
           owners: Sequence[tuple[str, str]] = (), cluster_label: str = SELECTORS.cluster_label) -> dict[str, Any]:
    """The Alertmanager configuration as a dict (YAML-ready).

    Grouping and inhibition keep ``cluster_label`` (when set): host ``gpu-01`` of two clusters is
    two hosts, and one cluster's lost node never mutes the other's alerts.

    ``owners``: (namespace regex, receiver) pairs: a hardware alert of a GPU a matching namespace
    holds (the alert's ``namespace`` label) goes to that receiver instead of the team's, e.g. an
    inference service's PCIe fault to its own on-call rather than training's."""
    t = timing or Timing()
    clash = sorted({r for _, r in owners} & set(RECEIVERS))
    if clash:
        raise ValueError(f"owner receivers must be new receivers, not {clash}")

    def d(seconds: float) -> str:
        return fmt_duration(max(seconds * t.scale, 0.1))

    extra = tuple(dict.fromkeys(r for _, r in owners))
    urls = webhook_url_map(webhook_urls, extra)
    hardware = alternatives(HARDWARE_ALERTS)

    def route(receiver: str, *matchers: str, **extra: Any) -> dict[str, Any]:
        return {"receiver": receiver, "matchers": list(matchers), **extra}

    symptoms = alternatives(GPU_SYMPTOM_ALERTS)
    cluster = [cluster_label] if cluster_label else []
    gpu, host = [*cluster, HOSTNAME, GPU], [*cluster, HOSTNAME]
    return {
        "global": {"resolve_timeout": d(300)},
        "route": {
            "receiver": SRE_TICKET,
            "group_by": ["alertname", *cluster, WORKLOAD, HOSTNAME],
            "group_wait": d(30),
            "group_interval": d(300),
            "repeat_interval": d(4 * 3600),
            "routes": [
                route(INFO_LOG, 'severity="info"', repeat_interval=d(24 * 3600)),
                route(FINOPS_TICKET, 'team="finops"', group_by=["alertname", *cluster, "namespace", WORKLOAD],
                      group_wait=d(300), group_interval=d(1800), repeat_interval=d(24 * 3600)),
                route(FACILITIES_TICKET, f'alertname=~"{alternatives(THERMAL_ALERTS)}"', 'team!="facilities"',
                      **{"continue": True}),
                *(route(receiver, f'namespace=~"{pattern}"', f'alertname=~"{hardware}"', group_wait=d(10))
                  for pattern, receiver in owners),
                route(TRAINING_PAGE, 'team="training"', 'severity="critical"', group_wait=d(10),
                      repeat_interval=d(3600)),
                route(TRAINING_TICKET, 'team="training"'),
                route(SRE_PAGE, 'team="sre"', 'severity="critical"', group_wait=d(10), repeat_interval=d(3600)),
                route(SRE_TICKET, 'team="sre"'),
                route(FACILITIES_TICKET, 'team="facilities"'),
            ],
        },
        "inhibit_rules": [
            {"source_matchers": [f'alertname="{FELL_OFF_BUS}"'],
             "target_matchers": [f'alertname=~"{symptoms}"'],
             "equal": gpu},
            {"source_matchers": [f'alertname="{FELL_OFF_BUS}"'],
             "target_matchers": [f'alertname="{COLLECTION_FAILING}"'],
             "equal": host},
            {"source_matchers": [f'alertname=~"{EXPORTER_DOWN}|{DCGM_EXPORTER_DOWN}"'],
             "target_matchers": [f'alertname=~"{symptoms}|{FELL_OFF_BUS}"'],
             "equal": host},
            {"source_matchers": ['severity="critical"'],
             "target_matchers": ['severity="warning"'],
             "equal": ["alertname", *gpu]},
            # the analyzer's critical thermal finding says more than the exporter rules' warnings
            {"source_matchers": ['alertname="GpuThermal"', 'severity="critical"'],
             "target_matchers": ['alertname=~"GpuThermalThrottling|GpuNearThermalLimit"'],
             "equal": gpu},
        ],
        "receivers": [
            {"name": r, "webhook_configs": [{"url": urls[r], "send_resolved": r != INFO_LOG}]}
            for r in (*RECEIVERS, *extra)
        ],
    }
