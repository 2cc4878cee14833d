"""`truegpu exporter` end to end: a real subprocess, real HTTP on loopback, real promtool."""

from __future__ import annotations

import argparse
import gzip
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from exporter import schema as S
from exporter import sources as source_registry
from exporter.server import parse_listen
from exporter.server import run as run_exporter
from exporter.sources.base import Reading, Source
from tests.conftest import ROOT, free_port, promtool_check, sample_value
from tests.exporter.kit import DCGM_PAGES
from tests.httpstub import Endpoint

TRUEGPU = str(Path(sys.executable).with_name("truegpu"))
CONTRACT = {m.family_name: m for m in S.METRICS}


# helpers ----------------------------------------------------------------------------------
class Exporter:
    """A running `truegpu exporter` subprocess; stderr goes to a file so it never blocks."""

    def __init__(self, *args: str) -> None:
        self.port = free_port()
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - closed by exporter()
        self.proc = subprocess.Popen(
            [TRUEGPU, "exporter", *args, "--listen", f"127.0.0.1:{self.port}"],
            cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT,
        )
        self.url = f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"exporter exited with {self.proc.returncode}:\n{self.output()}")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                time.sleep(0.05)
        pytest.fail(f"exporter not ready after {timeout}s:\n{self.output()}")

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        req = urllib.request.Request(self.url + path, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as err:
            return err.code, dict(err.headers), err.read()

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"exporter ignored signal {sig}:\n{self.output()}")


@contextmanager
def exporter(*args: str) -> Iterator[Exporter]:
    exp = Exporter(*args)
    try:
        exp.wait_ready()
        yield exp
    finally:
        exp.stop()
        exp.log.close()


def families(body: bytes) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


# simulated source, real subprocess ------------------------------------------------------------
def test_serves_contract_metrics_that_promtool_accepts(promtool):
    with exporter("--source", "simulated", "--scenario", "mixed-fleet", "--seed", "7") as exp:
        status, headers, body = exp.get("/metrics")
        assert status == 200
        assert headers["Content-Type"].startswith("text/plain")
        promtool_check(promtool, body)
        fams = families(body)

        for name in fams:
            assert name in CONTRACT, f"{name} is not in exporter/schema.py"
        for m in (S.GPU_UTILIZATION, S.SM_ACTIVE, S.POWER, S.TEMPERATURE, S.MEMORY_USED, S.GPU_INFO, S.ENERGY):
            assert fams[m.family_name].samples, m.name
            assert fams[m.family_name].type == m.type
        for fam in fams.values():
            m = CONTRACT[fam.name]
            for s in fam.samples:
                names = set(s.labels)
                assert names in (set(m.all_labels), set(m.all_labels) | set(S.MIG_LABELS)), (s.name, s.labels)
                if m.scope == "gpu":
                    assert s.labels[S.HOSTNAME] and s.labels[S.GPU] != "" and s.labels[S.UUID]
        assert sample_value(fams, S.SOURCE_UP, source="simulated") == 1.0
        # A mixed fleet spans several nodes and GPUs.
        util = fams[S.GPU_UTILIZATION.name].samples
        assert len({s.labels[S.HOSTNAME] for s in util}) > 1
        assert len({(s.labels[S.HOSTNAME], s.labels[S.GPU]) for s in util}) == len(util) or any(
            S.GPU_INSTANCE in s.labels for s in util
        )

        # OpenMetrics negotiation, gzip, and the small pages.
        status, headers, body = exp.get("/metrics", {"Accept": "application/openmetrics-text; version=1.0.0"})
        assert headers["Content-Type"].startswith("application/openmetrics-text")
        assert body.rstrip().endswith(b"# EOF")
        om = {f.name: f for f in parse_openmetrics(body.decode())}
        assert om[S.ENERGY.family_name].unit == "joules"
        status, headers, body = exp.get("/metrics", {"Accept-Encoding": "gzip"})
        assert headers.get("Content-Encoding") == "gzip"
        assert S.GPU_UTILIZATION.name.encode() in gzip.decompress(body)
        assert exp.get("/healthz")[:3:2] == (200, b"ok\n")
        status, _, body = exp.get("/")
        assert status == 200 and b'href="/metrics"' in body and b"simulated" in body
        assert exp.get("/nope")[0] == 404

        assert exp.stop(signal.SIGTERM) == 0
        out = exp.output()
    assert "source simulated" in out and "mixed-fleet" in out, out
    assert "listening on http://127.0.0.1:" in out
    assert "stopped" in out
    assert "Traceback" not in out, out


