"""Stragglers: the one member (GPU or node) of a synchronous job that the rest waits for.

In a synchronous data-parallel job every member does the same work per step and waits
for the slowest at the barrier (all-reduce). Three signatures follow, compared with the
member's *peers*: the other devices of the same job, role (container) and GPU model at
the same timestamp, by median (the other member of a pair; ``_peers``):

* **compute straggler** (throttled, power-capped, slow for an unseen reason): it needs more
  time for the same work, so it spends the most cycles computing and the least waiting.
  Its tensor-core activity (SM activity where the job uses no tensor cores) is *higher*
  than its peers' by the factor it is slower (``lead``), while the peers, spinning in
  NCCL at the barrier, keep GPU util ~97% with lower tensor/SM activity: the victims look
  *less* busy, never more, so they are never named. A lower SM clock than the peers'
  explains the lead (cycles are slower): same work / lower clock = more active cycles.
* **input straggler** (starved data loader): its GPUs sit truly idle between steps, so
  its GPU util drops below its peers' (whose barrier wait happens inside a kernel and
  counts as "busy"), while per second it still does the same work as its peers
  (clock-normalized activity within ``same_work`` of theirs: a dead or hung member does
  none and belongs to gpu_fault).

* **NVLink straggler** (links down): the all-reduce runs at its slowest member's bandwidth,
  so every member waits alike (no lead); the culprit moves far less NVLink traffic than its
  peers: ``nvlink_bps`` <= ``nvlink_ratio_max`` 0.67 of the peers' median (where the peers
  move >= ``nvlink_min_bps`` 1 GB/s). Communication is ~10% of a well-tuned step
  (``comm_share``), stretched by 1/ratio: below 2/3 the job loses >= 5%; the slowdown
  reported is ``comm_share * (1/ratio - 1)`` (an assumption, said with "~").

A compute straggler also needs its peers at full clock (peer median >= 95% of the max SM
clock, the max being, where not reported, the highest clock seen on that GPU model): when
the peers are throttled too the job shares a cause (a rack's cooling, a capped job) that
the thermal/degraded detectors own; the worst of a slowed group is not the one to drain. So does a
gang heating together: peers whose median die temperature is within ``peer_heat_margin`` 10 C of
the throttle point (75 C at 85 C; healthy busy dies run ~40-60 C, AcmeTrace's median and p90). Why:
replayed over 10 seeds of every scenario, the hottest GPU of a gang warming with its rack throttled
first while its peers' median stood at 76-86 C (55 early "suspected stragglers" at info, withdrawn
once the rest throttled too: the rack's thermal finding owns them); the peers of every true
thermal straggler stood at 45-71 C (the highest, a node in a failing rack whose gang's other node
sits in a healthy one).
The lead is compared on activity averaged over the persistence window (per-sample
profiling noise of ~±5% averages out; the members' slow kernel-mix drift is what the MAD
then measures) and must also be > 1 in the sample itself.

Both are judged per GPU and per node (node medians against the job's other nodes): when
the node stands out (all its GPUs late: input starvation, a node cooling problem) one
node finding (``gpu`` None) replaces its GPU findings. It starts where one of its GPUs began to straggle
when that runs without a break into the node's condition (a warming node's hottest card throttles minutes
before the node median does: the rack-cooling scenario's node finding came 4-9 minutes late before), and is judged
with that lead-in (confirmed once both together last ``min_duration_s``); its GPUs' findings give way to it once
the node's condition has lasted ``suspect_after_s``, when its finding can be shown.

Thresholds (configurable; why these values):

* ``busy_util`` 0.9: the peers must be waiting *inside* kernels (util stays high at a
  barrier: ~0.97 in AcmeTrace busy GPUs and the simulator); an inference service with
  idle replicas or a job between phases is not a synchronous gang at work. 0.8 let a
  tensor-parallel inference service at 75-85% util through (its replicas' load differs):
  20 false stragglers over 30,720 healthy GPU-hours (noisy-neighbours and healthy-long, 20
  seeds), 8 with 0.9, and no straggler of the scenarios missed.
* ``progress_sm`` 0.1 / ``min_tensor`` 0.02: the job must be making progress. A gang hung
  on a dead peer spins at SM ~0.05 with no tensor work (idle_masking's ``stalled_sm``);
  comparing leads there would name noise. Tensor activity is the lead signal when peers
  show at least 2% of it (training matmuls run at ~0.2, AcmeTrace), else SM activity.
* ``clock_drop`` 0.05: GPUs of one model running the same kernels at the same power sit
  within ~2% of each other's boost clock (voltage/frequency binning, the simulator's
  2% jitter); 5% below the peers' median is outside that spread and already a 5% slower
  member. With a clock drop the lead needs only ``clock_lead_min`` 0.04 (the lower clock
  must actually cost time: a throttled GPU that is not the limiter has no lead). Once shown, it holds while
  the member stays throttled with any lead (> 1): the members' kernel-mix drift swings a lead by +-5 % over
  15-40 minutes, and a power-capped A100 slowing its 16-GPU gang 12 % (restart-mess) read 1.01-1.11, its one
  problem split into three findings, the first 15 minutes late, with 0.04 the bar throughout. While the GPU
  reports a power or thermal clock-event reason, "throttled" for that hold needs only a clock ``clock_spread``
  0.02 under its peers' (the binning spread above): the reason says its clock is held down, and restart-mess's
  A100 capped to 4-6 % under its gang's clock (power reason on throughout, its gang 8.5 % slower, seed +9) crossed
  the 5 % line back and forth and its findings broke off into nothing (missed since held samples are unknown,
  62 minutes late before); now found from its onset. Over 10 never-used seeds of every scenario (+10300) in ours
  and 6 with every dcgm counter: precision 1.000 and recall unchanged, restart-mess's capped A100 at +10386 one
  finding from its onset instead of four fragments from a minute late, rack-cooling's warming nodes start 1-2
  minutes sooner; replayed (+10400, +10410) the capped A100 of +10493 was suspected at 840 s instead of 1,680 s
  and withdrawn once instead of 7 times. dcgm-exporter's default counters carry no clock-event reasons.
* ``lead_min`` 0.10 and ``z_min`` 3: without a clock explanation the activity lead alone
  must exceed the members' natural spread: per-sample noise of profiling counters is
  ~±5% and the kernel mix of members drifts by a few percent, so 10% and 3 robust
  standard deviations (MAD) of the group are needed.
* ``util_gap`` 0.05: members of a synchronous job report util within 1-2 points of each
  other (integer percent plus jitter); 5 points lower while still doing the same work is
  ~5% of each step spent idle outside any kernel. The other way round, the quiet paths below judge a member
  only where its util is at most ``util_gap`` above its peers': peers waiting for it at a barrier wait inside
  kernels, so their util stays with its; a member busier by util as well as by activity (an inference replica
  carrying more load than the others) is not what they wait for. Over 40 seeds of every scenario (0..19 and
  +1000..+1019) this took away 2 false warnings on inference services (noisy-neighbours' recurring ~9 % spells,
  one of healthy-long's two ~8 % silent ones: util 0.99 against its peers' 0.94) and changed no time to detect
  (9 straggler scenarios at 5 seeds, replayed).
* ``replica_util_lead`` 0.02 over ``replica_window_s`` 1800 s: a member whose util led its peers' by 2 points or
  more on average where they were busy but under ``busy_util`` (util >= ``replica_util_min`` 0.1, at least
  ``replica_samples`` 5 such samples in the centered window) is a replica given more of the load, not a gang
  member they wait for; the quiet paths leave it out over that window. Why: members of a synchronous gang wait
  inside kernels, so their util agrees at any load (integer percent and +-1.5 points of jitter: a 5-sample mean
  within ~0.7 points); replicas behind one balancer differ by their load shares (+-10 %), 2-5 points of util
  below saturation, and in a burst that saturates them all only their activity tells them apart, the busier
  replica leading by ~10 % as a slow member would. Per sample (``util_gap``) such a lead is noise; averaged it is
  not. Training gangs run saturated, so it never judges them. Over 10 never-used seeds of every scenario
  (+10100..+10109) it took away 4 false warnings, none of them on a gang: 3 silent ones on healthy-long's 16-GPU
  chat-serve (7-8 % for 10-14 minutes), one intermittent one on noisy-neighbours' 4-GPU serve-a, whose GPU 7
  carries ~10 % more load (util 0.74 against 0.64 between bursts; a 10 % tensor lead in each 5-minute burst),
  the same at seed +9942 with dcgm-exporter's default counters.
* ``same_work`` 0.8: clock-normalized activity at least 80% of the peers' (the same work
  per second give or take the drift and noise above).
* ``work_kept`` 0.5: and of what its util lost against the peers' (``1 - util / peer util``), its
  clock-normalized activity lost at most half. Why: a member starved of input does the same work per
  second as its peers (they wait for it), so its activity keeps up while its util falls; a member simply
  given less work (an inference replica with less load, ~10 % between replicas) loses activity with its
  util. Half is the midpoint between the two signatures. Over 40 seeds of every scenario (0..19 and
  +1000..+1019) it took away 5 "input starvation" warnings on inference services of noisy-neighbours (their
  activity down 6-9 % with their util) and no true input, PCIe or messy-telemetry straggler.
* persistence ``window_s`` 300 with ``persist`` 0.6 (3 of 5 one-minute samples): a
  straggler is a property of the member for minutes, not one noisy sample; then episodes
  (``analyzer.analysis.episodes``) of at least ``min_duration_s`` 600 s.

Quiet stragglers (issue 12), found from the peer relation itself at GPU level, judged minute by minute whatever
the step (a step under a minute is averaged into minutes first: the "samples" below are minutes; ``_quiet``):

* **silent** (same clock, no throttle reason: a weak GPU/HBM, or data imbalance): over
  ``silent_window_s`` 900 s the member is the *busiest* of its job (highest activity) by a
  clock-normalized lead (lead x its clock ratio: a lead its lower clock explains is the clock
  path's, or healthy chip-to-chip spread) >= ``silent_lead`` 0.06 and >= ``silent_z`` 2.5
  robust SDs of the group. Why: 15 minutes of averaging leave ~3% of the members' kernel-mix
  drift (a 15-40 min wander, attenuated ~0.8 by the window) and no per-sample noise; a member
  that slows a multi-node gang by 10% leads by >= 11% (``1 + s (1 + comm)``), >= 8% at the
  drift's worst, so 6% sits between the two; 2.5 SDs keeps replicas of an inference service
  (per-replica load differs by ~10%, persistently) from looking like one; only the busiest is
  named, since a synchronous job waits for one member. Cause ``unknown`` with "unexplained:
  suspect the GPU/HBM, or data imbalance". Only in jobs of >= ``silent_min_members`` 6: with
  fewer members the median follows the others' drift, and a healthy member at its drift peak leads a
  4-GPU job by 7-8% for ten minutes and more (measured on noisy-neighbours, seeds 24-25). The
  averages take only the samples with the gang at work (peers busy and progressing): a start-up
  phase next to the window would lend them a lead the member never had at work. At either edge of the
  data the centered window is cut to half (noisier): an episode seen only by this path counts the half
  window at each edge it touches (still open at the end; starting where the data starts, as serve's
  window cuts it) as suggestion, not evidence, toward confirmation (``_status``). Without the start
  edge, the last healthy minutes of a GPU that fell off the bus, at the start of a later window, read
  as a 10-minute straggler of its hung gang.
* **intermittent** (slow in recurring spells of a few minutes): a *spell* sample is one where
  the member is the busiest of its job over two samples by a clock-normalized lead >=
  ``spell_lead`` 0.08 (or throttled with the clock path's lead), for ``spell_min_s`` 180 s in a
  row at least (3 samples at 60 s). Why 8%: a 10% gang slowdown leads by >= 11% (minus drift and
  noise, ~±5% over two samples), while a healthy member must have its drift and noise peak
  together to reach it, and also be the busiest, for three samples running ("a few minutes at a
  time"; two samples let chance spells of ~2 min make 7 false intermittent stragglers over
  45,600 healthy GPU-hours of four healthy scenarios at 20 seeds, three none), or two where the member's CUSUM
  (below) alarms inside them: a 3-minute spell's edges, its first sample half in the two-sample lead, leave two
  samples over 8 % where its gang slows ~11 %, and 10 of 12 such spells of straggler-intermittent's 15 % member
  at seed +4018 counted none (its spells 50 minutes apart: missed), though its CUSUM alarmed in each; a chance
  two-sample lead is common, one with the member's CUSUM past an alarm no healthy member reached is not. Spells
  at most ``spell_gap_s`` 1800 s
  apart form one episode (from the first spell's start, counted or not: ``_first_spell``, to the last
  one's end; open while the data ends within that gap); it is a finding when it has >= ``spells_min`` 3 spells (one or
  two are a blip or a coincidence, three are a pattern: "again and again") slow >=
  ``duty_min`` 0.1 of the span (a tenth of the time at >= 10% costs the job >= 1% and is
  well above the rate of chance spells). Evidence: ``spells``, ``duty_cycle``,
  ``spell_minutes``; the lost GPU-hours count the slow share only. A member slow less than
  half the time is intermittent: that finding replaces overlapping continuous ones. A service's runs carry
  each GPU's spells of the last ``spell_memory_s`` 3600 s (older ones folded into one summary of the pattern
  they chain to; ``_carry_spells``), so a window's episode goes on from the spells earlier runs saw: a
  30-minute window holds 3 spells of a 10-minute period only while none slides out or counts short, and
  none of a 15-minute one.

* **sequential evidence** (CUSUM): the 15-minute average reacts late, so the same clock-normalized lead is also
  accumulated sample by sample, ``S = min(cap, max(0, S + (lead - 1 - cusum_k) x minutes))``, per member of a job
  of >= ``silent_min_members`` while the gang is at work (reset to 0 where it is known not to be: an inference
  service between bursts is no steady gang; held over unknown samples; falling only while another member's
  slowness is explained, see **change**). The busiest member whose ``S`` reaches ``cusum_h`` 0.35 lead-minutes is
  silent from the change point the CUSUM estimates (where ``S`` last left 0) until ``S`` is back at 0; returns
  within ``cap / cusum_k`` (14 min, the time a full alarm takes to be forgotten; cap 2 ``cusum_h``) are the same
  problem (an intermittent straggler's next spell: one episode). Why: ``cusum_k`` 0.05 is half the smallest
  slowdown to find (a 10% gang slowdown leads by >= 11%: it gains >= 0.06 a minute and alarms within ~6 minutes, a
  20% one within ~2), the classic choice for a shift of 0.1; ``cusum_h`` 0.35 sits above the highest value healthy
  members reached over 11,400 at-work GPU-hours of 15 scenarios at up to 13 seeds each, healthy, heterogeneous,
  messy and 24-hour fleets among them, in both dialects (0.30 raised 5 alarms there, 0.35 none), where drift (+-4%
  over 15-40 min) and per-sample noise (+-5%) add up at most to a few minutes of a 10% lead; over the 20
  never-used seeds (+1000..+1019) of every scenario one healthy member reached 0.39 (an 8-GPU fine-tune of
  healthy-long: one warning in ~25,000 GPU-hours of it).

* **change** (a second CUSUM, for the first spell of a quiet straggler): the lead a member gains *while its
  gang slows*. Per sample the lesser of two, each a fraction: its clock-normalized lead over the midpoint of
  its peers' level (1) and its own median over the previous ``change_baseline_s`` 1200 s; and how far its
  peers' activity fell below their median over the same 20 minutes (``then / now - 1``: the gang's slowdown,
  what a straggler costs). Why the midpoint: both are estimates of where the member would be without the
  fault; its own recent level carries its lasting offset (its kernel-mix drift; a slower chip, whose clock
  normalization over-corrects SM activity, which a barrier's communication dilutes), the peers' level does
  not. Requiring the lead over each (the least of three, as before) cost a 10 % member on a chip 2 % slower than
  its peers' median ~0.02 a minute, its first 4-minute spell peaking at 0.10. Why 20 minutes: a median forgets
  a lasting change once half its window is past it, so 10 minutes left a silent straggler 5 minutes of
  evidence (a 12 % one peaked at 0.124 and waited 11 minutes for the first CUSUM); 20 keep the level from
  before a spell with up to 9 of those minutes slow (duty 0.3 of a 15-minute period keeps ~6).
  It counts only while the member is the busiest of its job over two samples, or in this one with a lead of
  ``spell_lead`` (else it can only fall): the two-sample lead, half of it the minute before, put a spell's first
  minute behind a drifting peer's and lost it; any member busiest in one sample would let the noise of many
  gain (below). A minute counts too where the member is the busiest over the next two: a spell's first minute
  seen from its second, where in a big gang some healthy member's noise peak still led it (quiet-mess +3: a 15 %
  member of 32 at a drift low ~5 % under its peers gained 0.133 in its first spell, one minute short, and with
  its second spell in its node's scrape gap was found 27 minutes after onset, now 3; replayed over every
  scenario at 4 never-used seeds, +9800, nothing else moved but one 10 % silent member 1 minute sooner, 0 false).
  Nor while a member of its job is slow for a reason the other paths see (input-starved, or
  throttled with the clock path's lead; the lead CUSUM can only fall then too, nor does a spell count): the
  gang slows for that one, and all its other members lead. A thermal straggler's lead is its clock's, which
  the quiet paths divide out, so they took the busiest of its peers for the culprit: its lead CUSUM reached
  0.36 at messy-telemetry seed +1001, where the throttled member's alternate samples are held (its node
  scraped every 2 minutes), and the change CUSUM 0.16 there with the 20-minute median.
  ``S = min(2 change_h, max(0, S + (change - change_k) x minutes))``, an alarm at ``change_h`` 0.15. Why:
  a healthy member's drift raises its lead but slows no one, and a gang slowing for its own reasons (a phase,
  a load drop) slows every member alike, so no lead rises with it; the peers' median moves ~1 % from sample to
  sample where one member's activity moves 3-5 %, so ``change_k`` 0.03 can sit below a 10 % slowdown's ~0.06-0.1
  and above that noise. Over 30 seeds (0..9, +1000..+1019) of all 25 scenarios the highest value a member
  outside the truth reached as the busiest of its job's CUSUMs was 0.087 (the least of three over a 10-minute
  median: 0.074 over 0..9; 0.139 over +1000..+1019, a peer of a throttled straggler, before explained gangs
  were left out), 0.038 on the healthy scenarios, while the first 3-4 minute spell of a 10-15 % intermittent
  straggler, or the first minutes of a silent one, reach 0.09-0.43 (a few stay under 0.15: where chip spread
  leaves their gang only ~7 % slower, or their drift is at its low). Like the first CUSUM it only suspects.
  Counting a spell's first minute (busiest in this one sample by a spell's lead) left the highest value outside
  the truth where it was; counting every member busiest in one sample raised it to 0.148 (a peer of the
  input-starved node).

* **which activity** (the quiet paths): SM activity where it is collected, else tensor activity. What each
  counts decides who leads. SM activity counts kernel time (cycles with warps resident), which any slowness
  raises; tensor activity counts busy tensor cycles at the member's own clock, which a lower clock or more work
  per step raises, but not a stall (a weak GPU/HBM doing the same work in more cycles: the issue's "SM
  activity a little higher than its peers'"); memory traffic is bytes per step, the same for every member of a
  synchronous gang unless one gets more work. A quiet straggler is slow at its full clock, so tensor activity
  alone would miss every stalling one. SM activity reads a little under the slowdown (the peers' barrier spin
  keeps some of theirs: a 20 % member leads by ~17 %). The clock path keeps tensor activity first (a lower
  clock shows in full there, with no spin in it). Where only the quiet paths speak, the finding's slowdown is
  their two-sample lead over the episode (the 5-minute window's lead takes every sample a peer has, held ones
  too: a node scraped every 2 minutes still showing its gang's start-up read as a member 37 % ahead).
* **memory traffic** (both CUSUMs): the gang's slowdown they accumulate is the average of the activity's
  (above) and DRAM activity's, where the peers move memory (DRAM activity >= ``dram_min`` 0.05; dcgm-exporter's
  default counters carry it): every member moves its bytes per step over a longer step. Where the lead is
  tensor activity's (SM activity not collected) the one-sample lead is averaged with DRAM activity's too: a
  member given more work moves more bytes, with sampling noise of its own and a kernel-mix drift of its own (a
  step shifting from matmuls to memory-bound work lowers tensor activity and raises memory traffic), so a
  drift low in one is not a low in both (bytes per step do not grow with a lower clock: not clock-normalized).
  Not with SM activity's lead, which a stalling member raises alone: averaged with memory traffic it would be
  halved.

Early warning: a problem still open at the end of the data that has lasted
``suspect_after_s`` 180 s (3 samples at 60 s, the persistence rule's 3 of 5) but not yet
``min_duration_s`` is reported as a *suspected* straggler (confidence "low", evidence
``suspected``, severity "warning" when its slowdown >= ``suspect_slowdown`` 0.2, else "info"),
only on strong evidence: a lower clock explaining the lead, a slowdown >= 0.2 (each minute
of it costs a fifth of the whole job; the healthy spread is a few percent), or the silent path's
CUSUM alarmed in the episode and not yet forgotten where it stands now (above 0 at its latest
sample: after a spell it decays for minutes; "in alarm now" withdrew an intermittent straggler's
suspect after every spell, 10 times for straggler-intermittent's 15 % member in serve's replay,
now 2, and no false suspect more over 5 never-used seeds of every scenario). It becomes the
normal finding once it lasts ``min_duration_s`` and disappears if it ends before (withdrawn).
Replayed every minute over the healthy scenarios (30-minute windows, as ``serve`` cuts
them) none appears; thermal/power stragglers of 10-50% are suspected 2-3 minutes after onset,
silent ones of 10-12% within 4-10 minutes.

Impact (upper bounds, stated as "~"): the job runs ``lead - 1`` slower (compute) or
``peer_util / util - 1`` (input): the member's extra time per step, not diluted by
communication time that is not visible; each other member spends ``1 - 1/(1 + slowdown)``
of its time waiting, which summed over the peers and the episode gives the lost
GPU-hours. Severity "critical" when the slowdown >= ``critical_slowdown`` 0.3 (a third
of the job's GPU-time lost) or the lost GPU-hours >= ``critical_gpu_hours`` 8 (a whole
8-GPU node-hour), else "warning".

Cause (``evidence["cause"]``, one of thermal | power | pcie | nvlink | input | unknown),
from the straggler's own evidence over the episode: thermal/power clock-event reasons
(or, where not collected, die temperature >= ``thermal_celsius`` 85 / power >= 97% of
its limit together with the clock drop), a PCIe link below its max generation/width or
replays (also for an idle-gap straggler: copies over a slow link), NVLink traffic far
below its peers' (with errors or links down as detail), util gap (input); otherwise unknown (with "SM
clock lower, no throttle reason reported" when the clock is lower).

Missing signals: without tensor activity the lead uses SM activity (same physics, a bit
diluted by the barrier spin); without SM activity tensor activity alone is used and the
finding is "low" confidence (tensor cores are only part of the work; a member that stalls at full clock
cannot be seen at all: dcgm-exporter's default counters leave SM activity out); with neither,
nothing is reported (a victim cannot be told from its straggler). Without clocks only the
activity path (``lead_min``) and the input path work, also "low". Without DRAM activity the CUSUMs read the
activity alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from analyzer.analysis.episodes import begun_earlier, column, find_episodes, format_duration, union_spans
from analyzer.data.frame import Fleet
from analyzer.detectors import Paging, clock_max, gpu_busy, register
from analyzer.detectors._peers import (
    Blocks,
    PeerGroups,
    block_max,
    peer_groups,
    persistent,
    rolling_count,
    rolling_mean,
    trailing_median,
)
from analyzer.findings import HOLD_SEVERITY_S, STRAGGLER, Finding
from analyzer.site import THRESHOLDS

CAUSES: tuple[str, ...] = ("thermal", "power", "pcie", "nvlink", "input", "unknown")
_ADVICE = {
    "thermal": "check cooling/airflow of that node (fans, inlet temperature, thermal paste)",
    "power": "check its power limit (nvidia-smi -q -d POWER) and the node's power delivery",
    "pcie": "reseat or replace the GPU/riser and check the PCIe link (lspci -vv)",
    "nvlink": "check the NVLink errors (nvidia-smi nvlink -e) and drain the node for repair",
    "input": "check the data loader, storage and network throughput of that node",
    "unknown": ("compare its clocks and kernels with a peer's (nvidia-smi -q, Nsight Systems) and drain it if it "
                "stays slow"),
}


@dataclass
class _Cells:
    """Per (slot, t) matrices of one comparison level (GPU or node)."""

    compute: np.ndarray
    input: np.ndarray
    nvlink: np.ndarray
    nvl_rel: np.ndarray
    known: np.ndarray
    lead: np.ndarray
    clk_rel: np.ndarray
    util: np.ndarray
    ref_util: np.ndarray
    ref_clk: np.ndarray
    clk: np.ndarray
    silent: np.ndarray
    settled: np.ndarray
    spell: np.ndarray
    spell_lead: np.ndarray
    alarm_level: np.ndarray  #: the sequential evidence: the larger CUSUM over its alarm level (1 = alarm)


def _watts(value: float) -> str:
    return "an unknown power draw" if not math.isfinite(value) else f"{value:.0f} W"


def _limit(value: float) -> str:
    """Unknown is said as unknown: dcgm-exporter's default counters do not collect the limit."""
    return "an unknown limit (not collected)" if not math.isfinite(value) else f"a {value:.0f} W limit"


