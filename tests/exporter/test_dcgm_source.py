"""DcgmSource against a real HTTP server on loopback replaying dcgm-exporter output."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter import schema
from exporter.collector import TruegpuCollector
from exporter.schema import (
    CLOCK_EVENT_ACTIVE,
    DRAM_ACTIVE,
    ECC_ERRORS,
    ENERGY,
    GPU_ALLOCATION_INFO,
    GPU_INFO,
    GPU_UTILIZATION,
    MEMORY_TOTAL,
    MEMORY_USED,
    MIB,
    NVLINK_BYTES,
    NVLINK_ERRORS,
    PCIE_BYTES,
    POWER,
    POWER_LIMIT,
    SM_ACTIVE,
    SM_CLOCK,
    SM_OCCUPANCY,
    TEMPERATURE,
    TENSOR_ACTIVE,
    XID_ERRORS,
    Metric,
)
from exporter.sources import promtext
from exporter.sources.base import Reading
from exporter.sources.dcgm import (
    BAD_LINE,
    HTTP_ERROR,
    PARSE_ERROR,
    TIMEOUT,
    UNREACHABLE,
    DcgmSource,
    from_args,
)
from tests.conftest import free_port
from tests.exporter.kit import DCGM_PAGES, FakeClock
from tests.httpstub import Endpoint

FIXTURES = DCGM_PAGES
H100 = FIXTURES / "h100_mig_pods.txt"
A100_1X = FIXTURES / "a100_1x_dialect.txt"
L40S = FIXTURES / "l40s_default_counters.txt"
V100 = FIXTURES / "v100_ecc_nvlink_xid.txt"
SENTINELS = FIXTURES / "t4_sentinels.txt"
POD_LABELS = {"pod", "namespace", "container", "pod_name", "pod_namespace", "container_name", "job", "hpc_job"}


def source_for(ep: Endpoint, **kw: object) -> DcgmSource:
    kw.setdefault("timeout", 2.0)
    kw.setdefault("retries", 0)
    return DcgmSource(ep.url, **kw)  # type: ignore[arg-type]


def values(reading: Reading, metric: Metric, **match: str) -> list[float]:
    return [v for labels, v in reading.samples.get(metric, []) if all(labels.get(k) == x for k, x in match.items())]


def one(reading: Reading, metric: Metric, **match: str) -> float:
    got = values(reading, metric, **match)
    assert len(got) == 1, f"{metric.name}{match}: expected one sample, got {got}"
    return got[0]


def whole(gpu: str) -> dict[str, str]:
    return {"gpu": gpu}


# -- fixtures: mapping and units ----------------------------------------------------------
def test_h100_units_and_identity(endpoint: Endpoint) -> None:
    endpoint.serve(H100)
    src = source_for(endpoint)
    r = src.collect()
    assert r.up and r.errors == []
    assert one(r, SM_CLOCK, gpu="0", gpu_instance=None) == 1980e6  # MHz -> Hz
    assert one(r, SM_CLOCK, gpu="5") == 345e6
    assert one(r, MEMORY_USED, gpu="0") == 65000 * MIB  # MiB -> bytes
    assert one(r, MEMORY_TOTAL, gpu="0") == (65000 + 16030 + 529) * MIB  # USED + FREE + RESERVED
    assert one(r, MEMORY_TOTAL, gpu="7", gpu_instance="13") == 9856 * MIB
    assert one(r, GPU_UTILIZATION, gpu="0") == pytest.approx(0.97)  # percent -> ratio
    assert one(r, SM_ACTIVE, gpu="0") == pytest.approx(0.612045)  # already a ratio
    assert one(r, SM_OCCUPANCY, gpu="3") == pytest.approx(0.301266)
    assert one(r, ENERGY, gpu="0") == pytest.approx(482113004.512)  # mJ -> J
    assert one(r, POWER, gpu="3") == pytest.approx(655.25)
    assert one(r, POWER_LIMIT, gpu="3") == 700.0
    assert one(r, TEMPERATURE, gpu="3", sensor="gpu") == 59
    assert one(r, TEMPERATURE, gpu="3", sensor="memory") == 47
    # Every label is the contract's: identity on every sample, host from the lower-case label.
    for metric, samples in r.samples.items():
        for labels, _ in samples:
            assert labels["hostname"] == "gpu-h100-017"
            assert set(labels) - set(metric.all_labels) <= set(schema.MIG_LABELS), (metric.name, labels)
    # Video engines are mapped; fields outside the contract are not errors but are accounted for,
    # one count per series (8 GPUs, MIG instances separately: 11 series).
    assert one(r, schema.ENCODER_UTILIZATION, gpu="0") == 0.0
    assert "DCGM_FI_DEV_VGPU_LICENSE_STATUS" in src.ignored_fields
    assert r.ignored.pop(("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "not_in_contract")) == 11
    # Whole-GPU fields dcgm-exporter repeats on each MIG instance (GPU 6: 2, GPU 7: 3) are published
    # once per GPU: 3 repeats of each, none of the per-instance families (memory, profiling) among them.
    assert r.ignored and set(r.ignored.values()) == {3} and {why for _, why in r.ignored} == {"mig_repeat"}
    assert not {f for f, _ in r.ignored} & {"DCGM_FI_DEV_FB_USED", "DCGM_FI_PROF_SM_ACTIVE"}
    assert r.errors == []


def test_h100_mig_instances(endpoint: Endpoint) -> None:
    endpoint.serve(H100)
    r = source_for(endpoint).collect()
    mig = [labels for labels, _ in r.samples[SM_ACTIVE] if "gpu_instance" in labels]
    assert sorted((m["gpu"], m["gpu_instance"], m["mig_profile"]) for m in mig) == [
        ("6", "1", "3g.40gb"), ("6", "2", "3g.40gb"), ("7", "1", "4g.40gb"), ("7", "13", "1g.10gb"),
        ("7", "5", "2g.20gb"),
    ]
    whole_gpus = [labels for labels, _ in r.samples[SM_ACTIVE] if "gpu_instance" not in labels]
    assert sorted(m["gpu"] for m in whole_gpus) == ["0", "1", "2", "3", "4", "5"]
    # DCGM cannot give GPU_UTIL per MIG instance: unknown, so absent rather than 0.
    assert sorted(labels["gpu"] for labels, _ in r.samples[GPU_UTILIZATION]) == ["0", "1", "2", "3", "4", "5"]
    # Whole-GPU families (power, clocks, temperature) once per GPU, never once per instance.
    power = [labels for labels, _ in r.samples[schema.POWER]]
    assert sorted(p["gpu"] for p in power) == [str(g) for g in range(8)]
    assert not any("gpu_instance" in p for p in power + [lab for lab, _ in r.samples[SM_CLOCK]])
    # One info series per physical GPU, without MIG labels.
    infos = r.samples[GPU_INFO]
    assert len(infos) == 8
    info6 = next(labels for labels, _ in infos if labels["gpu"] == "6")
    assert info6["model"] == "NVIDIA H100 80GB HBM3"
    assert info6["driver_version"] == "550.90.07"
    assert info6["pci_bus_id"] == "00000000:BA:00.0"
    assert info6["numa_node"] == ""
    assert "gpu_instance" not in info6


def test_h100_allocation_from_pod_labels(endpoint: Endpoint) -> None:
    endpoint.serve(H100)
    r = source_for(endpoint).collect()
    allocs = {(a["gpu"], a.get("gpu_instance")): a for a, v in r.samples[GPU_ALLOCATION_INFO] if v == 1.0}
    assert set(allocs) == {("0", None), ("1", None), ("2", None), ("3", None), ("4", None), ("6", "1"), ("7", "1")}
    assert allocs["0", None]["pod"] == "llama3-70b-pretrain-worker-0"
    assert allocs["0", None]["namespace"] == "ml-train"
    assert allocs["0", None]["container"] == "pytorch"
    assert allocs["0", None]["workload"] == "llama3-70b-pretrain"  # -worker-0 removed
    assert allocs["4", None]["workload"] == "bert-ft"  # -master-0 removed
    assert allocs["6", "1"]["mig_profile"] == "3g.40gb"
    assert allocs["6", "1"]["pod"] == "vllm-serve-7d9f8b6c4-x2x7k"
    # Pod identity never reaches the hot series.
    for metric, samples in r.samples.items():
        if metric is GPU_ALLOCATION_INFO:
            continue
        for labels, _ in samples:
            assert not POD_LABELS & set(labels), (metric.name, labels)


def test_h100_clock_event_bitmask_and_xid(endpoint: Endpoint) -> None:
    endpoint.serve(H100)
    r = source_for(endpoint).collect()
    gpu3 = {labels["reason"]: v for labels, v in r.samples[CLOCK_EVENT_ACTIVE] if labels["gpu"] == "3"}
    assert set(gpu3) == set(schema.CLOCK_EVENT_REASONS.values())
    assert {k for k, v in gpu3.items() if v == 1.0} == {"sw_power_cap", "sw_thermal"}  # 0x24
    gpu5 = {labels["reason"]: v for labels, v in r.samples[CLOCK_EVENT_ACTIVE] if labels["gpu"] == "5"}
    assert {k for k, v in gpu5.items() if v == 1.0} == {"idle"}
    # XID 13 on GPU 4 (with err_code/err_msg labels, which are not identity); zeros are no event.
    assert [(labels["gpu"], labels["xid"], v) for labels, v in r.samples[XID_ERRORS]] == [("4", "13", 1.0)]


def test_h100_rates_start_at_zero(endpoint: Endpoint) -> None:
    endpoint.serve(H100)
    r = source_for(endpoint).collect()
    assert {labels["direction"] for labels, _ in r.samples[NVLINK_BYTES]} == {"tx", "rx", "total"}
    assert {labels["direction"] for labels, _ in r.samples[PCIE_BYTES]} == {"tx", "rx"}
    assert all(v == 0.0 for _, v in r.samples[NVLINK_BYTES] + r.samples[PCIE_BYTES])


def test_a100_1x_dialect(endpoint: Endpoint) -> None:
    endpoint.serve(A100_1X)
    src = source_for(endpoint, hostname="a100-node-3")
    r = src.collect()
    assert r.up and r.errors == []
    # No host label in 1.x output: the configured hostname is used; lower-case 'uuid' read.
    assert one(r, SM_CLOCK, gpu="0") == 1410e6
    labels0 = next(labels for labels, _ in r.samples[SM_CLOCK] if labels["gpu"] == "0")
    assert labels0 == {"hostname": "a100-node-3", "gpu": "0", "uuid": "GPU-ef93d360-6e44-30fa-5085-852515d198c7"}
    assert one(r, GPU_UTILIZATION, gpu="2") == pytest.approx(0.07)
    assert one(r, MEMORY_USED, gpu="1") == 29876 * MIB
    assert one(r, MEMORY_TOTAL, gpu="1") == 40536 * MIB  # used + free (no FB_RESERVED back then)
    assert one(r, TENSOR_ACTIVE, gpu="0") == pytest.approx(0.402114)
    allocs = {a["gpu"]: a for a, _ in r.samples[GPU_ALLOCATION_INFO]}
    assert set(allocs) == {"0", "1", "2"}
    assert allocs["1"] == {"hostname": "a100-node-3", "gpu": "1", "uuid": labels0["uuid"].replace(
        "ef93d360-6e44-30fa-5085-852515d198c7", "2a84941d-8895-e0c4-8845-7562c1040658"),
        "namespace": "vision", "pod": "resnet50-train-worker-1", "container": "trainer", "workload": "resnet50-train"}
    assert allocs["2"]["workload"] == "jupyter-alice"
    info = one(r, GPU_INFO, gpu="0")
    assert info == 1.0
    assert schema.DECODER_UTILIZATION in r.samples and r.ignored == {}  # every 1.x series is mapped


def test_l40s_default_counters_lack_sm_activity(endpoint: Endpoint) -> None:
    endpoint.serve(L40S)
    r = source_for(endpoint).collect()
    assert r.up
    assert SM_ACTIVE not in r.samples and SM_OCCUPANCY not in r.samples  # unknown, never 0
    assert len(r.samples[TENSOR_ACTIVE]) == 4 and len(r.samples[DRAM_ACTIVE]) == 4
    assert {labels["hostname"] for labels, _ in r.samples[SM_CLOCK]} == {"infer-l40s-03"}  # older 'Hostname'
    assert values(r, TEMPERATURE, sensor="memory") == []  # not exported by this GPU
    assert GPU_ALLOCATION_INFO not in r.samples  # no pod labels at all
    assert one(r, MEMORY_TOTAL, gpu="3") == 46068 * MIB


def test_v100_ecc_nvlink_throttle_alias_and_hpc_job(endpoint: Endpoint) -> None:
    endpoint.serve(V100)
    r = source_for(endpoint).collect()
    assert r.up and r.errors == []
    assert one(r, ECC_ERRORS, gpu="2", type="uncorrectable", scope="volatile") == 2
    assert one(r, ECC_ERRORS, gpu="2", type="correctable", scope="aggregate") == 112
    assert one(r, NVLINK_ERRORS, gpu="3", type="crc_flit") == 12
    assert one(r, NVLINK_ERRORS, gpu="3", type="recovery") == 1
    assert one(r, MEMORY_TOTAL, gpu="0") == 32768 * MIB  # FB_TOTAL wins over the sum
    gpu3 = {labels["reason"] for labels, v in r.samples[CLOCK_EVENT_ACTIVE] if labels["gpu"] == "3" and v == 1.0}
    assert gpu3 == {"sw_power_cap", "hw_thermal"}  # 0x44 via the deprecated THROTTLE_REASONS name
    allocs = [a for a, _ in r.samples[GPU_ALLOCATION_INFO]]
    assert sorted(a["gpu"] for a in allocs) == ["0", "1"]
    assert {(a["workload"], a["pod"], a["namespace"]) for a in allocs} == {("881234", "", "")}
    # dcgm-exporter's own XID count is used; the last-XID gauge is not counted on top of it.
    assert [(labels["gpu"], labels["xid"], v) for labels, v in r.samples[XID_ERRORS]] == [("2", "48", 1.0)]


def test_sentinels_are_dropped(endpoint: Endpoint) -> None:
    endpoint.serve(SENTINELS)
    r = source_for(endpoint).collect()
    assert r.up
    for metric, samples in r.samples.items():
        for labels, v in samples:
            assert v < 1e12 and not schema.is_dcgm_sentinel(v), (metric.name, labels, v)
    assert values(r, POWER, gpu="1") == [] and one(r, POWER, gpu="0") == pytest.approx(41.377)
    assert values(r, ENERGY, gpu="1") == [] and one(r, ENERGY, gpu="0") == pytest.approx(2233445.566)
    assert values(r, TEMPERATURE, sensor="memory") == []
    assert one(r, TEMPERATURE, gpu="1", sensor="gpu") == 49
    assert {labels["gpu"] for labels, _ in r.samples[CLOCK_EVENT_ACTIVE]} == {"0"}
    assert values(r, MEMORY_USED, gpu="1") == [] and values(r, MEMORY_TOTAL, gpu="1") == []
    assert one(r, MEMORY_TOTAL, gpu="0") == (6109 + 9000) * MIB
    assert NVLINK_BYTES not in r.samples and XID_ERRORS not in r.samples


@pytest.mark.parametrize("fixture", sorted(FIXTURES.glob("*.txt")), ids=lambda p: p.stem)
def test_collector_accepts_every_sample(endpoint: Endpoint, fixture: Path) -> None:
    """The exporter's collector validates label sets against the contract: nothing may be dropped."""
    endpoint.serve(fixture)
    collector = TruegpuCollector([source_for(endpoint)])
    families = {f.name: f for f in collector.collect()}
    errors = {s.labels["kind"]: s.value for s in families["truegpu_exporter_errors"].samples}
    assert errors == {"source_failed": 0.0}
    assert families["truegpu_exporter_source_up"].samples[0].value == 1.0
    assert collector.last["dcgm"][1] > 20