def test_sigint_also_stops_cleanly():
    with exporter("--source", "simulated", "--scenario", "healthy-fleet") as exp:
        assert exp.get("/metrics")[0] == 200
        assert exp.stop(signal.SIGINT) == 0
        assert "Traceback" not in exp.output()


def test_lost_gpu_is_omitted_and_counted(promtool):
    # xid-faults loses a GPU (XID 79) one hour into the scenario; start two hours in.
    with exporter("--source", "simulated", "--scenario", "xid-faults", "--start", "2h") as exp:
        body = exp.get("/metrics")[2]
        promtool_check(promtool, body)
        fams = families(body)
    assert sample_value(fams, S.SOURCE_UP, source="simulated") == 0.0
    lost = sample_value(fams, S.EXPORTER_ERRORS, source="simulated", kind="gpu_lost")
    assert lost is not None and lost >= 1
    gpus_with_util = {(s.labels[S.HOSTNAME], s.labels[S.GPU]) for s in fams[S.GPU_UTILIZATION.name].samples}
    gpus_with_info = {(s.labels[S.HOSTNAME], s.labels[S.GPU]) for s in fams[S.GPU_INFO.name].samples}
    missing = gpus_with_info - gpus_with_util
    assert gpus_with_util, "the other GPUs are still served"
    assert missing or len(gpus_with_util) < 8 * len({h for h, _ in gpus_with_util}), "a GPU must be missing"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--source", "nvidia-magic"], "unknown source 'nvidia-magic'; known sources: simulated"),
        ([], "at least one --source is required"),
        (["--source", "simulated"], "--scenario"),
        (["--source", "simulated", "--scenario", "no-such-scenario"], "no-such-scenario"),
        (["--source", "simulated", "--source", "simulated", "--scenario", "healthy-fleet"], "given twice"),
        (["--source", "simulated", "--scenario", "healthy-fleet", "--precedence", "truegpu_power_watts"],
         "expected FAMILY=SOURCE"),
        (["--source", "simulated", "--scenario", "healthy-fleet", "--precedence", "truegpu_power_watts=dcgm"],
         "not configured: dcgm"),
        (["--source", "dcgm", "--deadline", "0"], "--deadline must be > 0"),
        (["--source", "simulated", "--scenario", "healthy-fleet", "--collect-interval", "-1"],
         "--collect-interval must be >= 0"),
    ],
)
def test_bad_command_lines_fail_clearly(args, needle):
    proc = subprocess.run(
        [TRUEGPU, "exporter", *args, "--listen", f"127.0.0.1:{free_port()}"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr


def test_port_in_use_is_a_clear_error():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run(
            [TRUEGPU, "exporter", "--source", "simulated", "--scenario", "healthy-fleet", "--listen",
             f"127.0.0.1:{port}"],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )
    assert proc.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr


# --listen and the source registry, in-process ------------------------------------------------
@pytest.mark.parametrize(
    ("value", "expected"),
    [(":9835", ("", 9835)), ("127.0.0.1:80", ("127.0.0.1", 80)), ("[::1]:9835", ("::1", 9835)),
     ("node-1.example:0", ("node-1.example", 0))],
)
def test_parse_listen(value, expected):
    assert parse_listen(value) == expected


@pytest.mark.parametrize("value", ["9835", "::1:9835", "host:port", "host:70000", ":-1"])
def test_parse_listen_rejects(value):
    with pytest.raises(argparse.ArgumentTypeError):
        parse_listen(value)


class CountingSource(Source):
    name = "counting"

    def __init__(self) -> None:
        self.scrapes = 0
        self.closed = threading.Event()

    def collect(self) -> Reading:
        self.scrapes += 1
        r = Reading()
        r.add(S.POWER, {S.HOSTNAME: "h", S.GPU: "0", S.UUID: "GPU-0"}, float(self.scrapes))
        return r

    def close(self) -> None:
        self.closed.set()


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.parametrize("host", ["127.0.0.1", "[::1]", ""])
def test_registered_source_served_on_each_listen_form(monkeypatch, host):
    """A new source plugs in through the registry alone, and every --listen form serves."""
    if host == "[::1]" and not _ipv6_loopback():
        pytest.skip("no IPv6 loopback on this host")
    source = CountingSource()
    monkeypatch.setitem(
        source_registry.SOURCES, "counting", source_registry.SourceSpec("counting", "test source", lambda a: source)
    )
    port = free_port()
    args = argparse.Namespace(sources=["counting"], listen=parse_listen(f"{host}:{port}"), collect_interval=3600.0)
    stop = threading.Event()
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(run_exporter(args, stop)))
    thread.start()
    url_host = host or "127.0.0.1"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with urllib.request.urlopen(f"http://{url_host}:{port}/metrics", timeout=2) as resp:
                    fams = families(resp.read())
                break
            except OSError:
                assert time.monotonic() < deadline, "exporter did not come up"
                time.sleep(0.02)
    finally:
        stop.set()
        thread.join(timeout=10)
    assert result == [0]
    assert source.closed.is_set()
    # the first background collection, made before serving, is what the scrape renders
    assert sample_value(fams, S.POWER, hostname="h", gpu="0", uuid="GPU-0") == 1.0 and source.scrapes == 1
    assert sample_value(fams, S.SOURCE_UP, source="counting") == 1.0


class RenderCounter:
    """A plain prometheus_client collector beside ours: counts how often /metrics is rendered."""

    def __init__(self) -> None:
        self.renders = 0

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator:
        self.renders += 1
        return iter(())


def wsgi_get(app, **headers: str) -> tuple[str, dict[str, str], bytes]:
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "QUERY_STRING": "",
               **{"HTTP_" + k.upper(): v for k, v in headers.items()}}
    started: list = []
    body = b"".join(app(environ, lambda status, hdrs, exc_info=None: started.append((status, dict(hdrs)))))
    return started[0][0], started[0][1], body


