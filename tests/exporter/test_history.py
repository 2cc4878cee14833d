"""OpenMetrics history writer: exact format, and the real promtool backfilling it."""

from __future__ import annotations

import gzip
import io
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from exporter import schema
from exporter.simulator.dcgm_dialect import DcgmOptions
from exporter.simulator.history import (
    Mess,
    _contract_mess,
    _copied,
    renamed_pod,
    sample_times,
    write_history,
    write_openmetrics,
)

T0 = 1_700_000_000.0
TIMES = np.array([T0, T0 + 15, T0 + 30])
GPU0 = {"hostname": "node-a", "gpu": "0", "uuid": "GPU-0"}
GPU1 = {"hostname": "node-a", "gpu": "1", "uuid": "GPU-1"}


def _tiny_series():
    yield schema.GPU_UTILIZATION, GPU0, np.array([0.5, np.nan, 1.0])
    yield schema.GPU_UTILIZATION, GPU1, np.array([0.25, 0.75, 0.125])
    yield schema.ENERGY, GPU0, np.array([100.0, 1500.5, 3000.0])
    yield schema.SM_ACTIVE, GPU0, np.array([np.nan, np.nan, np.nan])  # never sampled: family left out
    alloc = {**GPU0, "namespace": "ml", "pod": 'train "big"\\x\nnew', "container": "c", "job": "j"}
    yield schema.GPU_ALLOCATION_INFO, alloc, np.array([np.nan, 1.0, 1.0])


def test_exact_format_of_a_tiny_history():
    buf = io.StringIO()
    stats = write_openmetrics(buf, _tiny_series(), TIMES)
    u, e, a = schema.GPU_UTILIZATION, schema.ENERGY, schema.GPU_ALLOCATION_INFO
    expected = f"""\
# TYPE {u.name} gauge
# UNIT {u.name} ratio
# HELP {u.name} {u.help}
{u.name}{{hostname="node-a",gpu="0",uuid="GPU-0"}} 0.5 1700000000.0
{u.name}{{hostname="node-a",gpu="0",uuid="GPU-0"}} 1.0 1700000030.0
{u.name}{{hostname="node-a",gpu="1",uuid="GPU-1"}} 0.25 1700000000.0
{u.name}{{hostname="node-a",gpu="1",uuid="GPU-1"}} 0.75 1700000015.0
{u.name}{{hostname="node-a",gpu="1",uuid="GPU-1"}} 0.125 1700000030.0
# TYPE truegpu_energy_joules counter
# UNIT truegpu_energy_joules joules
# HELP truegpu_energy_joules {e.help}
truegpu_energy_joules_total{{hostname="node-a",gpu="0",uuid="GPU-0"}} 100.0 1700000000.0
truegpu_energy_joules_total{{hostname="node-a",gpu="0",uuid="GPU-0"}} 1500.5 1700000015.0
truegpu_energy_joules_total{{hostname="node-a",gpu="0",uuid="GPU-0"}} 3000.0 1700000030.0
# TYPE {a.name} gauge
# HELP {a.name} {a.help}
{a.name}{{hostname="node-a",gpu="0",uuid="GPU-0",namespace="ml",pod="train \\"big\\"\\\\x\\nnew",container="c",job="j"}} 1.0 1700000015.0
{a.name}{{hostname="node-a",gpu="0",uuid="GPU-0",namespace="ml",pod="train \\"big\\"\\\\x\\nnew",container="c",job="j"}} 1.0 1700000030.0
# EOF
"""  # noqa: E501
    assert buf.getvalue() == expected
    assert (stats.families, stats.series, stats.samples) == (3, 4, 10)
    assert (stats.min_time, stats.max_time) == (T0, T0 + 30)