# -- state across scrapes -------------------------------------------------------------------
LABELS = 'gpu="0",UUID="GPU-aaaa",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100",' \
         'Hostname="n1",DCGM_FI_DRIVER_VERSION="550.90.07"'


def body(**fields: float | str) -> str:
    out = []
    for name, v in fields.items():
        out += [f"# HELP {name} x", f"# TYPE {name} gauge", f"{name}{{{LABELS}}} {v}"]
    return "\n".join(out) + "\n"


def test_rates_are_integrated_into_counters(endpoint: Endpoint) -> None:
    clock = FakeClock()
    src = source_for(endpoint, clock=clock, max_gap=60)

    def scrape(pcie_tx: float, nvlink_total_mib: float) -> tuple[float, float]:
        endpoint.serve(body(DCGM_FI_PROF_PCIE_TX_BYTES=pcie_tx, DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL=nvlink_total_mib))
        r = src.collect()
        assert r.up, r.errors
        return one(r, PCIE_BYTES, direction="tx"), one(r, NVLINK_BYTES, direction="total")

    assert scrape(1000, 10) == (0.0, 0.0)  # first scrape starts the counters at 0
    clock.now += 10
    assert scrape(3000, 30) == (20000.0, 200 * MIB)  # trapezoid: (1000+3000)/2 * 10 s
    clock.now += 10
    assert scrape(0, 0) == (35000.0, 350 * MIB)  # rate fell: counter still grows, never shrinks
    clock.now += 10
    assert scrape(-500, 0) == (35000.0, 350 * MIB)  # a bogus negative rate never decreases it
    clock.now += 600  # longer than max_gap: not integrated across the gap
    assert scrape(5000, 0) == (35000.0, 350 * MIB)
    clock.now += 1
    assert scrape(5000, 0) == (40000.0, 350 * MIB)


