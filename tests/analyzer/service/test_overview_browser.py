"""The `/` overview page in a REAL headless browser (Debian's chromium).

The service analyzes the simulated mixed-fleet cluster (real scores, detectors and cost),
serves on a loopback uvicorn, and chromium loads / with HTTP Basic credentials in the URL
(the token as the password): --dump-dom must hold the fleet's reported and effective
utilization, the top findings and the cost; --screenshot must produce a real PNG. A job name
carrying markup proves the page escapes what comes from the data. Chromium is never
skipped: when it is missing the test fails with the command that installs it.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from analyzer.service.app import create_app
from analyzer.service.settings import ApiSettings
from tests.analyzer.service.kit import TOKEN, new_service, served

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars")
HOSTILE = "<img src=x onerror=alert(1)>"


def chromium_bin() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail("chromium is not installed; run `make test` (installs Debian's chromium) or "
                "`apt-get install chromium`", pytrace=False)


def chromium(tmp: Path, url: str, *args: str) -> subprocess.CompletedProcess:
    profile = tmp / f"profile-{len(list(tmp.glob('profile-*')))}"  # fresh profile per run
    cmd = [chromium_bin(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--window-size=1280,1600", *args, url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


class Texts(HTMLParser):
    """Text by element id, rows by class, and every tag seen."""

    def __init__(self) -> None:
        super().__init__()
        self.by_id: dict[str, str] = {}
        self.tags: set[str] = set()
        self.finding_rows = 0
        self._open: list[str | None] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.add(tag)
        if tag == "tr" and a.get("class") == "finding":
            self.finding_rows += 1
        if tag not in ("br", "img", "meta", "link", "input"):
            self._open.append(a.get("id"))
            if a.get("id"):
                self.by_id[a["id"]] = ""

    def handle_endtag(self, tag):
        if self._open and tag not in ("br", "img", "meta", "link", "input"):
            self._open.pop()

    def handle_data(self, data):
        for i in self._open:
            if i:
                self.by_id[i] += data


@pytest.fixture(scope="module")
def page_url(tmp_path_factory):
    from analyzer.finops import load_catalog
    from exporter.simulator import Cluster, load_scenario

    scenario = load_scenario("mixed-fleet")
    from tests.analyzer.service.kit import NOW

    cluster = Cluster(scenario, start=NOW - float(scenario.duration))
    service, source = new_service(cluster)
    real = source.__call__

    def hostile_loader(start, end):  # one job renamed to markup: the page must show it as text
        fleet = real(start, end)
        job = fleet.frame["job"].astype(object)
        fleet.frame["job"] = job.where(job != "nb-alice", HOSTILE).astype("category")
        return fleet

    service.loader = hostile_loader
    assert service.run_once()
    with served(create_app(service, ApiSettings(token=TOKEN, catalog=load_catalog()))) as url:
        yield service, url


def test_overview_in_headless_chromium(page_url, tmp_path):
    from analyzer.analysis.scores import fleet_summary
    from analyzer.finops import cost_report, load_catalog
    from analyzer.report.html import fmt_pct

    service, url = page_url
    authed = url.replace("http://", f"http://anyone:{TOKEN}@") + "/"
    dom = chromium(tmp_path, authed, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-3000:]
    parsed = Texts()
    parsed.feed(dom.stdout)

    a = service.snapshot().analysis
    summary = fleet_summary(a.scores)
    assert parsed.by_id["reported-util"] == fmt_pct(summary["reported_util"])
    assert parsed.by_id["effective-util"] == fmt_pct(summary["effective_util"])
    assert parsed.by_id["fleet-effective-util"] == fmt_pct(summary["fleet_effective_util"])
    assert float(parsed.by_id["effective-util"].rstrip("%")) < float(parsed.by_id["reported-util"].rstrip("%"))
    assert parsed.finding_rows == min(10, len(a.findings)) > 0
    assert f"{len(a.findings):,} findings" in parsed.by_id["findings-count"]
    report = cost_report(a.fleet, a.scores, list(a.findings), load_catalog(), group_by="namespace")
    assert parsed.by_id["cost-total"] == f"{report.totals['cost']:,.2f} USD"
    assert "Stale" not in dom.stdout

    # The hostile job name is text in the DOM, never an element; no script anywhere.
    assert HOSTILE in parsed.by_id["findings"]  # shown as text in the findings table
    assert "img" not in parsed.tags and "script" not in parsed.tags

    # Without credentials the browser gets the 401 challenge, not the numbers.
    denied = chromium(tmp_path, url + "/", "--dump-dom")
    assert parsed.by_id["reported-util"] not in denied.stdout

    shot = tmp_path / "overview.png"
    run = chromium(tmp_path, authed, f"--screenshot={shot}")
    assert run.returncode == 0 and shot.exists(), run.stderr[-3000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (1280, 1600) and len(data) > 20_000  # a rendered page, not a blank one


def test_job_page_in_headless_chromium(page_url, tmp_path):
    """The job page a finding links to: the job's numbers as text, the hostile name escaped, a real render."""
    from urllib.parse import quote

    from analyzer.report.html import fmt_pct

    service, url = page_url
    authed = url.replace("http://", f"http://anyone:{TOKEN}@")
    overview = chromium(tmp_path, authed + "/", "--dump-dom").stdout
    assert f'href="/jobs/{quote(HOSTILE, safe="")}"' in overview.replace("&amp;", "&")  # the findings link it
    page = authed + "/jobs/" + quote(HOSTILE, safe="")
    dom = chromium(tmp_path, page, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-3000:]
    parsed = Texts()
    parsed.feed(dom.stdout)
    a = service.snapshot().analysis
    table = a.scores.allocated["job"]
    row = table[table["job"].astype(str) == HOSTILE].iloc[0]
    assert f"Job {HOSTILE}" in dom.stdout.replace("&lt;", "<").replace("&gt;", ">")
    assert fmt_pct(row["effective_util"]) in dom.stdout and "Release the GPUs" in dom.stdout
    assert "img" not in parsed.tags and "script" not in parsed.tags
    shot = tmp_path / "job.png"
    run = chromium(tmp_path, page, f"--screenshot={shot}")
    assert run.returncode == 0 and shot.exists(), run.stderr[-3000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