def test_each_collection_is_rendered_once_per_request_shape():
    from exporter.collector import build_registry
    from exporter.server import make_app

    source = CountingSource()
    registry, collector = build_registry([source], interval=0.2)
    counter = RenderCounter()
    registry.register(counter)
    app = make_app(registry, collector)
    try:
        collector.start()
        while collector.generation == 0:
            time.sleep(0.005)
        for _ in range(20):
            generation, before = collector.generation, counter.renders
            plain = wsgi_get(app)
            again = wsgi_get(app)
            om = wsgi_get(app, accept="application/openmetrics-text; version=1.0.0")
            om_again = wsgi_get(app, accept="application/openmetrics-text; version=1.0.0")
            gz = wsgi_get(app, accept_encoding="gzip")
            if collector.generation != generation:
                continue  # a collection landed mid-round: try again
            assert counter.renders - before == 3, "plain, OpenMetrics and gzip: one render each"
            assert plain == again and om == om_again
            assert plain[1]["Content-Type"].startswith("text/plain") and b"truegpu_power_watts" in plain[2]
            assert om[1]["Content-Type"].startswith("application/openmetrics-text") and om[2].endswith(b"# EOF\n")
            assert gz[1].get("Content-Encoding") == "gzip" and gzip.decompress(gz[2]) == plain[2]
            break
        else:
            pytest.fail("no round without a collection landing in it")
        # a new collection is rendered anew, with its values
        deadline = time.monotonic() + 10
        while wsgi_get(app)[2] == plain[2]:
            assert time.monotonic() < deadline, "a new collection was never served"
            time.sleep(0.01)
    finally:
        collector.close()


# real sources, real subprocess ------------------------------------------------------------------
def test_nvml_without_a_driver_and_dcgm_together(promtool):
    """This machine has no NVIDIA driver: the nvml source reports itself down and the exporter
    keeps serving the dcgm-exporter data, with the configured family precedence and no duplicates."""
    endpoint = Endpoint()
    endpoint.serve(DCGM_PAGES / "h100_mig_pods.txt")
    try:
        with exporter("--source", "nvml", "--source", "dcgm", "--dcgm-url", endpoint.url,
                      "--precedence", "truegpu_sm_active_ratio=dcgm,nvml") as exp:
            status, _, body = exp.get("/metrics")
            assert status == 200
            fams = families(body)
            assert sample_value(fams, S.SOURCE_UP, source="nvml") == 0.0
            assert sample_value(fams, S.SOURCE_UP, source="dcgm") == 1.0
            assert sample_value(fams, S.EXPORTER_ERRORS, source="nvml", kind="nvml_unavailable") >= 1
            assert sample_value(fams, S.SOURCE_STALE, source="dcgm") == 0.0
            sm = fams[S.SM_ACTIVE.family_name].samples
            assert sm and len({(x.labels[S.UUID], x.labels.get(S.GPU_INSTANCE)) for x in sm}) == len(sm)
            promtool_check(promtool, body)
            assert "NVML unavailable" in exp.output()
    finally:
        endpoint.close()