def test_rate_missing_for_a_scrape_is_omitted_not_zero(endpoint: Endpoint) -> None:
    clock = FakeClock()
    src = source_for(endpoint, clock=clock)
    endpoint.serve(body(DCGM_FI_PROF_PCIE_RX_BYTES=100, DCGM_FI_DEV_GPU_UTIL=50))
    src.collect()
    clock.now += 5
    endpoint.serve(body(DCGM_FI_DEV_GPU_UTIL=50))
    assert PCIE_BYTES not in src.collect().samples
    clock.now += 5
    endpoint.serve(body(DCGM_FI_PROF_PCIE_RX_BYTES=100, DCGM_FI_DEV_GPU_UTIL=50))
    assert one(src.collect(), PCIE_BYTES, direction="rx") == 1000.0


def test_xid_last_value_counts_each_change(endpoint: Endpoint) -> None:
    src = source_for(endpoint)
    seen = []
    for xid in (0, 43, 43, 79, 0, 43):
        endpoint.serve(body(DCGM_FI_DEV_XID_ERRORS=xid))
        r = src.collect()
        seen.append({labels["xid"]: v for labels, v in r.samples.get(XID_ERRORS, [])})
    assert seen == [{}, {"43": 1}, {"43": 1}, {"43": 1, "79": 1}, {"43": 1, "79": 1}, {"43": 2, "79": 1}]


