"""The exporter's exact /metrics text for a fixed simulated node equals the committed golden file.

Beside the property tests (valid names, ranges, labels), this pins everything at once: family order,
HELP/TYPE text, label sets and values. After an intended change, regenerate it with
``.venv/bin/python -m tests.exporter.golden`` and review the diff of tests/exporter/golden/simulated_node.prom.
"""

from __future__ import annotations

import difflib

from tests.exporter import golden


def test_exposition_matches_the_golden_file() -> None:
    got = golden.render()
    want = golden.GOLDEN.read_text(encoding="utf-8")
    if got != want:
        diff = "".join(list(difflib.unified_diff(want.splitlines(True), got.splitlines(True), "golden", "now"))[:60])
        raise AssertionError(
            f"/metrics differs from {golden.GOLDEN.name}; if intended, run `.venv/bin/python -m tests.exporter.golden` "
            f"and review the diff:\n{diff}")


def test_golden_file_masks_only_timing_values() -> None:
    text = golden.GOLDEN.read_text(encoding="utf-8")
    masked = [line for line in text.splitlines() if line.endswith(" <volatile>")]
    assert sorted(line.split("{")[0] for line in masked) == sorted(m.name for m in golden.VOLATILE)
    assert 'gpu_instance="' in text and "truegpu_gpu_allocation_info" in text and "truegpu_node_info" in text
