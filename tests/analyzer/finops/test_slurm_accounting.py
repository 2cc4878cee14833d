"""Slurm accounting: the user, account and partition the prolog writes reach the analyzer as
truegpu_slurm_job_info, and costs group by user and account; a token scoped to accounts sees those jobs.
Read from an OpenMetrics history file the way `analyze --input` reads one."""

from __future__ import annotations

import hashlib

import pytest
import requests

from analyzer.data.load import load_files
from analyzer.finops import cost_report, load_catalog
from analyzer.pipeline import analyze
from analyzer.report import job as J
from analyzer.report.job_list import job_list, mail_messages
from analyzer.service import AnalyzerService
from analyzer.service.app import create_app
from analyzer.service.settings import ApiSettings
from analyzer.site import parse_site
from exporter import schema as S
from tests.analyzer.service.kit import TOKEN, served

T0, STEP, STEPS = 1_767_571_200, 60, 30
#: GPU -> (Slurm job, user, account, partition); GPU 3 is held by a job whose prolog wrote no accounting,
#: GPU 4 by nobody.
HELD = {"0": ("4242", "alice", "phys-a", "gpu"), "1": ("4242", "alice", "phys-a", "gpu"),
        "2": ("4300", "bob", "chem", "debug"), "3": ("4301", None, None, None), "4": None}


def history(path) -> None:
    lines = []
    for name, kind in ((S.GPU_UTILIZATION.name, "gauge"), (S.SM_ACTIVE.name, "gauge"), (S.MEMORY_USED.name, "gauge"),
                       (S.GPU_ALLOCATION_INFO.name, "gauge"), (S.SLURM_JOB_INFO.name, "gauge")):
        lines.append(f"# TYPE {name} {kind}")
        for gpu, held in HELD.items():
            ident = f'hostname="hpc-01",gpu="{gpu}",UUID="GPU-{gpu}"'
            for k in range(STEPS):
                ts = T0 + k * STEP
                if name == S.GPU_ALLOCATION_INFO.name:
                    if held:
                        lines.append(f'{name}{{{ident},{S.WORKLOAD}="{held[0]}"}} 1 {ts}')
                elif name == S.SLURM_JOB_INFO.name:
                    if held and held[1]:
                        lines.append(f'{name}{{{ident},{S.WORKLOAD}="{held[0]}",user="{held[1]}",'
                                     f'account="{held[2]}",partition="{held[3]}"}} 1 {ts}')
                else:
                    value = {S.GPU_UTILIZATION.name: 0.9, S.SM_ACTIVE.name: 0.5}.get(name, 1e9) if held else 0.0
                    lines.append(f"{name}{{{ident}}} {value} {ts}")
    lines.append("# EOF")
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    path = tmp_path_factory.mktemp("slurm") / "hpc.om"
    history(path)
    return load_files([path], step=STEP)


def test_accounting_is_read_and_costs_group_by_user_and_account(fleet):
    acct = fleet.accounting.set_index("job")
    assert sorted(acct.index) == ["4242", "4300"]
    assert tuple(acct.loc["4242"]) == ("alice", "phys-a", "gpu")
    result = analyze(fleet)
    catalog = load_catalog()
    hours = STEPS * STEP / 3600
    for group_by, want in (("user", {"alice": 2, "bob": 1, "(unknown)": 1, "(unallocated)": 1}),
                           ("account", {"phys-a": 2, "chem": 1, "(unknown)": 1, "(unallocated)": 1})):
        report = cost_report(fleet, result.scores, result.findings, catalog, group_by=group_by)
        got = dict(zip(report.groups["group"], report.groups["gpu_hours"], strict=True))
        assert got == pytest.approx({k: v * hours for k, v in want.items()})
        assert report.totals["gpu_hours"] == pytest.approx(5 * hours)  # the groups add up to the fleet
    r = J.job_report(fleet, result.scores, result.findings, "4242")
    assert r.slurm == {"user": "alice", "account": "phys-a", "partition": "gpu"}
    assert "Slurm:     user alice, account phys-a, partition gpu" in J.format_text(r)
    assert J.job_report(fleet, result.scores, result.findings, "4301").slurm is None
    jobs = job_list(fleet, result.scores)  # a Slurm job's owner is its user: the mail goes to them
    assert dict(zip(jobs["job"], jobs["user"], strict=True)) == {"4242": "alice", "4300": "bob", "4301": ""}
    msgs = mail_messages(jobs, 1.0, fleet.start, fleet.end, to="{owner}@hpc.example")
    assert sorted(msgs) == ["_no_owner_", "alice", "bob"]
    assert msgs["alice"]["To"] == "alice@hpc.example" and "4242" in msgs["alice"].get_content()


def test_a_token_scoped_to_an_account_sees_its_jobs(fleet):
    service = AnalyzerService(lambda start, end: fleet, window=STEPS * STEP, step=STEP, interval=60,
                              clock=lambda: T0 + STEPS * STEP + 1)
    assert service.run_once()
    site = parse_site({"access": {"tokens": [
        {"name": "physics", "sha256": hashlib.sha256(b"phys-token").hexdigest(), "accounts": ["phys-*"]}]}})
    app = create_app(service, ApiSettings(token=TOKEN, catalog=load_catalog(), tokens=site.tokens))
    auth = {"Authorization": "Bearer phys-token"}
    with served(app) as url:
        jobs = requests.get(f"{url}/api/jobs", headers=auth, timeout=30).json()["jobs"]
        assert [j["job"] for j in jobs] == ["4242"]
        groups = requests.get(f"{url}/api/reports/cost", params={"group_by": "account"}, headers=auth,
                              timeout=30).json()["report"]["groups"]
        assert [g["group"] for g in groups] == ["phys-a"]
        assert requests.get(f"{url}/api/jobs/4300", headers=auth, timeout=30).status_code == 404
        denied = requests.get(f"{url}/api/reports/cost", params={"group_by": "user"}, headers=auth, timeout=30)
        assert denied.status_code == 403 and "Slurm accounts phys-*" in denied.json()["detail"]