def test_exporter_xid_window_count(endpoint: Endpoint) -> None:
    src = source_for(endpoint)
    counts = []
    for n in (1, 1, 3, 0, 2):
        endpoint.serve(body(DCGM_FI_DEV_XID_ERRORS=31).replace(f"{{{LABELS}}}", f'{{{LABELS},err_code="31"}}')
                       + f'DCGM_EXP_XID_ERRORS_COUNT{{{LABELS},window_size_in_ms="300000",xid="31"}} {n}\n')
        counts.append(one(src.collect(), XID_ERRORS, xid="31"))
    assert counts == [1, 1, 3, 3, 5]  # rises in the window count are new events


# -- failures -----------------------------------------------------------------------------
def test_endpoint_down_is_unreachable() -> None:
    url = f"http://127.0.0.1:{free_port()}/metrics"
    src = DcgmSource(url, timeout=1.0, retries=2, backoff=0.01)
    r = src.collect()
    assert not r.up and r.samples == {}
    assert [e.kind for e in r.errors] == [UNREACHABLE]
    assert url in r.errors[0].message
    assert "refused" in r.errors[0].message.lower()
    assert "after 3 attempts" in r.errors[0].message


def test_slow_endpoint_times_out(endpoint: Endpoint) -> None:
    endpoint.serve(H100)
    endpoint.delay = 1.5
    r = source_for(endpoint, timeout=0.2, retries=1, backoff=0.01).collect()
    assert not r.up and r.samples == {}
    assert [e.kind for e in r.errors] == [TIMEOUT]
    assert endpoint.url in r.errors[0].message
    assert endpoint.hits == 2  # retried once