def test_unit_only_when_it_is_a_suffix_and_help_escaped():
    m = schema.Metric("x_seconds_thing", "gauge", "seconds", "line one\nback\\slash")
    buf = io.StringIO()
    write_openmetrics(buf, [(m, {}, np.array([1.0]))], np.array([T0]))
    assert buf.getvalue() == (
        "# TYPE x_seconds_thing gauge\n# HELP x_seconds_thing line one\\nback\\\\slash\n"
        "x_seconds_thing 1.0 1700000000.0\n# EOF\n"
    )


def test_interleaved_families_are_refused():
    items = [
        (schema.GPU_UTILIZATION, GPU0, np.ones(3)),
        (schema.ENERGY, GPU0, np.ones(3)),
        (schema.GPU_UTILIZATION, GPU1, np.ones(3)),
    ]
    with pytest.raises(ValueError, match="interleaved"):
        write_openmetrics(io.StringIO(), items, TIMES)


def test_infinities_and_misaligned_values():
    buf = io.StringIO()
    write_openmetrics(buf, [(schema.POWER, GPU0, np.array([np.inf, -np.inf, 2.0]))], TIMES)
    lines = [ln for ln in buf.getvalue().splitlines() if not ln.startswith("#")]
    assert [ln.split(" ")[1] for ln in lines] == ["+Inf", "-Inf", "2.0"]
    with pytest.raises(ValueError, match="2 values for 3 times"):
        write_openmetrics(io.StringIO(), [(schema.POWER, GPU0, np.ones(2))], TIMES)


def test_sample_times_half_open_window():
    assert sample_times(0, 60, 15).tolist() == [0, 15, 30, 45]
    assert sample_times(0, 61, 15).tolist() == [0, 15, 30, 45, 60]
    with pytest.raises(ValueError):
        sample_times(0, 60, 0)


# Real promtool --------------------------------------------------------------------------


def _block_stats(promtool: str, tsdb: Path) -> tuple[int, int]:
    """(series, samples) summed over the blocks `promtool tsdb list` shows."""
    out = subprocess.run([promtool, "tsdb", "list", str(tsdb)], capture_output=True, text=True, check=True).stdout
    rows = [ln.split() for ln in out.splitlines()[1:] if ln.strip()]
    assert rows, f"no block created:\n{out}"
    header = out.splitlines()[0]
    cols = re.split(r"\s{2,}", header.strip())
    i_samples, i_series = cols.index("NUM SAMPLES"), cols.index("NUM SERIES")
    return sum(int(r[i_series]) for r in rows), sum(int(r[i_samples]) for r in rows)


def _backfill(promtool: str, om: Path, tsdb: Path) -> None:
    proc = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(tsdb)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout


def test_promtool_backfills_the_tiny_file(promtool, tmp_path):
    om = tmp_path / "tiny.om"
    with om.open("w") as f:
        stats = write_openmetrics(f, _tiny_series(), TIMES)
    _backfill(promtool, om, tmp_path / "tsdb")
    assert _block_stats(promtool, tmp_path / "tsdb") == (stats.series, stats.samples)


@pytest.mark.parametrize(
    ("scenario", "dialect", "options", "expect"),
    [
        ("mixed-fleet", "truegpu", None, "truegpu_sm_active_ratio{"),
        ("mixed-fleet", "dcgm", DcgmOptions(), "DCGM_FI_DEV_GPU_UTIL{"),
        ("mig-training", "dcgm", DcgmOptions("all", "hostname", legacy=True), "dcgm_fi_prof_sm_active{"),
    ],
)
def test_promtool_backfills_a_simulated_scenario(promtool, tmp_path, scenario, dialect, options, expect):
    from exporter.simulator.model import Cluster
    from exporter.simulator.scenario import load_scenario

    cluster = Cluster(load_scenario(scenario), seed=7)
    om = tmp_path / "metrics.om"
    start = float(cluster.start)
    # a window crossing a 2h block boundary so promtool writes more than one block
    stats = write_history(om, cluster, start, start + 3 * 3600, 60, dialect=dialect, dcgm_options=options)
    assert stats.samples > 0 and stats.series > 0
    text = om.read_text()
    assert text.endswith("# EOF\n") and expect in text
    if dialect == "dcgm":
        assert not re.search(r"^(# \w+ )?truegpu_", text, re.M)
    _backfill(promtool, om, tmp_path / "tsdb")
    series, samples = _block_stats(promtool, tmp_path / "tsdb")
    assert samples == stats.samples
    # a series split across blocks is counted once per block
    assert stats.series <= series <= 3 * stats.series