@register
@dataclass
class Straggler:
    """Settings are documented in the module docstring, and:

    - ``mad_floor`` 0.01: the smallest spread (MAD of the peers' activity) a z-score divides by, so a
      perfectly uniform gang (MAD ~0) does not turn a 1-point difference into z = 100.
    - ``power_cap_ratio`` 0.97: drawing 97 % of the power limit or more counts as power-capped (the
      limiter holds power within ~2 % of the cap), the cause named for a slow member there.
    - ``max_gap_steps``/``max_unknown_steps``: as in analyzer.analysis.episodes (one healthy or missing scrape
      does not split a problem).
    """

    kind = STRAGGLER
    paging = Paging(alert="GpuStraggler", team="training", says="is the straggler slowing its training gang ({score}); "
                    "see the analyzer's finding for the evidence.", keep_s=HOLD_SEVERITY_S)
    remembers = True  #: a service's runs carry each GPU's recent spells (``_carry_spells``)
    busy_util: float = 0.9
    progress_sm: float = 0.1
    min_tensor: float = 0.02
    clock_drop: float = 0.05
    clock_spread: float = 0.02
    clock_lead_min: float = 0.04
    lead_min: float = 0.10
    z_min: float = 3.0
    mad_floor: float = 0.01
    util_gap: float = 0.05
    same_work: float = 0.8
    work_kept: float = 0.5
    thermal_celsius: float = THRESHOLDS.gpu_temp_limit_celsius  #: shared with the rules (analyzer.site)
    peer_heat_margin: float = 10.0
    power_cap_ratio: float = 0.97
    nvlink_ratio_max: float = 0.67
    nvlink_min_bps: float = 1e9
    comm_share: float = 0.1
    window_s: float = 300.0
    persist: float = 0.6
    min_duration_s: float = 600.0
    max_gap_steps: int = 2
    max_unknown_steps: int = 2
    critical_slowdown: float = 0.3
    critical_gpu_hours: float = 8.0
    silent_window_s: float = 900.0
    silent_lead: float = 0.06
    silent_z: float = 2.5
    silent_min_members: int = 6
    spell_lead: float = 0.08
    spell_gap_s: float = 1800.0
    spell_min_s: float = 180.0
    spells_min: int = 3
    duty_min: float = 0.1
    replica_window_s: float = 1800.0
    replica_util_lead: float = 0.02
    replica_util_min: float = 0.1
    replica_samples: int = 5
    spell_memory_s: float = 3600.0
    suspect_after_s: float = 180.0
    suspect_slowdown: float = 0.2
    cusum_k: float = 0.05
    cusum_h: float = 0.35
    change_k: float = 0.03
    change_h: float = 0.15
    change_baseline_s: float = 1200.0
    dram_min: float = 0.05

    # Per-cell conditions ---------------------------------------------------------------
    @staticmethod
    def _lead(TEN: np.ndarray, SM: np.ndarray, use_t: np.ndarray, ref: Any, window: int,
              spread: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(activity lead over the peers, relative spread, the peers' level) on activity averaged over
        ``window`` samples: tensor activity where the job uses tensor cores (``use_t``), else SM activity."""
        TEN_s, SM_s = rolling_mean(TEN, window), rolling_mean(SM, window)
        rTs, sTs = ref(TEN_s, spread)
        rSs, sSs = ref(SM_s, spread)
        with np.errstate(invalid="ignore", divide="ignore"):
            lead = np.where(use_t, TEN_s / rTs, np.where(rSs > 0, SM_s / rSs, np.nan))
            return lead, np.where(use_t, sTs / rTs, sSs / rSs), np.where(use_t, rTs, rSs)

    def _cells(self, U: np.ndarray, TEN: np.ndarray, SM: np.ndarray, CLK: np.ndarray, CLKMAX: np.ndarray,
               NVL: np.ndarray, TEMP: np.ndarray, ref: Any, steps: int, top: Blocks | None = None,
               step_s: float = 60.0, held: np.ndarray | None = None,
               DRAM: np.ndarray | None = None, reason: np.ndarray | None = None) -> _Cells:
        """Straggler conditions of every cell against its peers (``ref`` = PeerGroups.reference or
        the node-level equivalent; ``steps`` = the persistence window in samples; ``top``: the peer
        sets for the quiet paths, GPU level only; ``held``: cells repeating an earlier sample, which the quiet
        paths, judging a change of the member against its peers at one instant, leave out)."""
        rU, _ = ref(U, False)
        rK, _ = ref(CLK, False)
        rKmax, _ = ref(CLKMAX, False)
        rH, _ = ref(TEMP, False)
        # Activity compared raw (this sample) and smoothed over the window: per-sample profiling
        # noise (~±5%) averages out, the member's kernel-mix drift does not and sets the spread.
        rT, _ = ref(TEN, False)
        rS, _ = ref(SM, False)
        sm_known = ~np.isnan(rS)
        with np.errstate(invalid="ignore", divide="ignore"):
            use_t = rT >= self.min_tensor
            lead_now = np.where(use_t, TEN / rT, np.where(rS > 0, SM / rS, np.nan))
            lead, noise, _ = self._lead(TEN, SM, use_t, ref, steps, True)
            noise = np.fmax(noise, self.mad_floor)
            clk_rel = CLK / rK
            peers_clock = rK / rKmax
        progress = np.where(sm_known, rS >= self.progress_sm, use_t)
        peers_busy = rU >= self.busy_util
        throttled = clk_rel <= 1.0 - self.clock_drop  # NaN clock -> False: no clock evidence
        # Peers throttled too (their clock well below max), or heating with it (their die within
        # ``peer_heat_margin`` of the throttle point): a shared cause (rack cooling, a capped job), owned by the
        # thermal/degraded detectors; the worst of a slowed group is no straggler.
        peers_full = ~(peers_clock < 1.0 - self.clock_drop) & ~(rH >= self.thermal_celsius - self.peer_heat_margin)
        # A group's spread is unknown with fewer than 3 members (NaN noise -> the floor): the relative test decides.
        significant = ~((lead - 1.0) < self.z_min * noise)
        ahead = (lead_now > 1.0) & (self.busy_util <= U)  # it computes more than its peers in this very sample
        compute = (peers_busy & progress & peers_full & ahead
                   & ((throttled & (lead >= 1.0 + self.clock_lead_min))
                      | ((lead >= 1.0 + self.lead_min) & significant)))
        # Hysteresis on the clock path: a member shown to limit its gang at a lower clock stays the limiter while
        # it stays throttled and keeps any lead (``_alarm_runs``: the runs of that which hold a clock-path cell).
        working = peers_busy & progress & peers_full & (self.busy_util <= U)
        limited = throttled if reason is None else throttled | ((reason >= 0.5) & (clk_rel <= 1.0 - self.clock_spread))
        holds = np.where(np.isnan(lead) | np.isnan(clk_rel), np.nan, working & limited & (lead > 1.0))
        compute |= _alarm_runs(holds, compute & throttled)
        work = lead * np.where(np.isnan(clk_rel), 1.0, clk_rel)
        with np.errstate(invalid="ignore", divide="ignore"):
            kept = work >= 1.0 - (1.0 - self.work_kept) * (1.0 - U / rU)  # its work held up while its util fell
        starved = peers_busy & progress & (U - rU <= -self.util_gap) & (work >= self.same_work) & kept
        # NVLink: the all-reduce runs at its slowest member's bandwidth, so every member waits the same
        # (no lead); the culprit is the member moving far less NVLink traffic than its peers.
        rN, _ = ref(NVL, False)
        with np.errstate(invalid="ignore", divide="ignore"):
            nvl_rel = np.where(rN >= self.nvlink_min_bps, NVL / rN, np.nan)
        nvlink = peers_busy & progress & (self.busy_util <= U) & (nvl_rel <= self.nvlink_ratio_max)
        known = ~np.isnan(lead) & ~np.isnan(U) & ~np.isnan(rU)
        # In lock step: peers waiting at a barrier wait inside kernels, their util stays with the member's; a member
        # busier by util as well (a replica carrying more load than the others) is not the one they wait for.
        in_step = ~(U - rU > self.util_gap) & ~self._heavier(U, rU, step_s)
        gate = peers_busy & progress & peers_full & (self.busy_util <= U) & known & in_step
        # The quiet paths average over many samples: only those with the gang at work count (a start-up or a
        # pause next to the window would otherwise lend the long average a lead the member never had at work).
        at_work = peers_busy & progress
        quiet_work = at_work if held is None else at_work & ~held
        # Reset the sequential evidence where the gang is known not to be at work (an inference service
        # between bursts is no steady gang); hold it where nothing is known (a scrape gap).
        idle = ~gate & ~np.isnan(U) & ~np.isnan(rU)
        # The quiet paths (same clock) read SM activity where collected: it counts kernel time, which any slowness
        # raises; tensor activity counts busy cycles at the member's own clock, which a lower clock or more work
        # raises, a stall (the same work in more cycles) not.
        silent, settled, spell, spell_lead, level = self._quiet(
            TEN, SM, use_t & ~sm_known, clk_rel, throttled, (starved | (compute & throttled)) & known, gate, quiet_work,
            idle, ref, top, step_s, DRAM)
        return _Cells(compute & known, starved & known, nvlink & known, nvl_rel, known, lead, clk_rel, U, rU, rK,
                      CLK, silent, settled, spell, spell_lead, level)

    def _heavier(self, U: np.ndarray, rU: np.ndarray, step_s: float) -> np.ndarray:
        """A replica given more of the load (module docstring, ``replica_util_lead``): over ``replica_window_s``
        its util led its peers' by >= ``replica_util_lead`` on average where they were busy under ``busy_util``."""
        part = ~np.isnan(U) & ~np.isnan(rU) & (rU < self.busy_util) & (rU >= self.replica_util_min)
        w = max(1, round(self.replica_window_s / step_s))
        with np.errstate(invalid="ignore"):
            lead = rolling_mean(np.where(part, U - rU, np.nan), w)
            return (rolling_count(part, w) >= self.replica_samples) & (lead >= self.replica_util_lead)

    def _quiet(self, TEN: np.ndarray, SM: np.ndarray, use_t: np.ndarray, clk_rel: np.ndarray, throttled: np.ndarray,
               explained: np.ndarray, gate: np.ndarray, at_work: np.ndarray, idle: np.ndarray, ref: Any,
               top: Blocks | None, step_s: float, DRAM: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
        """The quiet signatures (``_quiet_minutes``), judged minute by minute whatever the step: a step under a
        minute is averaged into minutes first and the result spread back over its samples. Why: their rules
        count samples (two for a short lead, three in a row for a spell, one CUSUM gain each) sized for minutes;
        at 15 s a spell's samples are noisier and its 3-minute run of two-sample leads one sample too short, so
        ``analyze`` at a file's 15 s step found intermittent members that serve's 60 s step finds at 1 of 4."""
        minute = max(1, round(60.0 / step_s))
        if top is None or minute == 1:
            return self._quiet_minutes(TEN, SM, use_t, clk_rel, throttled, explained, gate, at_work, idle, ref, top,
                                       step_s, DRAM)

        def mean(m: np.ndarray) -> np.ndarray:  # over the samples at work only
            return _minutes(np.where(at_work, m, np.nan), minute)

        def most(b: np.ndarray) -> np.ndarray:
            return _minutes(b.astype(np.float64), minute) >= 0.5

        out = self._quiet_minutes(
            mean(TEN), mean(SM), most(use_t), mean(clk_rel), most(throttled),
            _minutes(explained.astype(np.float64), minute) > 0.0, most(gate), _minutes(at_work, minute) > 0.0,
            most(idle), ref, top, step_s * minute, None if DRAM is None else mean(DRAM))
        return tuple(np.repeat(x, minute, axis=1)[:, :gate.shape[1]] for x in out)

    def _quiet_minutes(self, TEN: np.ndarray, SM: np.ndarray, use_t: np.ndarray, clk_rel: np.ndarray,
                       throttled: np.ndarray, explained: np.ndarray, gate: np.ndarray, at_work: np.ndarray,
                       idle: np.ndarray, ref: Any, top: Blocks | None, step_s: float,
                       DRAM: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
        """(silent, settled, spell, short lead, alarm level): the quiet signatures, from the peer relation itself.

        silent: over ``silent_window_s`` the member is the busiest of its job by a clock-normalized lead
        >= ``silent_lead`` (it computes longer at the same clock while its peers wait), or one of its two CUSUMs
        (``_cusum``: of that lead, and of the change, module docstring) passed its alarm as the busiest of its
        job, from the change point it estimates on; the alarm level is the larger CUSUM over its alarm (1 = alarm);
        settled: the first (long-window) part alone, which a finding needs to be confirmed (the CUSUM suspects).
        spell: over two samples it is the busiest by >= ``spell_lead`` at the same clock (or throttled with
        the clock path's lead), for at least ``spell_min_s`` in a row.
        """
        nan = np.full(gate.shape, np.nan)
        none = np.zeros_like(gate)
        if top is None:
            return none, none, none, nan, nan
        long_w, spell_n = max(1, round(self.silent_window_s / step_s)), max(2, round(self.spell_min_s / step_s))
        # A lead its lower clock explains is the clock path's, or healthy chip-to-chip spread: divide it out.
        clk = np.where(at_work, np.where(np.isnan(clk_rel), 1.0, clk_rel), np.nan)
        TEN, SM = np.where(at_work, TEN, np.nan), np.where(at_work, SM, np.nan)
        lead_l, spread_l, _ = self._lead(TEN, SM, use_t, ref, long_w, True)
        # A member's own long lead rests on half its window's samples fresh at least (its peers' level on whatever
        # they have): a node in a scrape job of 4x the step gives ~4, whose noise and drift read as a 6 % lead
        # (replayed: 3 false warnings on healthy-heterogeneous's 4x node over 5 never-used seeds).
        fresh = rolling_mean((~np.isnan(np.where(use_t, TEN, SM))).astype(np.float64), long_w)
        lead_l = np.where(fresh >= 0.5, lead_l, np.nan)
        lead_s, _, _ = self._lead(TEN, SM, use_t, ref, 2)
        lead_1, _, level_1 = self._lead(TEN, SM, use_t, ref, 1)
        big = (top.sizes() >= self.silent_min_members)[:, None]
        base_w = max(2, round(self.change_baseline_s / step_s))
        fall_1 = _then_over_now(level_1, base_w)  # the gang's slowdown
        minutes = step_s / 60.0
        with np.errstate(invalid="ignore", divide="ignore"):
            norm_l = lead_l * rolling_mean(clk, long_w)
            norm_s = lead_s * rolling_mean(clk, 2)
            norm_1 = lead_1 * clk
            if DRAM is not None:
                norm_1, fall_1 = self._with_dram(norm_1, fall_1, np.where(at_work, DRAM, np.nan), use_t, ref,
                                                 base_w)
            z = (norm_l - 1.0) / np.fmax(spread_l, self.mad_floor)  # NaN spread (a pair): the relative test decides
            # A gang waiting for a member whose slowness is explained (input-starved, or throttled with the clock
            # path's lead) slows for that one, and all its other members lead: the busiest of them is no straggler
            # (the spells and the change CUSUM name the busiest member; the lead CUSUM can only fall meanwhile).
            fed = ~(block_max(top, explained.astype(np.float64)) == 1.0)
            busiest = fed & (lead_s >= block_max(top, lead_s))
            silent = (gate & big & (norm_l >= 1.0 + self.silent_lead) & (norm_l >= block_max(top, norm_l))
                      & ~(z < self.silent_z))
            spell = gate & busiest & (
                (norm_s >= 1.0 + self.spell_lead) | (throttled & (lead_s >= 1.0 + self.clock_lead_min)))
            gain = norm_1 - 1.0 - self.cusum_k
            cusum = _cusum(np.where(gate & big, np.where(fed, gain, np.minimum(gain, 0.0)), np.nan) * minutes, idle,
                           cap=2.0 * self.cusum_h)
            # The change: its lead over the midpoint of its peers' level and its own recent one, while the gang
            # slowed by as much (the peers' activity fell below theirs), the lesser of the two; NaN (held) until a
            # baseline is known.
            change = np.minimum(norm_1 - (1.0 + trailing_median(norm_1, base_w)) / 2.0, fall_1 - 1.0)
            # Only the busiest member gains: over two samples, in this one by a spell's lead (the two-sample
            # lead, half of it the minute before, lagged the first minute of a spell behind a drifting peer's), or
            # in the next two (a spell's first minute seen from its second: in a 32-GPU gang some healthy member's
            # noise peak leads by ~8 % in any one sample, ahead of a member at a drift low in its first minute).
            busy_now = busiest | (fed & (lead_1 >= block_max(top, lead_1)) & (norm_1 >= 1.0 + self.spell_lead))
            busy_now |= np.pad(busiest[:, 1:], ((0, 0), (0, 1)))
            change = np.where(busy_now, change, np.minimum(change, 0.0))
            cusum_c = _cusum(np.where(gate & big, change - self.change_k, np.nan) * minutes, idle,
                             cap=2.0 * self.change_h)
            level = np.fmax(cusum / self.cusum_h, cusum_c / self.change_h)
            alarm = (((cusum >= self.cusum_h) & (cusum >= block_max(top, cusum)))
                     | ((cusum_c >= self.change_h) & (cusum_c >= block_max(top, cusum_c))))
        # A lead back within the time the CUSUM takes to forget a full alarm (cap / k) is the same problem
        # recurring (an intermittent straggler's next spell): one episode, not one per spell.
        sequential = _fill_gaps(_alarm_runs(level, alarm), math.ceil(2.0 * self.cusum_h / self.cusum_k / minutes))
        # A spell one sample short counts where the member's CUSUM alarms in it: chance leads of ~2 minutes are
        # common, a CUSUM alarm on one rare (module docstring, intermittent).
        short = _runs_at_least(spell, max(2, spell_n - 1))
        spells = _runs_at_least(spell, spell_n) | _alarm_runs(short.astype(np.float64), alarm & short)
        return silent | sequential, silent, spells, lead_s, level

    def _with_dram(self, norm: np.ndarray, fall: np.ndarray, D: np.ndarray, use_t: np.ndarray, ref: Any,
                   base_w: int) -> tuple[np.ndarray, np.ndarray]:
        """The gang's slowdown (then over now) averaged with DRAM activity's, where the peers move memory
        (>= ``dram_min``): every member moves its bytes per step over a longer step. The clock-normalized lead
        too, where it is tensor activity's (SM activity not collected): a member given more work moves more
        bytes, with its own sampling noise and, where the kernel mix shifts from tensor to memory work, the
        opposite drift. Bytes are no cycles: not clock-normalized; nor averaged with SM activity's lead, which a
        stalling member raises alone."""
        rD, _ = ref(D, False)
        with np.errstate(invalid="ignore", divide="ignore"):
            lead_d = np.where(rD >= self.dram_min, D / rD, np.nan)
        fall_d = _then_over_now(rD, base_w)
        both = ~np.isnan(lead_d)
        return (np.where(both & use_t, (norm + lead_d) / 2.0, norm),
                np.where(both & ~np.isnan(fall_d), (fall + fall_d) / 2.0, fall))

    def _tristate(self, cells: _Cells, steps: int) -> np.ndarray:
        cond = np.where(cells.known, (cells.compute | cells.input | cells.nvlink | cells.silent).astype(np.float64),
                        np.nan)
        k = max(1, math.ceil(self.persist * steps))
        return persistent(cond, steps, k)

    # Main ------------------------------------------------------------------------------
    def detect(self, fleet: Fleet, memory: dict | None = None) -> list[Finding]:
        """Findings of the data; ``memory``: the service's part for this kind (``_carry_spells``)."""
        f = fleet.frame
        if not len(f) or "job" not in f.columns:
            return []
        if not (fleet.has("tensor_active") or fleet.has("sm_active")):
            fleet.notes.append("straggler: neither tensor nor SM activity is collected: a straggler cannot be told "
                               "from the peers waiting for it, no straggler findings")
            return []
        pg = peer_groups(fleet)
        if pg.n_slots == 0:
            return []
        blind = ("straggler: SM activity is not collected: a GPU slow at its full clock because it stalls (the same "
                 "work in more cycles) leaves tensor activity and memory traffic with its peers' and cannot be told; "
                 "enable DCGM_FI_PROF_SM_ACTIVE")
        if not fleet.has("sm_active") and blind not in fleet.notes:
            fleet.notes.append(blind)
        # Activity is compared at one instant, so a held sample (a device scraped less often than the step,
        # repeating a value of minutes ago) is unknown there (``PeerGroups.fresh``): a node scraped every 4 minutes
        # still showing its gang's start-up made the other node of a 2-node job "37 % ahead" (healthy-heterogeneous,
        # dcgm's default counters, serve's replay: a false warning).
        U, TEN, SM = pg.matrix(gpu_busy(fleet)), pg.fresh("tensor_active"), pg.fresh("sm_active")
        CLK, CLKMAX, NVL = pg.matrix("sm_clock"), pg.matrix(clock_max(fleet)), pg.matrix("nvlink_bps")
        steps = max(1, round(self.window_s / fleet.step))
        TEMP = pg.matrix("temp")
        gpu = self._cells(U, TEN, SM, CLK, CLKMAX, NVL, TEMP, pg.reference, steps, pg.blocks,
                          fleet.step, pg.held,
                          pg.fresh("dram_active") if fleet.has("dram_active") else None,
                          np.fmax(pg.matrix("power_throttle"), pg.matrix("thermal_throttle")))
        gpu_cond = self._tristate(gpu, steps)

        # Node level: host medians of each group against the group's other hosts.
        hosts = _NodeView(pg)
        node = self._cells(hosts.median(U), hosts.median(TEN), hosts.median(SM), hosts.median(CLK),
                           hosts.median(CLKMAX), hosts.median(NVL), hosts.median(TEMP), hosts.reference,
                           steps) if hosts.any else None
        out: list[Finding] = []
        if node is not None:
            node_cond = self._tristate(node, steps)
            node_cond = np.where(hosts.multi, node_cond, np.nan)  # a node of one GPU is that GPU
            # A node that stands out names its GPUs: drop their GPU-level condition meanwhile. A node problem
            # often shows on one of its GPUs first (the hottest card of a warming node throttles minutes before
            # the node's median does): GPU-level condition running without a break into the node's is the node
            # problem's start (``joined``), and GPU findings inside that span are the node finding's.
            on_node = node_cond == 1.0
            any_gpu = block_max(hosts.hosts, (gpu_cond == 1.0).astype(np.float64)) == 1.0
            joined = _alarm_runs((on_node | any_gpu).astype(np.float64), on_node)
            # ... once the node's condition has lasted long enough to be reported (``suspect_after_s``), and the
            # node's finding is judged with that lead-in (``_node_findings``): before, its GPUs' suspects vanished
            # a run or two before the node's finding came, and a node finding whose GPUs had been confirmed came
            # as a suspect (rack-cooling, replayed: the problem withdrawn, or its warning fell to info).
            shown = _runs_at_least(on_node, max(1, round(self._shortest_s / fleet.step)))
            gpu_cond = np.where(shown, 0.0, gpu_cond)
            out += self._node_findings(fleet, pg, hosts, node, node_cond, joined)
        return out + _inside_node(out, _merge_intermittent(self._gpu_findings(fleet, pg, gpu, gpu_cond),
                                                           self._intermittent_findings(fleet, pg, gpu, memory)))

    # Findings -------------------------------------------------------------------------
    _SIGNALS = ("thermal_throttle", "power_throttle", "temp", "power", "power_limit", "pcie_gen", "pcie_gen_max",
                "pcie_width", "pcie_width_max", "pcie_replay_rate", "nvlink_error_rate", "nvlink_links_down")

    @staticmethod
    def _means(eps: Any, flat: Any, cells: _Cells, signal: Any) -> dict[str, np.ndarray]:
        """Per-episode means of the cells (``flat``: matrix -> the episodes' rows) and of the raw signals."""
        m = {k: eps.mean(flat(getattr(cells, k))) for k in ("lead", "clk_rel", "clk", "util", "nvl_rel")}
        m["ref_clk"], m["ref_util"] = eps.mean(flat(cells.ref_clk)), eps.mean(flat(cells.ref_util))
        for k in ("input", "compute", "nvlink", "silent", "settled"):
            m[k] = eps.mean(flat(getattr(cells, k).astype(np.float64)))
        # Where only the quiet paths speak, the slowdown is their lead (SM activity's where collected, over fresh
        # samples at work): the window's average (compute path) takes every sample a peer has, a node's held ones
        # too (a node scraped every 2 minutes still showing its gang's start-up read as a member 37 % ahead).
        quiet = (m["compute"] < 0.5) & (m["input"] < 0.5) & (m["nvlink"] < 0.5)
        q = eps.mean(flat(cells.spell_lead))
        m["lead"] = np.where(quiet & ~np.isnan(q), q, m["lead"])
        m["alarm_now"] = eps.last(flat(cells.alarm_level))
        m["alarm_max"] = eps.max(flat(cells.alarm_level))
        for k in Straggler._SIGNALS:
            m[k] = eps.mean(signal(k))
        return m

    @property
    def _shortest_s(self) -> float:
        """The shortest episode reported: a suspect's ``suspect_after_s`` (at most ``min_duration_s``)."""
        return min(self.suspect_after_s, self.min_duration_s)

    def _episodes(self, fleet: Fleet, cond: np.ndarray) -> Any:
        """Episodes of a condition, suspected ones (open, >= ``suspect_after_s``) included."""
        return find_episodes(fleet, cond, max_gap_steps=self.max_gap_steps, max_unknown_steps=self.max_unknown_steps,
                             min_duration_s=self._shortest_s, split_on=("job",))

    def _status(self, ep: Any, v: dict[str, float] | None = None, data_start: float | None = None) -> str | None:
        """"confirmed" (lasted ``min_duration_s``), "suspected" (still open, shorter) or None (withdrawn:
        it ended short)."""
        evidence = float(getattr(ep, "evidence_s", ep.duration_s))
        if v is not None and max(v["settled"], v["compute"], v["input"], v["nvlink"]) < 0.5:
            # Only the CUSUM speaks: it suspects early, it never confirms (two strong spells are no pattern;
            # the long window, or the intermittent path's spells, confirm).
            evidence = 0.0
        elif v is not None and v["silent"] >= 0.5 and max(v["compute"], v["input"], v["nvlink"]) < 0.5:
            # Only the peer relation speaks, and its long average is cut short at an edge of the data (half a
            # window: noisier, a healthy member's drift peak can pass for a lead): that part suggests, never
            # confirms. At the end while the episode is open; at the start where a window (serve's) cut it, e.g.
            # the last healthy minutes of a GPU that then fell off the bus, its peers left hanging.
            edges = int(bool(ep.open)) + int(data_start is not None and float(ep.start) <= data_start)
            evidence -= edges * self.silent_window_s / 2
        if evidence >= self.min_duration_s - 1e-6:
            return "confirmed"
        if not ep.open or v is None:
            return None
        # Early, only on strong evidence: a lower clock explaining the lead, a large slowdown, or the
        # busiest member by a CUSUM that alarmed in this episode and has not forgotten it (the peer relation itself).
        clocked = v["compute"] >= 0.5 and v["clk_rel"] <= 1.0 - self.clock_drop
        silent = v["silent"] >= 0.5 and v["alarm_now"] > 0.0 and v["alarm_max"] >= 1.0
        return "suspected" if clocked or silent or self._slowdown(v) >= self.suspect_slowdown else None

    def _gpu_findings(self, fleet: Fleet, pg: PeerGroups, cells: _Cells, cond: np.ndarray) -> list[Finding]:
        if not (cond == 1.0).any():
            return []
        eps = self._episodes(fleet, pg.to_rows(cond))
        if not len(eps):
            return []
        m = self._means(eps, pg.to_rows, cells, lambda k: column(fleet, k))
        members = _members(pg)
        conf = "high" if fleet.has("sm_active") and fleet.has("sm_clock") else "low"
        out = []
        for i, ep in enumerate(eps.table.itertuples(index=False)):
            v = {k: float(a[i]) for k, a in m.items()}
            status = self._status(ep, v, fleet.start)
            if status is None:
                continue
            n_members = members.get((ep.job, ep.hostname, ep.gpu, ep.gpu_instance or None), 1)
            out.append(self._finding(ep, v, _who(ep), n_members - 1, conf, gpu=_int(ep.gpu),
                                     suspected=status == "suspected"))
        return out

    def _node_findings(self, fleet: Fleet, pg: PeerGroups, hosts: _NodeView, cells: _Cells, cond: np.ndarray,
                       joined: np.ndarray) -> list[Finding]:
        # Episodes on a small fleet with one row per (group, host, t): the node-slot's first GPU stands for it.
        if not (cond == 1.0).any():
            return []
        rep = hosts.rep_slot
        sel = hosts.multi[:, 0] & (np.arange(pg.n_slots) == rep)
        idx = np.flatnonzero(sel)
        if not len(idx):
            return []
        T = pg.T
        times = fleet.start + np.arange(T) * fleet.step
        labels = [pg.group_labels[g] for g in pg.slot_group[idx]]
        frame = pd.DataFrame({
            "timestamp": np.tile(times, len(idx)),
            "hostname": pd.Categorical(np.repeat(pg.slot_host[idx].astype(str), T)),
            "gpu": pd.Categorical(np.repeat([""] * len(idx), T)),
            "uuid": pd.Categorical(np.repeat([""] * len(idx), T)),
            "gpu_instance": pd.Categorical(np.repeat([""] * len(idx), T)),
            "job": pd.Categorical(np.repeat([str(lb.get("job")) for lb in labels], T)),
            "namespace": pd.Categorical(np.repeat([str(lb.get("namespace") or "") for lb in labels], T)),
            "gpu_share": np.repeat(hosts.share[idx], T),
        })
        small = Fleet(frame=frame, step=fleet.step, start=fleet.start, end=fleet.end)
        eps = self._episodes(small, cond[idx].reshape(-1))
        if not len(eps):
            return []

        def flat(mx: np.ndarray) -> np.ndarray:
            return mx[idx].reshape(-1)

        m = self._means(eps, flat, cells, lambda k: flat(hosts.median(pg.matrix(k))))
        size = hosts.size
        conf = "high" if fleet.has("sm_active") and fleet.has("sm_clock") else "low"
        out = []
        for i, ep in enumerate(eps.table.itertuples(index=False)):
            v = {k: float(a[i]) for k, a in m.items()}
            s = idx[np.flatnonzero((pg.slot_host[idx] == ep.hostname)
                                   & np.array([pg.group_labels[g].get("job") == ep.job
                                               for g in pg.slot_group[idx]]))[0]]
            ep = _lead_in(ep, joined[s], fleet)
            status = self._status(ep, v, fleet.start)
            if status is None:
                continue
            g = pg.slot_group[s]
            n_here = int(size[s])
            n_group = int(pg.bounds[g + 1] - pg.bounds[g])
            out.append(self._finding(ep, v, f"Node {ep.hostname}", n_group - n_here, conf, gpu=None, n_node=n_here,
                                     suspected=status == "suspected"))
        return out

    def _first_spell(self, ep: Any, level: np.ndarray, first: np.ndarray, fleet: Fleet) -> Any:
        """The episode started at its earliest spell, counted or not (one slot's alarm level and counted spell
        starts).

        The first spells of a quiet straggler are often too short or too weak to count (three samples in a row
        as the busiest by 8 %), yet each lifts the member's CUSUM: the problem started where the CUSUM last left
        zero before the first counted spell (its change-point estimate, as on the silent path), or, going back
        spell by spell, where an earlier rise of the CUSUM to half its alarm level began that came at most the
        pattern's own longest spacing (between its counted spells) before. A healthy member reaches half the
        alarm level rarely, and only a rise at the pattern's spacing right before it is taken for its spell: the
        latest such rise ending within the spacing, past weaker ones (a blip of the CUSUM between two spells, at
        0.03 of its alarm level, had hidden a first spell at 1.3 from its pattern: straggler-intermittent's 15 %
        member at seed +1010 placed 9 minutes late). A counted spell within ``spell_gap_s`` of where the episode
        now starts joins it, as two counted spells that close form one episode (the 10 % member at seed +13: its
        first spell counted, the next two under half the alarm level, the episode began with the fourth, 30
        minutes late)."""
        i = _sample(ep, fleet)
        starts = np.flatnonzero(first[i:i + round(float(ep.duration_s) / fleet.step)])
        spacing = int(np.diff(starts).max()) if len(starts) >= 2 else round(self.spell_gap_s / fleet.step)
        rising = level > 0.0
        gap = round(self.spell_gap_s / fleet.step)
        c = _run_start(rising, i)
        while c > 0:
            lo = max(c - spacing, 0)
            ends = lo + np.flatnonzero(rising[lo:c] & ~rising[lo + 1:c + 1])  # rises ending within one spacing
            runs = [(_run_start(rising, int(b)), int(b)) for b in ends]
            strong = [a for a, b in runs if level[a:b + 1].max() >= 0.5]
            counted = max(c - gap, 0) + np.flatnonzero(first[max(c - gap, 0):c])
            if len(counted):  # a counted spell within spell_gap_s of where it now starts: one episode, as it would be
                strong.append(_run_start(rising, int(counted[-1])) if rising[counted[-1]] else int(counted[-1]))
            if not strong:
                break
            c = max(strong)
        return _started_at(ep, c, fleet)

    def _intermittent_findings(self, fleet: Fleet, pg: PeerGroups, cells: _Cells,
                               memory: dict | None = None) -> list[Finding]:
        """Recurring slow spells of one member: spells at most ``spell_gap_s`` apart form one episode (from
        the first spell's start to the last one's end); it is a finding with >= ``spells_min`` spells covering
        >= ``duty_min`` of that span (``_merge_intermittent`` then settles overlaps with continuous findings).
        ``memory``: the spells earlier runs saw before this window join its episodes (``_carry_spells``)."""
        spell = cells.spell
        carried = self._carry_spells(memory, pg, spell, fleet) if memory is not None else {}
        if not spell.any():
            return []
        gap = max(1, round(self.spell_gap_s / fleet.step))
        cond = np.where(cells.known, spell.astype(np.float64), np.nan)
        eps = find_episodes(fleet, pg.to_rows(cond), max_gap_steps=gap, max_unknown_steps=gap,
                            min_duration_s=0.0 if carried else self.min_duration_s, split_on=("job",))
        if not len(eps):
            return []
        first = spell & ~np.pad(spell, ((0, 0), (1, 0)))[:, :-1]
        duty = eps.mean(pg.to_rows(spell.astype(np.float64)), "all")
        n_spells = eps.sum(pg.to_rows(first.astype(np.float64)))
        m = self._means(eps, pg.to_rows, cells, lambda k: column(fleet, k))
        m["lead"] = eps.mean(pg.to_rows(cells.spell_lead))
        members, slots = _members(pg), _slots(pg)
        conf = "high" if fleet.has("sm_active") and fleet.has("sm_clock") else "low"
        out = []
        for i, ep in enumerate(eps.table.itertuples(index=False)):
            end = float(ep.end) if not ep.open else fleet.end
            key = (ep.job, ep.hostname, ep.gpu, ep.gpu_instance or None)
            slow, n = float(ep.true_steps) * fleet.step, int(n_spells[i])
            ep = self._first_spell(ep, cells.alarm_level[slots[key]], first[slots[key]], fleet)
            before = _chained(carried.get(key), float(ep.start), self.spell_gap_s)
            if before is not None:  # spells of earlier runs this one's episode goes on from
                ep = begun_earlier(ep, float(ep.start) - before[0])
                n, slow = n + before[1], slow + before[2]
            span = max(end - float(ep.start), fleet.step)
            share = min(slow / span, 1.0) if before is not None else float(duty[i])
            if n < self.spells_min or share < self.duty_min or float(ep.evidence_s) < self.min_duration_s - 1e-6:
                continue
            v = {k: float(a[i]) for k, a in m.items()}
            v.update(compute=1.0, input=0.0, nvlink=0.0)
            n_members = members.get(key, 1)
            fnd = self._finding(ep, v, _who(ep), n_members - 1, conf, gpu=_int(ep.gpu),
                                spells=(n, share, slow / max(n, 1) / 60.0))
            fnd.end = None if fleet.end - end <= self.spell_gap_s else end  # recurring as far as the data tells
            out.append(fnd)
        return out

    def _carry_spells(self, memory: dict, pg: PeerGroups, spell: np.ndarray, fleet: Fleet) -> dict[tuple, dict]:
        """Each GPU's spells as earlier runs saw them (the state this run starts from), and this run's kept for the
        next: ``{(job, host, gpu, instance): {"recent": [[start, end], ...], "before": [first start, spells,
        slow seconds, last end] or None}}``.

        Why: serve's 30-minute window holds three spells of a 10-minute period only while none of them slides out
        or counts short, so a confirmed intermittent member came and went with the window (withdrawn between
        runs) and one of a longer period was never confirmed. Spells that began before this window are kept as
        earlier runs saw them; those inside it as this run sees them (the two joined where one runs into the
        window). Spells ending over ``spell_memory_s`` ago fold into one summary of the pattern they chain to
        (``spell_gap_s`` apart at most); a GPU with no spell for that long plus the gap is forgotten."""
        book = memory.setdefault("spells", {})
        carried = dict(book)
        seen = _spell_times(pg, spell, fleet)
        for key in set(book) | set(seen):
            entry = book.get(key) or {"recent": [], "before": None}
            runs = union_spans([sp for sp in entry["recent"] if sp[0] < fleet.start] + seen.get(key, []))
            before, keep = entry["before"], []
            for a, b in runs:
                if b >= fleet.end - self.spell_memory_s:
                    keep.append([a, b])
                elif before is None or a - before[3] > self.spell_gap_s:
                    before = [a, 1, b - a, b]
                else:
                    before = [before[0], before[1] + 1, before[2] + b - a, b]
            last = keep[-1][1] if keep else (before[3] if before is not None else -math.inf)
            if fleet.end - last > self.spell_memory_s + self.spell_gap_s:
                book.pop(key, None)
            else:
                book[key] = {"recent": keep, "before": before}
        return {k: {"recent": [sp for sp in v["recent"] if sp[0] < fleet.start], "before": v["before"]}
                for k, v in carried.items()}

    def _cause(self, v: dict[str, float]) -> tuple[str, str]:
        """(cause, detail) from the member's episode means; see the module docstring."""
        clk, ref = v["clk"], v["ref_clk"]
        clock_txt = (f"SM clock {clk / 1e9:.2f} GHz vs {ref / 1e9:.2f} GHz"
                     if math.isfinite(clk) and math.isfinite(ref) else "clocks not reported")
        lower = math.isfinite(v["clk_rel"]) and v["clk_rel"] <= 1.0 - self.clock_drop
        pcie_low = v["pcie_gen"] < v["pcie_gen_max"] - 0.5 or v["pcie_width"] < v["pcie_width_max"] - 0.5
        pcie_txt = (f"PCIe link at gen{v['pcie_gen']:.0f} x{v['pcie_width']:.0f} of "
                    f"gen{v['pcie_gen_max']:.0f} x{v['pcie_width_max']:.0f}")
        if v["input"] >= 0.5 and v["input"] >= v["compute"]:
            # Idle gaps outside kernels: waiting for data, over a downgraded link or from the loader.
            if pcie_low:
                return "pcie", f"{pcie_txt}: idle {1 - v['util'] / max(v['ref_util'], 1e-6):.0%} of each step on copies"
            unseen = " (PCIe link state not collected)" if math.isnan(v["pcie_gen"]) else ""
            return "input", (f"input starvation: GPUs busy only {v['util']:.0%} of the time vs "
                             f"{v['ref_util']:.0%} on its peers{unseen}")
        if v["compute"] >= 0.5 or v["nvlink"] < 0.5:
            if v["thermal_throttle"] >= 0.5 or (math.isnan(v["thermal_throttle"]) and lower
                                                and v["temp"] >= self.thermal_celsius):
                return "thermal", f"thermal throttling at {v['temp']:.0f} C, {clock_txt}"
            capped = v["power"] >= self.power_cap_ratio * v["power_limit"]
            if v["power_throttle"] >= 0.5 or (math.isnan(v["power_throttle"]) and lower and capped):
                return "power", (f"power capping at {_watts(v['power'])} of {_limit(v['power_limit'])}, "
                                 f"{clock_txt}")
            if pcie_low or v["pcie_replay_rate"] > 0:
                return "pcie", pcie_txt
        if v["nvlink"] >= 0.5 or v["nvlink_error_rate"] > 0 or v["nvlink_links_down"] > 0:
            down = f", {v['nvlink_links_down']:.0f} link(s) down" if v["nvlink_links_down"] > 0 else ""
            errs = f", errors {v['nvlink_error_rate']:.2g}/s" if v["nvlink_error_rate"] > 0 else ""
            return "nvlink", f"NVLink traffic {v['nvl_rel']:.0%} of its peers'{down}{errs}"
        if lower:
            return "unknown", f"{clock_txt} with no throttle reason reported"
        return "unknown", ("unexplained: suspect the GPU/HBM, or data imbalance (same clock, no throttling, link or "
                           "input evidence; it is the busiest member while its peers wait)")

    def _slowdown(self, v: dict[str, float]) -> float:
        """The job's slowdown from the member's episode means (module docstring, Impact)."""
        if v["input"] >= 0.5 and v["input"] >= v["compute"]:
            slowdown = v["ref_util"] / max(v["util"], 1e-6) - 1.0
        elif v["compute"] >= 0.5 or not v["nvlink"] >= 0.5:
            slowdown = v["lead"] - 1.0
        else:  # the collective stretched by 1/bandwidth share, on the assumed communication share of a step
            slowdown = self.comm_share * (1.0 / max(v["nvl_rel"], 1e-3) - 1.0)
        return max(slowdown, 0.0) if math.isfinite(slowdown) else 0.0

    def _finding(self, ep: Any, v: dict[str, float], who: str, n_peers: int, conf: str, *, gpu: int | None,
                 n_node: int | None = None, suspected: bool = False,
                 spells: tuple[int, float, float] | None = None) -> Finding:
        """One finding; ``suspected``: still short of ``min_duration_s`` (lower severity, "low" confidence);
        ``spells``: (count, duty cycle, mean minutes) of an intermittent straggler."""
        cause, detail = self._cause(v)
        slowdown = self._slowdown(v)
        waiting = 1.0 - 1.0 / (1.0 + slowdown)  # share of each peer's time spent at the barrier
        hours = float(ep.duration_s) / 3600.0
        duty = spells[1] if spells else 1.0
        lost = max(n_peers, 0) * hours * waiting * duty * float(ep.gpu_share if n_node is None else 1.0)
        severity = "critical" if slowdown >= self.critical_slowdown or lost >= self.critical_gpu_hours else "warning"
        job = ep.job or "its job"
        peers = f"the other {n_peers} GPU{'s' if n_peers != 1 else ''}"
        how = f"is slowing job {job} by ~{slowdown:.0%}"
        if spells:
            how += (f" in recurring spells ({spells[0]} spells of ~{spells[2]:.0f} min, slow {duty:.0%} of "
                    "the time)")
        summary = (f"{who} {how} ({detail}): {peers} lost ~{lost:.1f} GPU-hours "
                   f"waiting over {format_duration(float(ep.duration_s))}; {_ADVICE[cause]}.")
        if suspected:  # early warning: lower severity, confirmed (or withdrawn) once min_duration_s has passed
            severity = "warning" if slowdown >= self.suspect_slowdown else "info"
            conf = "low"
            # Lasting min_duration_s already, it is suspected because only the sequential evidence (or a long
            # average cut short at an edge of the data) shows it: another 10 minutes would not confirm it.
            until = (f"confirmed once a {format_duration(self.silent_window_s)} average or {self.spells_min} "
                     "recurring spells show it" if float(ep.duration_s) >= self.min_duration_s
                     else f"confirmed if it lasts {format_duration(self.min_duration_s)}")
            summary = (f"Suspected straggler: {who} {how} for {format_duration(float(ep.duration_s))} ({detail}); "
                       f"{until}.")
        evidence = {
            "cause": cause, "cause_detail": detail, "level": "gpu" if n_node is None else "node",
            "slowdown": slowdown, "lost_gpu_hours": lost, "peers": n_peers, "activity_lead": v["lead"],
            "sm_clock_hz": v["clk"], "peer_sm_clock_hz": v["ref_clk"], "clock_ratio_to_peers": v["clk_rel"],
            "gpu_util": v["util"], "peer_gpu_util": v["ref_util"], "temp_celsius": v["temp"],
            "power_watts": v["power"], "power_limit_watts": v["power_limit"],
            "thermal_throttle_share": v["thermal_throttle"], "power_throttle_share": v["power_throttle"],
            "minutes": float(ep.duration_s) / 60.0, "suspected": suspected,
        }
        if n_node is not None:
            evidence["node_gpus"] = n_node
        if spells:
            evidence.update(intermittent=True, spells=spells[0], duty_cycle=duty, spell_minutes=spells[2])
        return Finding(
            kind=self.kind, severity=severity, summary=summary, start=float(ep.start),
            end=None if ep.open else float(ep.end), score=float(np.clip(slowdown, 0.0, 1.0)),
            hostname=ep.hostname, gpu=gpu, uuid=(ep.uuid or None) if gpu is not None else None,
            gpu_instance=(ep.gpu_instance or None) if gpu is not None else None, job=ep.job,
            namespace=ep.namespace or None, pod=getattr(ep, "pod", None) if gpu is not None else None,
            rack=ep.rack or None if hasattr(ep, "rack") and ep.rack else None, confidence=conf, evidence=evidence,
        )


def _then_over_now(level: np.ndarray, base_w: int) -> np.ndarray:
    """The peers' level over the previous ``base_w`` samples (median) over theirs now: > 1 where the gang slowed."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return trailing_median(level, base_w) / level


def _minutes(m: np.ndarray, n: int) -> np.ndarray:
    """NaN-skipping means of consecutive groups of ``n`` steps along time (the last one may be short), per row."""
    T = m.shape[1]
    x = np.pad(m.astype(np.float64), ((0, 0), (0, -T % n)), constant_values=np.nan).reshape(m.shape[0], -1, n)
    known = ~np.isnan(x)
    counts = known.sum(axis=2)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, np.where(known, x, 0.0).sum(axis=2) / counts, np.nan)


def _runs_at_least(mask: np.ndarray, n: int) -> np.ndarray:
    """The cells of ``mask`` (slots x time) in runs of at least ``n`` True samples in a row."""
    T = mask.shape[1]
    out = np.zeros(mask.shape, bool)
    if n > T:  # a window shorter than one run (a short file, the first minutes of serve)
        return out
    c = np.cumsum(np.pad(mask, ((0, 0), (1, 0))).astype(np.int64), axis=1)
    full = np.zeros(mask.shape, bool)  # full[:, t]: mask[:, t:t + n] all True
    full[:, :T - n + 1] = (c[:, n:] - c[:, :T - n + 1]) == n
    for k in range(n):  # a cell belongs to a full run starting at most n - 1 samples before it
        out[:, k:] |= full[:, :T - k]
    return out


def _cusum(x: np.ndarray, reset: np.ndarray, cap: float) -> np.ndarray:
    """One-sided CUSUM along time per slot row: ``S_t = min(cap, max(0, S_{t-1} + x_t))``; NaN ``x`` holds
    ``S`` (nothing known), ``reset`` sets it to 0. The cap bounds how long it takes to fall back once the lead
    is gone (cap / k minutes at no lead)."""
    out = np.zeros(x.shape)
    s = np.zeros(x.shape[0])
    known = ~np.isnan(x)
    inc = np.where(known, x, 0.0)
    for t in range(x.shape[1]):  # a recursion: one vectorized step per sample over every slot
        s = np.where(reset[:, t], 0.0, np.minimum(cap, np.maximum(0.0, s + inc[:, t])))
        out[:, t] = s
    return out


def _alarm_runs(cusum: np.ndarray, alarm: np.ndarray) -> np.ndarray:
    """The cells of every run of a positive CUSUM that holds an alarm: from the change point the CUSUM
    estimates (where it last left zero) until it is back at zero."""
    n, T = cusum.shape
    # Runs numbered across the whole matrix (a new run after every zero and on every row), so they are
    # contiguous in the flattened order: whether a run holds an alarm is one reduceat.
    run = (np.cumsum(cusum <= 0.0, axis=1) + np.arange(n)[:, None] * (T + 1)).ravel()
    first = np.flatnonzero(np.diff(run, prepend=-1))
    if not run.size:
        return np.zeros(cusum.shape, bool)
    hit = np.maximum.reduceat(alarm.ravel(), first)
    starts = np.zeros(run.size, np.int64)
    starts[first] = 1
    return hit[np.cumsum(starts) - 1].reshape(n, T) & (cusum > 0.0)


def _fill_gaps(mask: np.ndarray, n: int) -> np.ndarray:
    """``mask`` (slots x time) with its gaps of at most ``n`` samples between True cells filled."""
    T = mask.shape[1]
    t = np.arange(T)
    before = np.maximum.accumulate(np.where(mask, t, -(n + 1)), axis=1)
    after = np.minimum.accumulate(np.where(mask, t, T + n + 1)[:, ::-1], axis=1)[:, ::-1]
    return mask | (after - before - 1 <= n)


def _spell_times(pg: PeerGroups, spell: np.ndarray, fleet: Fleet) -> dict[tuple, list[list[float]]]:
    """Per GPU slot with spells: their [start, end] times."""
    out = {}
    for s in np.flatnonzero(spell.any(axis=1)):
        d = np.diff(np.concatenate(([0], spell[s].astype(np.int8), [0])))
        out[_slot_key(pg, int(s))] = [[fleet.start + a * fleet.step, fleet.start + b * fleet.step]
                        for a, b in zip(np.flatnonzero(d == 1), np.flatnonzero(d == -1), strict=True)]
    return out


def _chained(entry: dict | None, start: float, gap: float) -> tuple[float, int, float] | None:
    """(first start, spells, slow seconds) of the carried spells an episode starting at ``start`` goes on from:
    back from it while each is at most ``gap`` before the next (a spell running into it is its first, counted
    once), then the folded summary before them; None when none is."""
    if entry is None:
        return None
    c, n, slow = start, 0, 0.0
    for a, b in reversed(entry["recent"]):
        if c - b > gap:
            return (c, n, slow) if n or c < start else None
        n, slow, c = n + int(b < c), slow + min(b, c) - a, a
    before = entry["before"]
    if before is not None and c - before[3] <= gap:
        c, n, slow = before[0], n + before[1], slow + before[2]
    return (c, n, slow) if c < start else None


def _merge_intermittent(found: list[Finding], spells: list[Finding]) -> list[Finding]:
    """A member slow less than half the time is intermittent: its recurring-spell finding replaces the
    continuous findings it overlaps (a long window's average of the spells); slow most of the time, the
    continuous findings stand and the spell finding goes."""
    def over(a: Finding, b: Finding) -> bool:
        return ((a.hostname, a.gpu, a.job) == (b.hostname, b.gpu, b.job) and a.start < (b.end or math.inf)
                and b.start < (a.end or math.inf))

    keep, drop = [], set()
    for sp in spells:
        hits = {i for i, f in enumerate(found) if over(f, sp)}
        if sp.evidence["duty_cycle"] < 0.5:
            drop |= hits
            keep.append(sp)
        elif not hits:
            keep.append(sp)
    return [f for i, f in enumerate(found) if i not in drop] + keep


def _sample(ep: Any, fleet: Fleet) -> int:
    """The sample index of an episode's start."""
    return round((float(ep.start) - fleet.start) / fleet.step)


def _run_start(mask: np.ndarray, i: int) -> int:
    """Where the run of True in ``mask`` (one slot's row) that goes on up to sample ``i`` began (``i``: none)."""
    before = np.flatnonzero(~mask[:i])
    return int(before[-1]) + 1 if len(before) else 0


def _started_at(ep: Any, c: int, fleet: Fleet) -> Any:
    """Episode ``ep`` begun at sample ``c`` (at or before its start)."""
    return begun_earlier(ep, (_sample(ep, fleet) - c) * fleet.step)


def _lead_in(ep: Any, joined: np.ndarray, fleet: Fleet) -> Any:
    """Node episode ``ep`` begun where its run in ``joined`` (one slot's row: GPU-level lead-in) began."""
    return _started_at(ep, _run_start(joined, _sample(ep, fleet)), fleet)


def _inside_node(nodes: list[Finding], gpus: list[Finding]) -> list[Finding]:
    """GPU findings without those lying inside a node finding of their host and job (its lead-in)."""
    spans: dict[tuple, list[tuple[float, float]]] = {}
    for n in nodes:
        spans.setdefault((n.hostname, n.job), []).append((n.start, math.inf if n.end is None else n.end))
    return [f for f in gpus if not any(a <= f.start and (math.inf if f.end is None else f.end) <= b
                                       for a, b in spans.get((f.hostname, f.job), ()))]


def _who(ep: Any) -> str:
    return f"GPU {ep.hostname}/{ep.gpu}" + (f" (MIG {ep.gpu_instance})" if ep.gpu_instance else "")


def _int(v: object) -> int | None:
    return int(v) if v is not None and str(v).isdigit() else None


def _slot_key(pg: PeerGroups, s: int) -> tuple:
    """(job, hostname, gpu, instance) of slot ``s``."""
    return pg.group_labels[pg.slot_group[s]].get("job"), pg.slot_host[s], pg.slot_gpu[s], pg.slot_instance[s] or None


def _slots(pg: PeerGroups) -> dict[tuple, int]:
    """(job, hostname, gpu, instance) -> slot."""
    return {_slot_key(pg, s): s for s in range(pg.n_slots)}


def _members(pg: PeerGroups) -> dict[tuple, int]:
    """(job, hostname, gpu, instance) -> number of members of that slot's group."""
    return {key: int(pg.bounds[pg.slot_group[s] + 1] - pg.bounds[pg.slot_group[s]]) for key, s in _slots(pg).items()}


class _NodeView:
    """The slots of each group gathered by host: host medians and the other hosts as peers.

    ``median(m)`` gives every slot its host's median (over the group's GPUs on that host);
    ``reference`` compares host medians with the median over the group's hosts (the other
    host when there are two), each host counted once. ``multi`` marks slots whose host has
    at least two of the group's GPUs in a group spanning at least two hosts.
    """

    def __init__(self, pg: PeerGroups) -> None:
        n = pg.n_slots
        self.size = np.zeros(n, np.int64)
        self.rep_slot = np.full(n, -1, np.int64)
        self.share = np.zeros(n)
        host_sets: list[np.ndarray] = []
        across: list[np.ndarray] = []  # per group with >= 2 hosts: one representative slot per host
        multi = np.zeros(n, bool)
        for g in range(pg.n_groups):  # per job: a handful of numpy calls
            a, b = pg.bounds[g], pg.bounds[g + 1]
            _, first, inv = np.unique(pg.slot_host[a:b].astype(str), return_index=True, return_inverse=True)
            counts = np.bincount(inv)
            self.size[a:b] = counts[inv]
            self.rep_slot[a:b] = a + first[inv]
            self.share[a:b] = np.bincount(inv, weights=pg.slot_share[a:b])[inv]
            order = np.argsort(inv, kind="stable")
            host_sets += np.split(a + order, np.cumsum(counts)[:-1])
            if len(counts) >= 2:
                across.append(a + first)
                multi[a:b] = counts[inv] >= 2
        self.hosts = Blocks(host_sets, n)
        self.across = Blocks(across, n)
        self.multi = multi[:, None]
        self.any = bool(multi.any())

    def median(self, m: np.ndarray) -> np.ndarray:
        return self.hosts.median(m)

    def reference(self, hm: np.ndarray, spread: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Reference and spread of host medians ``hm`` (already broadcast to slots) across the group's hosts."""
        ref, spread_ = self.across.robust(hm, spread)
        reps = self.rep_slot
        ok = reps >= 0
        out_r = np.full_like(hm, np.nan)
        out_s = np.full_like(hm, np.nan)
        out_r[ok], out_s[ok] = ref[reps[ok]], spread_[reps[ok]]
        return out_r, out_s