def test_budget_bounds_retries(endpoint: Endpoint) -> None:
    endpoint.serve("oops", status=503)
    r = source_for(endpoint, retries=50, backoff=0.05, budget=0.3).collect()
    assert [e.kind for e in r.errors] == [HTTP_ERROR]
    assert 1 < endpoint.hits < 10


def test_http_500(endpoint: Endpoint) -> None:
    endpoint.serve("dcgm: failed to collect\n", status=500)
    r = source_for(endpoint, retries=2, backoff=0.01).collect()
    assert not r.up and r.samples == {}
    assert [e.kind for e in r.errors] == [HTTP_ERROR]
    assert "HTTP 500" in r.errors[0].message and endpoint.url in r.errors[0].message
    assert "failed to collect" in r.errors[0].message
    assert endpoint.hits == 3  # 5xx is retried


def test_http_404_is_not_retried(endpoint: Endpoint) -> None:
    endpoint.serve("not found", status=404)
    r = source_for(endpoint, retries=3, backoff=0.01).collect()
    assert [e.kind for e in r.errors] == [HTTP_ERROR] and "404" in r.errors[0].message
    assert endpoint.hits == 1


@pytest.mark.parametrize("garbage", [
    "<html><body>502 Bad Gateway</body></html>\n",
    b"\x00\x01\x02\xff\xfe garbage {{{ \n\x89PNG\r\n",
    "",
])
def test_garbage_body_is_parse_error(endpoint: Endpoint, garbage: str | bytes) -> None:
    endpoint.serve(garbage)
    r = source_for(endpoint).collect()
    assert not r.up and r.samples == {}
    assert [e.kind for e in r.errors] == [PARSE_ERROR]
    assert endpoint.url in r.errors[0].message


def test_not_a_dcgm_exporter_is_parse_error(endpoint: Endpoint) -> None:
    endpoint.serve('# TYPE node_load1 gauge\nnode_load1 0.5\nnode_cpu_seconds_total{cpu="0",mode="idle"} 12.5\n')
    r = source_for(endpoint).collect()
    assert not r.up and [e.kind for e in r.errors] == [PARSE_ERROR]
    assert "no DCGM fields" in r.errors[0].message


def test_bad_lines_are_skipped_and_reported(endpoint: Endpoint) -> None:
    lines = H100.read_text().splitlines()
    # Line numbers are 1-based: corrupt an SM clock sample, a label block and a value.
    lines[2] = "DCGM_FI_DEV_SM_CLOCK{gpu=\"0\" 1980"
    lines[15] = lines[15].replace('gpu="0"', 'gpu=0')
    lines[28] = lines[28].rsplit(" ", 1)[0] + " 12abc"
    endpoint.serve("\n".join(lines) + "\n")
    r = source_for(endpoint).collect()
    assert r.up  # the rest of the body is fine
    assert [e.kind for e in r.errors] == [BAD_LINE]
    msg = r.errors[0].message
    assert "3 bad line(s)" in msg and "line 3:" in msg and "line 16:" in msg and "line 29:" in msg
    assert endpoint.url in msg
    assert values(r, SM_CLOCK, gpu="0") == []  # only the bad sample is lost
    assert one(r, SM_CLOCK, gpu="1") == 1980e6
    assert len(r.samples[SM_ACTIVE]) == 11


def test_samples_without_gpu_identity_are_reported(endpoint: Endpoint) -> None:
    endpoint.serve(body(DCGM_FI_DEV_GPU_UTIL=50) + 'DCGM_FI_DEV_GPU_TEMP{Hostname="n1"} 40\n')
    r = source_for(endpoint).collect()
    assert r.up and one(r, GPU_UTILIZATION) == 0.5
    assert [e.kind for e in r.errors] == ["bad_sample"] and "line(s) 4" in r.errors[0].message


@pytest.mark.parametrize("fixture", sorted(FIXTURES.glob("**/*.txt")), ids=lambda p: p.stem)
def test_every_series_is_mapped_or_accounted_for(fixture: Path) -> None:
    """Each DCGM series of a page is published, or counted in truegpu_exporter_ignored_series with a
    reason: a field outside the contract, a blank (NOT_SUPPORTED, NaN), a duplicate or a partial part."""
    from exporter.sources.dcgm import _FIELDS

    text = fixture.read_text()
    r = DcgmSource("http://127.0.0.1:1/metrics", hostname="h").convert(text)
    names = [line.split("{", 1)[0].split(" ", 1)[0] for line in text.splitlines()
             if line[:5] in ("DCGM_", "dcgm_")]
    unmapped = sum(1 for n in names if n not in _FIELDS)
    assert sum(v for (_, why), v in r.ignored.items() if why == "not_in_contract") == unmapped
    assert {why for _, why in r.ignored} <= {"not_in_contract", "blank", "duplicate", "partial", "mig_repeat"}
    assert all(n in _FIELDS or (n, "not_in_contract") in r.ignored for n in names)


REAL = sorted((FIXTURES / "real").glob("*.txt"))