def test_gzip_output_has_the_same_content(tmp_path):
    from exporter.simulator.model import Cluster
    from exporter.simulator.scenario import load_scenario

    cluster = Cluster(load_scenario("mixed-fleet"), seed=3)
    start = float(cluster.start)
    write_history(tmp_path / "m.om", cluster, start, start + 600, 60)
    write_history(tmp_path / "m.om.gz", cluster, start, start + 600, 60)
    with gzip.open(tmp_path / "m.om.gz", "rt") as f:
        assert f.read() == (tmp_path / "m.om").read_text()


def test_mess_gaps_restarts_renames_repeats_and_replicas():
    times = T0 + 60.0 * np.arange(10)
    energy = 1000.0 + 50.0 * np.arange(10)
    alloc = {**GPU0, "namespace": "ml", "pod": "api-7c9d4b8f5-x2k9q", "container": "c"}
    other = {"hostname": "node-b", "gpu": "0", "uuid": "GPU-b"}
    series = [(schema.ENERGY, GPU0, energy), (schema.GPU_UTILIZATION, other, np.full(10, 0.5)),
              (schema.GPU_ALLOCATION_INFO, alloc, np.ones(10))]
    mess = Mess(node_gaps=(("node-b", 120.0, 240.0),), exporter_restarts=(("node-a", 300.0),),
                pod_restarts=(("api-7c9d4b8f5-x2k9q", 420.0),))
    out = list(_contract_mess(series, times, mess))
    (_, _, e), (_, _, u), (_, a1, v1), (_, a2, v2) = out
    assert np.isnan(e[5]) and e[4] == 1200.0 and e[6] == 50.0  # the restart's scrape lost; counting from 0
    assert np.isnan(u[2:6]).all() and not np.isnan(u[[0, 1, 6]]).any()  # a 4-minute whole-node gap
    assert a1["pod"] == "api-7c9d4b8f5-x2k9q" and a2["pod"] == renamed_pod("api-7c9d4b8f5-x2k9q")
    assert a2["pod"].startswith("api-7c9d4b8f5-") and a2["pod"] != a1["pod"]
    assert np.isnan(v1[7:]).all() and np.isnan(v2[:7]).all() and not np.isnan(v1[[0, 1, 2, 3, 4, 6]]).any()
    # Every pod of a workload (a Job's restart): named by its workload label, the other series untouched.
    job = {**alloc, "pod": "train-worker-1", schema.WORKLOAD: "train"}
    out2 = list(_contract_mess([series[0], (schema.GPU_ALLOCATION_INFO, job, np.ones(10))], times,
                               Mess(workload_restarts=(("train", 420.0),))))
    assert [lab.get("pod") for _, lab, _ in out2] == [None, "train-worker-1", renamed_pod("train-worker-1")]
    assert np.isnan(out2[1][2][7:]).all() and np.isnan(out2[2][2][:7]).all()
    pair = list(_copied(out[:1], Mess(replicas=("r0", "r1"))))
    assert [lab["prometheus_replica"] for _, lab, _ in pair] == ["r0", "r1"]
    buf = io.StringIO()
    stats = write_openmetrics(buf, [(schema.GPU_UTILIZATION, GPU1, np.array([0.25, 0.75, 0.125]))], TIMES,
                              repeat_every=2)
    samples = [line for line in buf.getvalue().splitlines() if not line.startswith("#")]
    assert stats.samples == 5 and samples[0] == samples[1] and samples[3] == samples[4]
