"""GPU faults: hard hardware signals that say a GPU must be drained, reset, reseated or replaced.

Unlike the waste detectors this one does not judge *levels* of activity: it reads the
signals that only move when hardware misbehaves, and merges everything one physical GPU
says about one problem into one finding (an XID 48, the uncorrectable ECC error that comes
with it and the row remap left pending = one critical finding with all the evidence).

Per physical GPU (MIG instances repeat their GPU's device-level signals, so one row per
GPU and step is judged; a MIG GPU counts as busy when any of its instances is), a step
shows a problem when any of these *causes* holds:

Hard signals, one step is enough (the counters never move on a healthy GPU):

- an XID event (``Fleet.events``), judged with the catalogue in ``analyzer.analysis.xid``:
  critical (48, 64, 79, 95, ...), warning (63, 74, 92, 94, ...) or, for the codes that are
  usually the application's own bug (13, 31, 43, 45), severity ``info`` and a summary that
  says so;
- ``ecc_uncorrectable_rate`` > 0: any uncorrectable (double-bit) error means data was lost;
  NVIDIA's guidance is drain + reset (critical);
- ``row_remap_failure`` >= 1: the memory can no longer be repaired; RMA (critical);
- ``row_remap_pending`` >= 1 or ``remapped_rows_rate`` > 0: a row was remapped and the
  remap only takes effect after a GPU reset (warning).

Soft signals, they must persist (a transient is link retraining, not a fault):

- ``nvlink_links_down`` >= 1 for ``links_down_min_s`` (3 min): a link that is down for
  three scrapes is not retraining (retraining takes milliseconds); a gang using the GPU
  loses that share of its all-reduce bandwidth (critical);
- ``nvlink_error_rate`` (CRC flit/data + replay + recovery, per second) >=
  ``nvlink_error_rate_min`` (1/s) for ``nvlink_errors_min_s`` (5 min): healthy links
  see sporadic CRC errors, a handful per hour, all corrected by replay; one per second
  sustained for 5 minutes is >= 300 errors, orders of magnitude above that background,
  and the replays eat link bandwidth (warning);
- NVLink errors *rising*: over the trailing ``storm_window_s`` (10 min) the later half's
  errors are >= ``nvlink_rising_growth`` (1.5) x the earlier half's, significantly (the
  difference >= 3 Poisson standard deviations of the counts, so counting noise of a steady
  link never reads as growth), the later half's mean rate >= ``nvlink_rising_rate_min``
  (0.05/s = 180/h, ~50x the healthy "handful per hour") and both halves show errors in >=
  ``rising_active_fraction`` (0.8) of their scrapes. A link whose rate steps up and stays is
  not rising once both halves see it, and while the step straddles the window one half lacks
  errors: only a rate that keeps climbing qualifies. DCGM's own limit is 100 CRC errors/s
  ("RM has informed us that CRC errors only matter at rates of 100+ per second",
  ``DCGM_LIMIT_MAX_NVLINK_CRC_ERROR``): a link on its way there is found while it is still
  far below, within ~10 minutes of leaving normal (a doubling every 5 minutes from 0.1/s is
  flagged after 10 scrapes; the steady >= 1/s rule above would wait for the rate to reach
  1/s first). The flagged steps reach back to the first scrape of the qualifying window with
  errors, so the finding starts where the rate left normal (warning, same cause as above);
- a correctable-ECC storm (``ecc_correctable_rate``, single-bit errors corrected by ECC): the
  mean rate over the trailing ``storm_window_s`` >= ``ecc_correctable_rate_min`` (0.01/s =
  36/h) with errors in >= ``storm_active_fraction`` (0.5) of its scrapes. A healthy GPU sees
  ~0 SBE/s: field studies (Titan's 18,688 K20X over two years, Tiwari et al. HPCA 2015; Blue
  Waters; Delta's A100/H100) find most cards log none for months and a handful of cards
  account for nearly all SBEs, and pre-Ampere drivers retired a page after just two SBEs at
  one address. 36/h sustained for 10 minutes is orders of magnitude above a healthy card's
  lifetime background; errors in half the scrapes keep one burst (a weak cell read
  repeatedly by one kernel: many errors in one scrape) out. The finding's evidence carries
  the rate's growth (window rate at its peak / when it first qualified; "accelerating" when
  >= ``accelerating_growth`` 2): a growing SBE rate is cells degrading, the precursor of
  uncorrectable errors and row-remap exhaustion (warning: "memory cells degrading", schedule
  a drain, a GPU reset and field diagnostics). Like the NVLink rule, the flagged steps reach
  back to the window's first scrape with errors;
- PCIe generation or width below the link's max while the GPU is busy
  (``gpu_busy`` >= ``pcie_busy_min`` 0.1) for ``pcie_min_s`` (5 min): idle GPUs
  legitimately drop the link to gen1 to save power (ASPM / the idle P-state) and train
  back up within microseconds of work arriving, so a low gen on an idle GPU is normal and
  is judged *unknown*, never fault nor healthy. 0.1 is well above the util of a GPU that
  only runs housekeeping (0) and the link is at full speed as soon as kernels run; the max
  is NVML's ``nvmlDeviceGetMaxPcieLinkGeneration``/``Width``, the max the GPU *and* the
  slot support, so an H100 in a gen4 server is not flagged (warning: host<->device
  bandwidth halves per generation lost; reseat, check the riser/cable);
- PCIe replays >= ``pcie_replay_rate_min`` (8 per minute, DCGM's own health limit
  ``DCGM_LIMIT_MAX_PCIREPLAY_RATE``) for ``pcie_min_s``: a link retransmitting that often
  is marginal (bad riser, dirty contacts), and this counter *is* in dcgm-exporter's default
  counters, so a degraded link is still seen without the link-state fields (warning);
- telemetry lost: every signal of the GPU is NaN while another GPU of the same node still
  reports, for ``lost_min_s`` (3 min). The exporter on the node works (its other GPUs
  report), so the driver lost this GPU (XID 79 "fallen off the bus" does exactly this); a
  scrape hiccup or exporter restart silences *every* GPU of the node. When the whole node
  is silent nothing is known about any of its GPUs: that is node availability (an
  exporter, network or node problem), not a fault of each GPU, and this detector reports
  nothing (unknown is unknown). Without an XID 79 to confirm it the finding has
  confidence "low" (it may be the exporter losing the GPU, not the GPU).

Merging: the steps where any cause holds become episodes per GPU (``analyzer.analysis.episodes``)
with ``merge_gap_s`` (5 min) of healthy or unknown steps bridged: an XID and its
consequences (the ECC counter increment in the same or next scrape, the GPU vanishing 30 s
after an XID 79, a remap turning pending) land within a scrape interval or two, even at a
2-minute scrape interval. No minimum duration: one double-bit error is a fault. A
hardware/driver XID (not an application one) holds the problem for ``xid_hold_s`` (10 min)
after the event: the GPU stays suspect until it is reset, which the data can only show
through state signals (remap pending, telemetry back); where those are not collected the
finding would otherwise close one scrape after the page, before anyone could act. In ``serve`` an
episode that opens the window and continues one an earlier run showed keeps that finding's start and its
hardware XIDs (``_carried``): the XID that slid out of the window still names the problem. The
finding's severity is the worst cause's and its ``attribution`` the worst cause (XIDs first
on a tie: they name the problem); signal causes an XID explains (``CONSEQUENCES``: ECC
counters and remap state after 48/63/94/95, lost telemetry after 79) are listed as its
evidence and take the XID's more precise severity and action (an XID 94 is a *contained*
error: warning, although the uncorrectable counter alone reads critical). The summary
carries the top cause's action (drain and reset, RMA, reseat, check riser/cable/bridge).

Unknown telemetry is unknown: a counter the input does not collect (dcgm-exporter's
default counters have no ECC, NVLink error or PCIe link-state fields) never reads as "0
errors"; what still works then is said in ``Fleet.notes``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from analyzer.analysis.episodes import (
    EarlierRuns,
    Episodes,
    begun_earlier,
    column,
    find_episodes,
    format_duration,
)
from analyzer.analysis.xid import APPLICATION_XIDS, describe
from analyzer.data.frame import Fleet, category_codes
from analyzer.data.signals import NAMES
from analyzer.detectors import Paging, gpu_busy, register
from analyzer.findings import GPU_FAULT, SEVERITY_ORDER, Finding, Severity, rfc3339

#: Signal causes: token -> (severity, headline, action). Order = tie-break among equal severities.
CAUSES: dict[str, tuple[Severity, str, str]] = {
    "telemetry_lost": ("critical", "telemetry lost while the node's other GPUs still report",
                       "check dmesg for XID 79 and nvidia-smi on the node; drain the node and reset the GPU "
                       "(reboot); if it drops out again reseat it, check the riser/PCIe slot and power, then RMA"),
    "row_remap_failure": ("critical", "row remapping failed",
                          "drain the GPU and RMA it: its memory errors can no longer be remapped"),
    "ecc_uncorrectable": ("critical", "uncorrectable ECC errors",
                          "drain the node and reset the GPU to apply the row remap; RMA if uncorrectable errors "
                          "recur"),
    "nvlink_down": ("critical", "NVLink link(s) down",
                    "drain the node and reset the GPU; if the link stays down reseat/check the NVLink bridge or "
                    "baseboard, then RMA"),
    "nvlink_errors": ("warning", "NVLink CRC/replay errors growing",
                      "drain and reset the GPU at the next opportunity; if errors persist check/reseat the NVLink "
                      "bridge or baseboard, then RMA"),
    "ecc_storm": ("warning", "correctable ECC error storm",
                  "memory cells degrading: schedule a drain and a GPU reset (applies pending row remaps), then run "
                  "field diagnostics (dcgmi diag -r 3 / NVIDIA field diag); RMA if the storm returns"),
    "pcie_downgrade": ("warning", "PCIe link running below its max while busy",
                       "reseat the GPU, check the riser/PCIe cable and slot (and BIOS PCIe settings); replace the "
                       "riser if it persists"),
    "pcie_replays": ("warning", "PCIe replays growing",
                     "reseat the GPU, check the riser/PCIe cable and slot; replace the riser if it persists"),
    "row_remap_pending": ("warning", "row remap pending",
                          "schedule a GPU reset to apply the pending row remap"),
    "remapped_rows": ("warning", "memory row remapped",
                      "schedule a GPU reset to apply the row remap; RMA if remaps keep growing"),
}
#: Attribution tokens (the findings taxonomy): NVLink causes are "nvlink", PCIe link causes "pcie_downgrade",
#: XIDs "xidNN"; the other causes are their own token.
ATTRIBUTION: dict[str, str] = {"nvlink_down": "nvlink", "nvlink_errors": "nvlink", "pcie_replays": "pcie_downgrade"}
_ECC_SIGNS = frozenset({"ecc_uncorrectable", "row_remap_pending", "remapped_rows", "ecc_storm"})
#: Signal causes an XID explains: with the XID present they are its evidence, and the XID's own (more
#: precise) severity and action apply: XID 94 is a *contained* uncorrectable error (warning: the process
#: died, the GPU serves others), although the uncorrectable counter alone would read critical.
CONSEQUENCES: dict[int, frozenset[str]] = {
    **{c: _ECC_SIGNS for c in (48, 63, 92, 94, 95, 140)},
    64: _ECC_SIGNS | {"row_remap_failure"},
    79: frozenset({"telemetry_lost"}),
    74: frozenset({"nvlink_errors"}),
}
_SCORE: dict[str, float] = {"critical": 1.0, "warning": 0.6, "info": 0.2}
#: Signals that show faults, with what it means when the input lacks them.
_FAULT_SIGNALS: tuple[str, ...] = ("ecc_uncorrectable_rate", "ecc_correctable_rate", "row_remap_pending",
                                   "row_remap_failure", "remapped_rows_rate", "nvlink_error_rate", "nvlink_links_down",
                                   "pcie_gen", "pcie_width")


@register
@dataclass
class GpuFault:
    """Settings are documented in the module docstring, and:

    - ``application_xids`` True: report the XIDs that are usually the job's own bug (13, 31, 43, 45)
      as ``info`` findings; False ignores them entirely (sites whose users own their crashes).
    - ``storm_window_s`` 600: the trailing window error storms are judged over (10 scrapes at the
      usual 60 s): long enough that a burst is not a storm, short enough to page within ~10 min.
    """

    kind = GPU_FAULT
    remembers = True  #: a service's runs carry each GPU's finding's start and hardware XIDs (``_carried``)
    paging = Paging(alert="GpuFault", team="training", says="has a hardware fault (XID, ECC, NVLink, PCIe, lost GPU) "
                    "({score}); see the analyzer's finding for the evidence.")
    nvlink_error_rate_min: float = 1.0
    nvlink_errors_min_s: float = 300.0
    links_down_min_s: float = 180.0
    pcie_busy_min: float = 0.1
    pcie_min_s: float = 300.0
    pcie_replay_rate_min: float = 8.0 / 60.0
    xid_hold_s: float = 600.0
    lost_min_s: float = 180.0
    merge_gap_s: float = 300.0
    storm_window_s: float = 600.0
    storm_active_fraction: float = 0.5
    ecc_correctable_rate_min: float = 0.01
    accelerating_growth: float = 2.0
    nvlink_rising_rate_min: float = 0.05
    nvlink_rising_growth: float = 1.5
    rising_active_fraction: float = 0.8
    #: Report application XIDs (13, 31, 43, 45, severity info); off: ignore them entirely.
    application_xids: bool = True

    # per-row causes ----------------------------------------------------------------------
    def detect(self, fleet: Fleet, memory: dict | None = None) -> list[Finding]:
        """Findings of the data; ``memory``: the service's part for this kind (``_carried``)."""
        self._note_missing(fleet)
        frame = fleet.frame
        if not len(frame):
            return []
        g = _PhysGrid(fleet)
        causes: dict[str, np.ndarray] = {}
        gap = 2

        def rows(name: str) -> np.ndarray:
            return g.take(column(fleet, name))

        ecc = rows("ecc_uncorrectable_rate")
        causes["ecc_uncorrectable"] = _tri(ecc > 0, ~np.isnan(ecc))
        fail = rows("row_remap_failure")
        causes["row_remap_failure"] = _tri(fail >= 0.5, ~np.isnan(fail))
        pend = rows("row_remap_pending")
        causes["row_remap_pending"] = _tri(pend >= 0.5, ~np.isnan(pend))
        remap = rows("remapped_rows_rate")
        causes["remapped_rows"] = _tri(remap > 0, ~np.isnan(remap))

        nvl = rows("nvlink_error_rate")
        causes["nvlink_errors"] = self._persistent(g, _tri(nvl >= self.nvlink_error_rate_min, ~np.isnan(nvl)),
                                                   self.nvlink_errors_min_s, gap)
        nvl_rising, _ = self._storm(g, nvl, fleet.step, rising=True)
        causes["nvlink_errors"] = np.fmax(causes["nvlink_errors"], nvl_rising)
        sbe = rows("ecc_correctable_rate")
        causes["ecc_storm"], sbe_window = self._storm(g, sbe, fleet.step, rising=False)
        down = rows("nvlink_links_down")
        causes["nvlink_down"] = self._persistent(g, _tri(down >= 1, ~np.isnan(down)), self.links_down_min_s, gap)

        gen, gen_max = rows("pcie_gen"), rows("pcie_gen_max")
        wid, wid_max = rows("pcie_width"), rows("pcie_width_max")
        gen_known = ~np.isnan(gen) & ~np.isnan(gen_max)
        wid_known = ~np.isnan(wid) & ~np.isnan(wid_max)
        low = (gen_known & (gen < gen_max)) | (wid_known & (wid < wid_max))
        u = gpu_busy(fleet)
        busy, busy_known = g.any_true(u >= self.pcie_busy_min, ~np.isnan(u))
        # Idle (or unknown busy): the link may legitimately sit at a low gen -> unknown, not healthy.
        causes["pcie_downgrade"] = self._persistent(
            g, _tri(low, (gen_known | wid_known) & busy_known & busy), self.pcie_min_s, gap)

        replay = rows("pcie_replay_rate")
        causes["pcie_replays"] = self._persistent(g, _tri(replay >= self.pcie_replay_rate_min, ~np.isnan(replay)),
                                                  self.pcie_min_s, gap)

        has = np.zeros(len(frame), bool)
        for s in fleet.signals:
            has |= ~np.isnan(column(fleet, s))
        has_gpu, _ = g.any_true(has, np.ones(len(frame), bool))
        peers = g.node_count(has_gpu) - has_gpu > 0
        causes["telemetry_lost"] = self._persistent(g, _tri(~has_gpu, peers | has_gpu), self.lost_min_s, gap)

        ev_rep, ev_code, ev_count, ev_time = self._events(fleet, g)
        xid_true = np.zeros(g.n, bool)
        xid_true[ev_rep] = True
        xid_true |= g.hold(ev_rep[[describe(int(c)).category != "application" for c in ev_code]],
                           math.ceil(self.xid_hold_s / fleet.step))

        stack = np.stack(list(causes.values()))
        any_true = (stack == 1.0).any(axis=0) | xid_true
        any_known = (~np.isnan(stack)).any(axis=0)
        cond = np.where(any_true, 1.0, np.where(any_known, 0.0, np.nan))
        if not any_true.any():
            return []
        merge = max(math.ceil(self.merge_gap_s / fleet.step), 1)
        eps = g.episodes(cond, max_gap_steps=merge, max_unknown_steps=merge, min_duration_s=0.0)
        if not len(eps):
            return []
        member = np.full(g.n, -1, np.int64)
        member[eps.order] = eps.member
        present = {c: eps.mean((v == 1.0).astype(np.float64)) > 0 for c, v in causes.items()}
        ev_ep = member[ev_rep]
        stats = {
            "ecc_uncorrectable_errors": eps.sum(np.nan_to_num(np.maximum(ecc, 0.0)) * fleet.step),
            "remapped_rows": eps.sum(np.nan_to_num(np.maximum(remap, 0.0)) * fleet.step),
            "nvlink_error_rate_max": _ep_reduce(eps, nvl, np.fmax),
            "nvlink_rising": _ep_reduce(eps, np.where(nvl_rising == 1.0, 1.0, np.nan), np.fmax),
            "ecc_rate_max": _ep_reduce(eps, np.abs(sbe_window), np.fmax),
            "ecc_rate_start": _rate_start(eps, sbe_window),
            "nvlink_links_down_max": _ep_reduce(eps, down, np.fmax),
            "pcie_gen_min": _ep_reduce(eps, np.where(causes["pcie_downgrade"] == 1.0, gen, np.nan), np.fmin),
            "pcie_width_min": _ep_reduce(eps, np.where(causes["pcie_downgrade"] == 1.0, wid, np.nan), np.fmin),
            "pcie_gen_max": _ep_reduce(eps, gen_max, np.fmax),
            "pcie_width_max": _ep_reduce(eps, wid_max, np.fmax),
            "pcie_replay_rate": eps.mean(rows("pcie_replay_rate"), where="all"),
            "telemetry_lost_steps": np.rint(eps.mean((causes["telemetry_lost"] == 1.0).astype(float))
                                            * eps.table["true_steps"].to_numpy()),
        }
        out = []
        runs = EarlierRuns(memory)
        for i, ep in enumerate(eps.table.itertuples(index=False)):
            sel = ev_ep == i
            ep, xids = self._carried(runs, ep, _xid_summary(ev_code[sel], ev_count[sel], ev_time[sel]), fleet)
            found = [c for c in CAUSES if present[c][i]]
            f = self._finding(fleet, ep, i, found, xids, stats)
            if f is not None:
                out.append(f)
                runs.keep(_gpu_key(ep), ep, fleet,
                          xids=[x for x in f.evidence["xids"] if x["category"] != "application"])
        return out

    def _carried(self, runs: EarlierRuns, ep: Any, xids: list[dict[str, Any]],
                 fleet: Fleet) -> tuple[Any, list[dict[str, Any]]]:
        """An episode that continues one the previous run showed (``EarlierRuns.continued``): its start and
        hardware XIDs. Why: an XID 95 (the GPU needs a reset) slid out of serve's window half an hour later and its
        critical finding fell to the warning of the row remap it left pending, though nothing was reset."""
        entry = runs.continued(_gpu_key(ep), ep, fleet, self.merge_gap_s)
        if entry is None:
            return ep, xids
        have = {x["code"] for x in xids}
        xids = sorted(xids + [x for x in entry["xids"] if x["code"] not in have], key=lambda x: x["code"])
        return begun_earlier(ep, float(ep.start) - entry["start"]), xids

    def _finding(self, fleet: Fleet, ep: Any, i: int, found: list[str], xids: list[dict[str, Any]],
                 stats: dict[str, np.ndarray]) -> Finding | None:
        xids = [x for x in xids if self.application_xids or x["category"] != "application"]
        if not found and not xids:
            return None
        # (severity rank, tie-break: XIDs before signal causes, then catalogue order)
        ranked = [(SEVERITY_ORDER[x["severity"]], 0, k, f"xid{x['code']}") for k, x in enumerate(xids)]
        explained = set().union(*(CONSEQUENCES.get(x["code"], frozenset()) for x in xids))
        ranked += [(SEVERITY_ORDER[CAUSES[c][0]], 1, k, c) for k, c in enumerate(CAUSES)
                   if c in found and c not in explained]
        ranked.sort()
        top = ranked[0][3]
        severity: Severity = ("critical", "warning", "info")[ranked[0][0]]  # type: ignore[assignment]
        lost = "telemetry_lost" in found
        confirmed_lost = any(x["code"] == 79 for x in xids)
        ev: dict[str, Any] = {
            "attribution": ATTRIBUTION.get(top, top),
            "causes": [r[3] for r in ranked] + [c for c in found if c in explained],
            "xids": xids,
            "minutes": float(ep.duration_s) / 60.0,
        }
        for key in ("ecc_uncorrectable_errors", "remapped_rows"):
            if stats[key][i] > 0:
                ev[key] = float(stats[key][i])
        if "row_remap_pending" in found:
            ev["row_remap_pending"] = True
        if "row_remap_failure" in found:
            ev["row_remap_failure"] = True
        if "nvlink_errors" in found or "nvlink_down" in found:
            ev["nvlink_error_rate_max"] = _finite(stats["nvlink_error_rate_max"][i])
            ev["nvlink_links_down_max"] = _finite(stats["nvlink_links_down_max"][i])
            ev["nvlink_errors_rising"] = bool(stats["nvlink_rising"][i] == 1.0)
        if "ecc_storm" in found:
            peak, first = _finite(stats["ecc_rate_max"][i]), _finite(stats["ecc_rate_start"][i])
            ev["ecc_correctable_rate_max"] = peak
            ev["ecc_correctable_rate_start"] = first
            ev["ecc_correctable_growth"] = peak / first if first > 0 else 1.0
            ev["ecc_accelerating"] = bool(first > 0 and peak >= self.accelerating_growth * first)
        if "pcie_downgrade" in found or "pcie_replays" in found:
            for key in ("pcie_gen_min", "pcie_gen_max", "pcie_width_min", "pcie_width_max", "pcie_replay_rate"):
                ev[key] = float(stats[key][i])
        if lost:
            ev["telemetry_lost_minutes"] = float(stats["telemetry_lost_steps"][i]) * fleet.step / 60.0
        return Finding(
            kind=self.kind, severity=severity, summary=self._summary(ep, top, found, xids, ev),
            start=float(ep.start), end=None if ep.open else float(ep.end), score=_SCORE[severity],
            hostname=ep.hostname, gpu=int(ep.gpu) if ep.gpu and str(ep.gpu).isdigit() else None, uuid=ep.uuid,
            job=ep.job, namespace=ep.namespace, pod=ep.pod, rack=ep.rack or None,
            confidence="low" if lost and not confirmed_lost and ranked[0][3] == "telemetry_lost" else "high",
            evidence=ev,
        )

    @staticmethod
    def _summary(ep: Any, top: str, found: list[str], xids: list[dict[str, Any]], ev: dict[str, Any]) -> str:
        where = f"GPU {ep.gpu} of {ep.hostname}" + (f" (job {ep.job})" if ep.job else "")
        since = f"since {rfc3339(float(ep.start))}" + ("" if ep.open else f" for {format_duration(ep.duration_s)}")
        parts = [f"XID {x['code']} ({x['name']})" for x in xids]
        for c in found:
            head = CAUSES[c][1]
            if c == "pcie_downgrade":
                head = (f"PCIe link at gen{ev['pcie_gen_min']:g} x{ev['pcie_width_min']:g} of "
                        f"gen{ev['pcie_gen_max']:g} x{ev['pcie_width_max']:g} while busy")
            elif c == "pcie_replays":
                head = f"PCIe replays at {ev['pcie_replay_rate'] * 60:.3g}/min"
            elif c == "nvlink_errors":
                head = (f"NVLink errors at up to {ev['nvlink_error_rate_max']:.3g}/s"
                        + (" and rising" if ev.get("nvlink_errors_rising") else ""))
            elif c == "ecc_storm":
                head = f"correctable ECC errors at up to {ev['ecc_correctable_rate_max']:.3g}/s"
                if ev["ecc_accelerating"]:
                    head += (f", accelerating (x{ev['ecc_correctable_growth']:.0f} since "
                             f"{ev['ecc_correctable_rate_start']:.2g}/s)")
            elif c == "nvlink_down":
                head = f"{ev['nvlink_links_down_max']:g} NVLink link(s) down"
            parts.append(head)
        if top.startswith("xid"):
            action = describe(int(top[3:])).action
            if all(x["category"] == "application" for x in xids) and not found:
                return f"{', '.join(parts)} on {where} {since}: {action}."
        else:
            action = CAUSES[top][2]
        return f"{', '.join(parts)} on {where} {since}: {action}."

    def _persistent(self, g: _PhysGrid, raw: np.ndarray, min_s: float, gap: int) -> np.ndarray:
        """``raw`` with True rows outside episodes of at least ``min_s`` turned into False (transients)."""
        if not (raw == 1.0).any():
            return raw
        eps = g.episodes(raw, max_gap_steps=gap, max_unknown_steps=gap, min_duration_s=min_s)
        inside = np.zeros(len(raw), bool)
        inside[eps.order[eps.member >= 0]] = True
        return np.where((raw == 1.0) & ~inside, 0.0, raw)

    def _storm(self, g: _PhysGrid, rate: np.ndarray, step: float, rising: bool) -> tuple[np.ndarray, np.ndarray]:
        """An error storm per physical row (1/0/NaN) and the qualifying windows' mean rate (NaN elsewhere,
        negated where the window is not yet full of errors: see ``_rate_start``).

        Level (``rising`` False, the ECC rule): the window's mean rate >= ``ecc_correctable_rate_min``
        with errors in >= ``storm_active_fraction`` of its scrapes. Rising (the NVLink rule): the
        later half's count >= ``nvlink_rising_growth`` x the earlier half's, by >= 3 Poisson sd, at a
        mean rate >= ``nvlink_rising_rate_min``, both halves with errors in >= ``rising_active_fraction``
        of their scrapes. A row with errors is part of the storm when a qualifying window covers it.
        Dense (GPU, step) matrices are built only for the GPUs that have any error at all.
        """
        known = ~np.isnan(rate)
        out, win_rate = np.where(known, 0.0, np.nan), np.full(g.n, np.nan)
        pos = np.nan_to_num(rate) > 0
        if not pos.any():
            return out, win_rate
        gid, t = g.key // g.T, g.key % g.T
        idx = np.flatnonzero(np.isin(gid, np.unique(gid[pos])))
        _, gi = np.unique(gid[idx], return_inverse=True)
        cnt, act, kn = (np.zeros((int(gi.max()) + 1, g.T)) for _ in range(3))
        cnt[gi, t[idx]] = np.maximum(np.nan_to_num(rate[idx]), 0.0) * step
        act[gi, t[idx]] = pos[idx]
        kn[gi, t[idx]] = known[idx]
        w = max(round(self.storm_window_s / step), 2)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = _roll(cnt, w) / (_roll(kn, w) * step)
        if rising:
            h = w // 2
            late, early = _roll(cnt, h), _shift(_roll(cnt, h), h)
            need = self.rising_active_fraction * h
            ok = ((_roll(act, h) >= need) & (_shift(_roll(act, h), h) >= need)
                  & (late >= self.nvlink_rising_growth * early) & (late - early >= 3.0 * np.sqrt(late + early))
                  & (late >= self.nvlink_rising_rate_min * h * step))
        else:
            ok = (mean >= self.ecc_correctable_rate_min) & (_roll(act, w) >= self.storm_active_fraction * w)
        covered = _roll(ok[:, ::-1].astype(np.float64), w)[:, ::-1] > 0  # a qualifying window ends within w steps
        storm = (covered & (act > 0)) | ok
        out[idx] = np.where(storm[gi, t[idx]], 1.0, out[idx])
        # the window rate where it qualifies; negative where its window is not yet full of the storm (at its
        # onset the window still holds the healthy zeros before it: no measure of the storm's own starting rate)
        full = _roll(act, w) >= self.rising_active_fraction * w
        win_rate[idx] = np.where(ok, np.where(full, mean, -mean), np.nan)[gi, t[idx]]
        return out, win_rate

    def _events(self, fleet: Fleet, g: _PhysGrid) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """XID events placed on physical-GPU rows: (row, code, count, time); unplaceable ones are dropped."""
        ev = fleet.events
        empty = (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0), np.zeros(0))
        if ev is None or not len(ev):
            return empty
        code = pd.to_numeric(ev["xid"], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
        count = pd.to_numeric(ev["count"], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
        ts = pd.to_numeric(ev["timestamp"], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
        ok = ~np.isnan(code) & (code > 0) & ~(count <= 0) & ~np.isnan(ts)
        rep = g.locate(ev["hostname"].astype(str).to_numpy(), ev["gpu"].astype(str).to_numpy(), ts)
        ok &= rep >= 0
        if not self.application_xids:
            ok &= ~np.isin(code, sorted(APPLICATION_XIDS))
        return rep[ok], code[ok].astype(np.int64), np.nan_to_num(count[ok], nan=1.0), ts[ok]

    @staticmethod
    def _note_missing(fleet: Fleet) -> None:
        lacking = [s for s in _FAULT_SIGNALS if not fleet.has(s)]
        if not lacking:
            return
        note = (f"gpu_fault: {', '.join(lacking)} not available: faults they would show are unknown, not absent "
                f"(dcgm-exporter's default counters lack ECC, NVLink error and PCIe link-state fields; XIDs, "
                f"remapped rows and lost GPUs are still found)")
        if note not in fleet.notes:
            fleet.notes.append(note)


def _roll(x: np.ndarray, n: int) -> np.ndarray:
    """Trailing sums over ``n`` steps along axis 1 (a window ending at each step; shorter at the start)."""
    c = np.concatenate([np.zeros((x.shape[0], 1)), np.cumsum(x, axis=1)], axis=1)
    lo = np.maximum(np.arange(x.shape[1]) + 1 - n, 0)
    return c[:, 1:] - c[:, lo]


def _shift(x: np.ndarray, n: int) -> np.ndarray:
    """``x`` delayed by ``n`` steps along axis 1 (zeros shifted in)."""
    out = np.zeros_like(x)
    if n < x.shape[1]:  # else a window shorter than the delay: nothing shifted in yet
        out[:, n:] = x[:, :x.shape[1] - n]
    return out


def _rate_start(eps: Episodes, win_rate: np.ndarray) -> np.ndarray:
    """Per episode, the storm's starting rate: the lowest window rate among windows full of errors
    (positive values of ``win_rate``), else among all qualifying windows (a sparse storm)."""
    full = _ep_reduce(eps, np.where(win_rate > 0, win_rate, np.nan), np.fmin)
    return np.where(np.isfinite(full), full, _ep_reduce(eps, np.abs(win_rate), np.fmin))


def _finite(x: float) -> float:
    return float(x) if np.isfinite(x) else 0.0


def _tri(value: np.ndarray, known: np.ndarray) -> np.ndarray:
    """1.0 / 0.0 where known, NaN where not."""
    return np.where(known, value.astype(np.float64), np.nan)


def _ep_reduce(eps: Episodes, values: np.ndarray, ufunc: np.ufunc) -> np.ndarray:
    """Per-episode max/min (``np.fmax``/``np.fmin``) of ``values`` over the episode's span, NaN skipped."""
    v = np.asarray(values, np.float64)[eps.order]
    sel = (eps.member >= 0) & ~np.isnan(v)
    out = np.full(len(eps), np.nan)
    ufunc.at(out, eps.member[sel], v[sel])
    return out


def _gpu_key(ep: Any) -> str:
    """A physical GPU as one key of ``EarlierRuns`` (a fault outlasts its job)."""
    return f"{ep.hostname}/{ep.gpu}"


def _xid_summary(codes: np.ndarray, counts: np.ndarray, times: np.ndarray) -> list[dict[str, Any]]:
    out = []
    for c in sorted(set(codes.tolist())):
        m = codes == c
        x = describe(int(c))
        out.append({"code": int(c), "name": x.name, "severity": x.severity, "category": x.category,
                    "count": float(counts[m].sum()), "first": rfc3339(float(times[m].min()))})
    return out


class _PhysGrid:
    """One row per physical GPU and step (the first MIG instance's row stands for its GPU).

    ``rep``: frame positions of those rows; ``codes``: per frame row, its physical row.
    Device-level signals (errors, links, telemetry presence) are the GPU's on every
    instance row, so the representative row carries them; per-instance signals (busy)
    are combined with ``any_true``.
    """

    def __init__(self, fleet: Fleet) -> None:
        frame = fleet.frame
        self.step, self.start, self.end = float(fleet.step), float(fleet.start), float(fleet.end)
        n = len(frame)
        self.host = category_codes(frame["hostname"])
        self.gpu = category_codes(frame["gpu"])
        ts = frame["timestamp"].to_numpy(dtype=np.float64)
        self.t_idx = np.rint((ts - self.start) / self.step).astype(np.int64)
        self.T = int(self.t_idx.max() - min(self.t_idx.min(), 0)) + 1
        self.t_idx -= min(int(self.t_idx.min()), 0)
        gpu_key = self.host * (int(self.gpu.max()) + 2) + self.gpu
        key = gpu_key * self.T + self.t_idx
        self.mig = mig = _any_mig(frame)
        if mig:
            self.codes, _uniq = pd.factorize(key, sort=False)
            self.codes = self.codes.astype(np.int64)
            self.rep = np.flatnonzero(~pd.Series(self.codes).duplicated().to_numpy())
            keep = ["timestamp", "hostname", "gpu", "uuid", "model", "site", "rack", "namespace", "pod",
                    "container", "job", "gpu_share"]
            sub = frame[[c for c in keep if c in frame.columns]].iloc[self.rep].reset_index(drop=True)
            sub["gpu_share"] = 1.0
            self.phys_fleet = Fleet(frame=sub, step=fleet.step, start=fleet.start, end=fleet.end)
            self.key = key[self.rep]
        else:
            self.codes = np.arange(n, dtype=np.int64)
            self.rep = np.arange(n)
            self.phys_fleet = fleet
            self.key = key
        self.n = len(self.rep)
        self.rep_host = self.host[self.rep]
        self.rep_t = self.t_idx[self.rep]
        self._host_cats = _categories(frame["hostname"])
        self._gpu_cats = _categories(frame["gpu"])
        self._gmul = int(self.gpu.max()) + 2

    def episodes(self, cond: np.ndarray, **kw: Any) -> Episodes:
        """``find_episodes`` over the physical rows, computed only on the GPUs where ``cond`` is ever True.

        The returned ``order`` indexes physical rows, so ``Episodes.mean`` takes per-physical-row
        arrays; the other GPUs (all of a healthy fleet) never pay for the episode machinery.
        """
        gid = self.key // self.T
        idx = np.flatnonzero(np.isin(gid, np.unique(gid[cond == 1.0])))
        frame = self.phys_fleet.frame
        cols = [c for c in frame.columns if c not in NAMES]
        sub = Fleet(frame=frame[cols].iloc[idx].reset_index(drop=True), step=self.step, start=self.start,
                    end=self.end)
        eps = find_episodes(sub, cond[idx], split_on=(), **kw)
        return Episodes(eps.table, idx[eps.order], eps.member, eps.cond)

    def take(self, values: np.ndarray) -> np.ndarray:
        """Per physical row: the representative frame row's value."""
        return values[self.rep] if self.mig else values

    def any_true(self, value: np.ndarray, known: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per physical row: any frame row True (among known ones), and whether any was known."""
        if not self.mig:
            return value & known, known
        t = np.bincount(self.codes, weights=(value & known).astype(np.float64), minlength=self.n) > 0
        k = np.bincount(self.codes, weights=known.astype(np.float64), minlength=self.n) > 0
        return t, k

    def hold(self, rows: np.ndarray, steps: int) -> np.ndarray:
        """Per physical row: within ``steps`` steps after one of ``rows`` on the same GPU."""
        out = np.zeros(self.n, bool)
        if not len(rows) or steps <= 0:
            return out
        order = np.argsort(self.key, kind="stable")
        sk = self.key[order]
        r = np.unique(rows)
        want = (self.key[r][:, None] + np.arange(1, steps + 1)[None, :]).ravel()
        same_gpu = want // self.T == np.repeat(self.key[r] // self.T, steps)
        pos = np.clip(np.searchsorted(sk, want), 0, len(sk) - 1)
        hit = same_gpu & (sk[pos] == want)
        out[order[pos[hit]]] = True
        return out

    def node_count(self, flag: np.ndarray) -> np.ndarray:
        """Per physical row: how many GPUs of its node have ``flag`` at that step."""
        nk = self.rep_host * self.T + self.rep_t
        return np.bincount(nk, weights=flag.astype(np.float64))[nk]

    def locate(self, hosts: np.ndarray, gpus: np.ndarray, ts: np.ndarray) -> np.ndarray:
        """Physical row of each (hostname, gpu, time) (time floored onto the step grid), -1 if none."""
        h = pd.Index(self._host_cats).get_indexer(hosts).astype(np.int64)
        g = pd.Index(self._gpu_cats).get_indexer(gpus).astype(np.int64)
        t = np.floor((np.nan_to_num(ts) - self.start) / self.step + 1e-6).astype(np.int64)
        ok = (h >= 0) & (g >= 0) & (t >= 0) & (t < self.T)
        want = (h * self._gmul + g) * self.T + t
        order = np.argsort(self.key, kind="stable")
        sk = self.key[order]
        pos = np.clip(np.searchsorted(sk, want), 0, max(len(sk) - 1, 0))
        hit = ok & (len(sk) > 0) & (sk[pos] == want)
        return np.where(hit, order[pos], -1)


def _any_mig(frame: pd.DataFrame) -> bool:
    """Does any row belong to a MIG instance (non-empty ``gpu_instance``)?"""
    if "gpu_instance" not in frame.columns:
        return False
    s = frame["gpu_instance"]
    if isinstance(s.dtype, pd.CategoricalDtype):
        cats = np.asarray(s.cat.categories.astype(str))
        used = np.bincount(s.cat.codes.to_numpy(dtype=np.int64) + 1, minlength=len(cats) + 1)[1:] > 0
        return bool((used & (cats != "")).any())
    return bool((s.fillna("").astype(str) != "").any())


def _categories(s: pd.Series) -> np.ndarray:
    if isinstance(s.dtype, pd.CategoricalDtype):
        return np.asarray(s.cat.categories.astype(str))
    return np.asarray(pd.factorize(s.astype(str), sort=False)[1].astype(str))


__all__ = ["ATTRIBUTION", "CAUSES", "GpuFault"]