@pytest.mark.parametrize("fixture", REAL, ids=lambda p: p.stem)
def test_real_pages_from_public_threads(fixture: Path) -> None:
    """Pages users pasted in public issue threads (fixtures/dcgm/real/SOURCES.md): every one is read,
    every GPU keeps a host and index, and whole-GPU families are published once per GPU."""
    r = DcgmSource("http://127.0.0.1:1/metrics", hostname="node-7").convert(fixture.read_text())
    assert r.up and {e.kind for e in r.errors} <= {"duplicate_uuid"}
    gpus = {(lab["hostname"], lab["gpu"]) for lab, _ in r.samples[schema.GPU_INFO]}
    assert gpus and all(h and g for h, g in gpus)
    assert not any(schema.DCGM_EXPORTER_POD.fullmatch(h) for h, _ in gpus)  # pod names become the node
    for metric, samples in r.samples.items():
        if metric not in schema.PER_MIG_INSTANCE and metric is not GPU_ALLOCATION_INFO:  # pods hold instances
            assert not any(schema.GPU_INSTANCE in lab for lab, _ in samples), metric.name
    assert all(n > 0 for n in r.ignored.values())


def test_1x_short_names_are_read() -> None:
    """dcgm-exporter 1.x (gpu-monitoring-tools) named fields dcgm_gpu_temp, dcgm_gpu_utilization, ..."""
    r = DcgmSource("http://127.0.0.1:1/metrics", hostname="node-7").convert(
        (FIXTURES / "real" / "lowercase_dcgm_names_dcgm_exporter_188.txt").read_text())
    assert r.ignored == {} and one(r, schema.TEMPERATURE, sensor="gpu") == 54.0
    assert one(r, GPU_UTILIZATION) == 0.0 and one(r, SM_CLOCK) == 585e6 and one(r, schema.POWER) == 30.982
    assert {lab["hostname"] for lab, _ in r.samples[SM_CLOCK]} == {"node-7"}  # was the exporter's pod name


def test_missing_and_shared_uuids_duplicates_and_partial_memory_are_said() -> None:
    """GPUs without a UUID or sharing one stay apart (host and index) and are reported; a series
    printed twice keeps its first value and is counted; FB_FREE without FB_USED forms no total."""
    lines = [f'DCGM_FI_DEV_GPU_TEMP{{gpu="{g}",{uuid}Hostname="n1"}} {40 + g}' for g, uuid in
             ((0, ""), (1, ""), (2, 'UUID="GPU-x",'), (3, 'UUID="GPU-x",'))]
    lines += ['DCGM_FI_DEV_GPU_TEMP{gpu="2",UUID="GPU-x",Hostname="n1"} 99',
              'DCGM_FI_DEV_FB_FREE{gpu="3",UUID="GPU-x",Hostname="n1"} 1000']
    r = DcgmSource("http://127.0.0.1:1/metrics", hostname="h").convert("\n".join(lines) + "\n")
    assert r.up
    kinds = {e.kind: e.message for e in r.errors}
    assert set(kinds) == {"no_uuid", "duplicate_uuid", "duplicate_series"}
    assert "2 GPU(s) without a UUID label (n1/0, n1/1)" in kinds["no_uuid"]
    assert "GPU-x on n1/2, n1/3" in kinds["duplicate_uuid"] and "line(s) 5" in kinds["duplicate_series"]
    temps = {labels["gpu"]: v for labels, v in r.samples[schema.TEMPERATURE]}
    assert temps == {"0": 40.0, "1": 41.0, "2": 42.0, "3": 43.0}  # four GPUs, the first value kept
    assert r.ignored == {("DCGM_FI_DEV_GPU_TEMP", "duplicate"): 1, ("DCGM_FI_DEV_FB_FREE", "partial"): 1}
    assert schema.MEMORY_TOTAL not in r.samples


