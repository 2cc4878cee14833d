"""Values outside the metric contract's valid range (or infinite) never reach a score, a detector or
JSON: they are dropped as unknown at ingest, counted per metric and named in the output's notes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from exporter import schema as S
from exporter.simulator import Cluster, load_scenario
from exporter.simulator.dcgm_dialect import DcgmOptions
from exporter.simulator.history import write_history
from truegpu.cli import main

STEP = 60.0


def _no_constants(name: str) -> None:
    raise AssertionError(f"non-strict JSON constant {name} in the output")


def _corrupt(path: Path, replacements: dict[str, list[str]]) -> int:
    """Replace the value of every sample of each metric on gpu="1", cycling through the given texts."""
    lines = path.read_text().splitlines(keepends=True)
    hits = 0
    for i, line in enumerate(lines):
        name = line.split("{", 1)[0]
        if name in replacements and 'gpu="1"' in line:
            values = replacements[name]
            lines[i] = re.sub(r"\} \S+ ", "} " + values[hits % len(values)] + " ", line, count=1)
            hits += 1
    path.write_text("".join(lines))
    return hits


def _analyze(capsys, path: Path) -> dict:
    assert main(["analyze", "--json", "--quiet", "--input", str(path)]) == 0
    captured = capsys.readouterr()
    return json.loads(captured.out, parse_constant=_no_constants)


@pytest.fixture(scope="module")
def cluster() -> Cluster:
    return Cluster(load_scenario("idle-waste"))


def test_infinite_and_huge_values_in_a_truegpu_file(tmp_path, capsys, cluster) -> None:
    path = tmp_path / "bad.om"
    write_history(path, cluster, cluster.start, cluster.start + 1800, STEP)
    hits = _corrupt(path, {S.GPU_UTILIZATION.name: ["+Inf", "1e308", "-Inf"], S.SM_ACTIVE.name: ["1e308"]})
    assert hits > 0
    out = _analyze(capsys, path)
    s = out["summary"]
    for key in ("reported_util", "effective_util", "fleet_reported_util", "fleet_effective_util"):
        assert s[key] is None or 0.0 <= s[key] <= 1.0, key
    note = next(n for n in s["input_notes"] if "valid range" in n)
    assert f"{hits} values outside" in note and S.GPU_UTILIZATION.name in note and S.SM_ACTIVE.name in note


def test_impossible_dcgm_values_are_unknown(tmp_path, capsys, cluster) -> None:
    path = tmp_path / "dcgm.om"
    write_history(path, cluster, cluster.start, cluster.start + 1800, STEP, dialect="dcgm",
                  dcgm_options=DcgmOptions(counters="all"))
    util = S.GPU_UTILIZATION.dcgm[0].field
    sm = S.SM_ACTIVE.dcgm[0].field
    temp = S.dcgm_field(S.TEMPERATURE, sensor="gpu").field
    hits = _corrupt(path, {util: ["4294967295"], sm: ["5"], temp: ["2100000000"]})
    assert hits > 0
    out = _analyze(capsys, path)
    s = out["summary"]
    assert 0.0 <= s["reported_util"] <= 1.0 and 0.0 <= s["effective_util"] <= 1.0
    note = next(n for n in s["input_notes"] if "valid range" in n)
    assert util in note and sm in note and temp in note
    for f in out["findings"]:
        temps = [v for k, v in f["evidence"].items() if "temp" in k and isinstance(v, int | float)]
        assert all(t < 200 for t in temps), f


def test_conflicting_duplicates_are_reported_not_silently_merged(tmp_path) -> None:
    from analyzer.data.load import load_files

    name = S.GPU_UTILIZATION.name
    lines = [f'{name}{{hostname="n",gpu="0",uuid="G0"}} {v} {1_700_000_000 + 15 * i}'
             for i, v in enumerate([0.5, 0.5, 0.6, 0.7])]
    lines.append(f'{name}{{hostname="n",gpu="0",uuid="G0"}} 0.9 1700000015')  # same series and time, other value
    lines.append(f'{name}{{hostname="n",gpu="0",uuid="G0"}} 0.5 1700000000')  # an identical repeat: harmless
    path = tmp_path / "dup.om"
    path.write_text("\n".join(lines) + "\n")
    fleet = load_files(path)
    note = next(n for n in fleet.notes if "conflicting duplicate" in n)
    assert "1 conflicting duplicate samples" in note and "0.5 vs 0.9" in note and 'uuid="G0"' in note


def test_nan_samples_are_unknown_and_named_in_the_notes(tmp_path, capsys, cluster) -> None:
    """A NaN value (an exporter's division by zero, a tool that writes NaN for "no reading") is a sample the user
    gave us: taken as unknown like a missing one, and said so, never silently."""
    path = tmp_path / "nan.om"
    write_history(path, cluster, cluster.start, cluster.start + 1800, STEP)
    temps = _corrupt(path, {S.TEMPERATURE.name: ["NaN"]})
    powers = (_corrupt(path, {S.POWER.name: ["NaN", "250"]}) + 1) // 2  # every other one NaN, from the first
    assert temps > 0 and powers > 0
    out = _analyze(capsys, path)
    note = next(n for n in out["summary"]["input_notes"] if "NaN" in n)
    assert note == (f"{temps + powers} samples whose value was NaN taken as unknown: "
                    f"{S.POWER.name} ({powers}), {S.TEMPERATURE.name} ({temps})")
    assert out["summary"]["effective_util"] is not None