def test_ignored_series_are_published_by_the_collector(endpoint: Endpoint) -> None:
    endpoint.serve(H100)
    families = {f.name: f for f in TruegpuCollector([source_for(endpoint)]).collect()}
    ignored = {(s.labels["field"], s.labels["reason"]): s.value
               for s in families[schema.SOURCE_IGNORED_SERIES.name].samples}
    assert ignored[("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "not_in_contract")] == 11.0
    assert ignored[("DCGM_FI_DEV_POWER_USAGE", "mig_repeat")] == 3.0


def test_fans_pstate_and_violation_time() -> None:
    r = DcgmSource("http://127.0.0.1:1/metrics", hostname="h").convert(body(
        DCGM_FI_DEV_FAN_SPEED=38, DCGM_FI_DEV_PSTATE=0, DCGM_FI_DEV_POWER_VIOLATION=2_500_000_000,
        DCGM_FI_DEV_THERMAL_VIOLATION=0))
    assert r.ignored == {} and one(r, schema.FAN_SPEED) == 0.38 and one(r, schema.PERFORMANCE_STATE) == 0.0
    assert one(r, schema.CLOCK_VIOLATION, reason="power") == pytest.approx(2.5)  # ns -> s
    assert one(r, schema.CLOCK_VIOLATION, reason="thermal") == 0.0


def test_retired_pages_row_remap_banks_and_recovery_action() -> None:
    r = DcgmSource("http://127.0.0.1:1/metrics", hostname="h").convert(body(
        DCGM_FI_DEV_RETIRED_SBE=3, DCGM_FI_DEV_RETIRED_DBE=1, DCGM_FI_DEV_RETIRED_PENDING=1,
        DCGM_FI_DEV_BANKS_REMAP_ROWS_AVAIL_MAX=10230, DCGM_FI_DEV_BANKS_REMAP_ROWS_AVAIL_HIGH=6,
        DCGM_FI_DEV_BANKS_REMAP_ROWS_AVAIL_PARTIAL=3, DCGM_FI_DEV_BANKS_REMAP_ROWS_AVAIL_LOW=1,
        DCGM_FI_DEV_BANKS_REMAP_ROWS_AVAIL_NONE=0, DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION=2))
    assert r.up and r.errors == [] and r.ignored == {}
    assert one(r, schema.RETIRED_PAGES, cause="single_bit_ecc") == 3
    assert one(r, schema.RETIRED_PAGES, cause="double_bit_ecc") == 1
    assert one(r, schema.RETIRED_PAGES_PENDING) == 1
    banks = {labels["availability"]: v for labels, v in r.samples[schema.ROW_REMAP_BANKS]}
    assert banks == {"max": 10230, "high": 6, "partial": 3, "low": 1, "none": 0}  # a real 0 stays
    assert one(r, schema.GPU_RECOVERY_ACTION) == 2
    assert schema.GPU_RECOVERY_ACTIONS[2] == "node_reboot"
    for metric in (schema.RETIRED_PAGES, schema.ROW_REMAP_BANKS, schema.GPU_RECOVERY_ACTION):
        assert all(set(labels) == set(metric.all_labels) for labels, _ in r.samples[metric])


def test_blank_memory_health_fields_stay_unknown() -> None:
    """An Ampere GPU answers NOT_SUPPORTED for page retirement, an old driver for the recovery action:
    DCGM prints its blank markers, which stay unknown (counted as blank), never 0."""
    not_supported = 9223372036854775794  # DCGM_INT64_NOT_SUPPORTED
    r = DcgmSource("http://127.0.0.1:1/metrics", hostname="h").convert(body(
        DCGM_FI_DEV_RETIRED_SBE=not_supported, DCGM_FI_DEV_RETIRED_DBE=not_supported,
        DCGM_FI_DEV_RETIRED_PENDING=not_supported, DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION="NaN",
        DCGM_FI_DEV_BANKS_REMAP_ROWS_AVAIL_NONE=2))
    assert r.up and r.errors == []
    for metric in (schema.RETIRED_PAGES, schema.RETIRED_PAGES_PENDING, schema.GPU_RECOVERY_ACTION):
        assert metric not in r.samples, metric.name
    assert one(r, schema.ROW_REMAP_BANKS, availability="none") == 2
    assert r.ignored == {(f, "blank"): 1 for f in (
        "DCGM_FI_DEV_RETIRED_SBE", "DCGM_FI_DEV_RETIRED_DBE", "DCGM_FI_DEV_RETIRED_PENDING",
        "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION")}


def test_1x_retired_page_names_are_read() -> None:
    """dcgm-exporter 1.x (etc/1.x-compatibility-metrics.csv) names them dcgm_retired_pages_sbe/dbe/pending."""
    labels = 'gpu="0",uuid="GPU-b91e30ac"'
    page = "\n".join(f"dcgm_retired_pages_{k}{{{labels}}} {v}" for k, v in (("sbe", 4), ("dbe", 0), ("pending", 0)))
    r = DcgmSource("http://127.0.0.1:1/metrics", hostname="h").convert(page + "\n")
    assert r.ignored == {} and one(r, schema.RETIRED_PAGES, cause="single_bit_ecc") == 4
    assert one(r, schema.RETIRED_PAGES, cause="double_bit_ecc") == 0 and one(r, schema.RETIRED_PAGES_PENDING) == 0


def test_out_of_range_memory_health_values_are_dropped_by_the_collector(endpoint: Endpoint) -> None:
    """RETIRED_PENDING is 1 or 0 and the recovery action a small enum: anything else is not published."""
    endpoint.serve(body(DCGM_FI_DEV_RETIRED_PENDING=7, DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION=4096,
                        DCGM_FI_DEV_RETIRED_SBE=2))
    families = {f.name: f for f in TruegpuCollector([source_for(endpoint)]).collect()}
    assert schema.RETIRED_PAGES_PENDING.name not in families
    assert schema.GPU_RECOVERY_ACTION.name not in families
    retired = families[schema.RETIRED_PAGES.family_name].samples
    assert [(s.labels["cause"], s.value) for s in retired if s.name == schema.RETIRED_PAGES.name] == [
        ("single_bit_ecc", 2.0)]
    errors = {s.labels["kind"]: s.value for s in families["truegpu_exporter_errors"].samples}
    assert errors["out_of_range"] == 2


def test_percent_is_an_exact_ratio() -> None:
    r = DcgmSource("http://127.0.0.1:1/metrics", hostname="h").convert(body(DCGM_FI_DEV_GPU_UTIL=57))
    assert repr(one(r, GPU_UTILIZATION)) == "0.57"  # 57 / 100, not 57 * 0.01 = 0.5700000000000001


def test_recovers_after_failure(endpoint: Endpoint) -> None:
    src = source_for(endpoint)
    endpoint.serve("boom", status=500)
    assert not src.collect().up
    endpoint.serve(L40S)
    r = src.collect()
    assert r.up and len(r.samples[SM_CLOCK]) == 4


def test_force_hostname_overrides_label(endpoint: Endpoint) -> None:
    endpoint.serve(L40S)
    r = source_for(endpoint, hostname="node-a", force_hostname=True).collect()
    assert {labels["hostname"] for labels, _ in r.samples[SM_CLOCK]} == {"node-a"}


# -- small parts --------------------------------------------------------------------------
def test_promtext_parser() -> None:
    text = (
        '# HELP a_metric with "quotes"\n# TYPE a_metric counter\n'
        'a_metric{path="C:\\\\x",msg="say \\"hi\\"\\n",} 1.5e3 1712345678000\n'
        "plain 7\n"
        "nan_value NaN\n"
        "# TYPE broken bogus\n"
        "under_score 1_000\n"
        'dup{a="1",a="2"} 1\n'
        "# EOF\n"
    )
    res = promtext.parse(text)
    assert [(s.name, s.labels, s.value) for s in res.samples[:2]] == [
        ("a_metric", {"path": "C:\\x", "msg": 'say "hi"\n'}, 1500.0), ("plain", {}, 7.0),
    ]
    assert res.samples[2].value != res.samples[2].value  # NaN kept for the caller to judge
    assert res.types == {"a_metric": "counter"}
    assert [b.line for b in res.bad] == [6, 7, 8]
    assert "duplicate label" in res.bad[2].reason


def test_cli_options_build_the_source() -> None:
    from truegpu.cli import build_parser

    args = build_parser().parse_args(["exporter", "--source", "dcgm", "--dcgm-url", "http://10.0.0.5:9400/metrics",
                                      "--dcgm-timeout", "0.5", "--dcgm-hostname", "n7", "--dcgm-force-hostname"])
    src = from_args(args)
    assert (src.url, src.timeout, src.hostname, src.force_hostname) == ("http://10.0.0.5:9400/metrics", 0.5, "n7", True)
    with pytest.raises(ValueError, match="http"):
        DcgmSource("localhost:9400/metrics")


# -- per-series line cache ------------------------------------------------------------------
def test_line_cache_repeat_scrape_matches_fresh_source() -> None:
    text = H100.read_text()
    warm = DcgmSource("http://127.0.0.1:1/metrics", hostname="h")
    warm.convert(text)
    changed = text.replace("} 1980\n", "} 1410\n").replace("} 2619\n", "} 2619.5\n")
    got = warm.convert(changed)
    want = DcgmSource("http://127.0.0.1:1/metrics", hostname="h").convert(changed)
    # Counters integrate rates over time, so only the gauges of the two must agree.
    assert {m.name: sorted(map(repr, s)) for m, s in got.samples.items() if m.type != "counter"} == {
        m.name: sorted(map(repr, s)) for m, s in want.samples.items() if m.type != "counter"}
    assert any(v == 1410e6 for _, v in got.samples[SM_CLOCK])


def test_line_cache_changed_labels_and_bad_values_are_not_served_stale() -> None:
    src = DcgmSource("http://127.0.0.1:1/metrics", hostname="h")
    line = 'DCGM_FI_DEV_SM_CLOCK{gpu="0",UUID="GPU-a",pod="p1",namespace="n"} 1980\n'
    src.convert(line)
    r = src.convert(line.replace('pod="p1"', 'pod="p2"'))
    assert [labels["pod"] for labels, _ in r.samples[GPU_ALLOCATION_INFO]] == ["p2"]
    assert [labels["gpu"] for labels, _ in r.samples[SM_CLOCK]] == ["0"]
    # A value that float() takes but Prometheus does not, and a trailing timestamp, still go the slow way.
    r = src.convert(line.replace("1980", "1_980") + line.replace("1980", "1990 bogus"))
    assert SM_CLOCK not in r.samples and not r.up
    r = src.convert(line.replace("1980", "nan") + line)
    assert [v for _, v in r.samples[SM_CLOCK]] == [1980e6]
    # A comment seen before is skipped; a changed one is checked again.
    src.convert("# TYPE DCGM_FI_DEV_SM_CLOCK gauge\n" + line)
    r = src.convert("# TYPE DCGM_FI_DEV_SM_CLOCK bogus\n" + line)
    assert [e.kind for e in r.errors] == [BAD_LINE] and "line 1" in r.errors[0].message


def test_line_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from exporter.sources import dcgm

    monkeypatch.setattr(dcgm, "_MAX_CACHED", 10)
    src = DcgmSource("http://127.0.0.1:1/metrics", hostname="h")
    for i in range(50):
        r = src.convert(f'DCGM_FI_DEV_SM_CLOCK{{gpu="0",UUID="GPU-a",pod="p{i}"}} 1980\n')
        assert [labels["pod"] for labels, _ in r.samples[GPU_ALLOCATION_INFO]] == [f"p{i}"]
    assert len(src._lines) <= 11 and len(src._idents) <= 11
