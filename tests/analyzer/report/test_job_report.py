"""`truegpu job`: one job's report agrees with the cost report and the per-workload scores, and its advice
matches the problem injected into the demo fleet (a memory-bound job is told to batch, an idle notebook to
release its GPUs); the listing, the mail an admin sends, the page and the command line."""

from __future__ import annotations

import email
import json
import math
import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from analyzer.data.simulated import fleet_from_cluster
from analyzer.finops import cost_report, load_catalog
from analyzer.pipeline import analyze
from analyzer.report import job as J
from analyzer.report.job_html import render_job
from analyzer.report.job_list import job_list, mail_messages
from exporter.simulator import Cluster, load_scenario
from truegpu.cli import main

HOSTILE = '<script>alert("x")</script>'


@pytest.fixture(scope="module")
def demo():
    fleet = fleet_from_cluster(Cluster(load_scenario("mixed-fleet")), step=60.0)
    result = analyze(fleet)
    cost = cost_report(fleet, result.scores, result.findings, load_catalog(), group_by="workload")
    return fleet, result, cost


def report(demo, name: str) -> J.JobReport:
    fleet, result, cost = demo
    return J.job_report(fleet, result.scores, result.findings, J.resolve(fleet, name), cost)


@pytest.mark.parametrize("name", ["pretrain-7b", "embed-batch", "nb-alice", "chat-serve"])
def test_numbers_are_the_cost_report_s_and_the_workload_scores(demo, name):
    fleet, result, cost = demo
    r = report(demo, name)
    scores = result.scores.allocated["job"]
    row = scores[scores["job"].astype(str) == name].iloc[0]
    for col in ("allocated_gpu_hours", "effective_util", "reported_util", "effective_tensor", "idle_gpu_hours"):
        assert r.scores[col] == pytest.approx(float(row[col]), rel=1e-12, nan_ok=True), col
    group = cost.groups[cost.groups["group"] == name].iloc[0]
    for part in ("effective", "idle_allocated", "masked", "straggler", "headroom", "underused", "unknown"):
        assert r.parts[f"{part}_gpu_hours"] == pytest.approx(float(group[f"{part}_gpu_hours"]), abs=1e-9), part
        assert r.cost[f"{part}_cost"] == pytest.approx(float(group[f"{part}_cost"]), abs=1e-9)
    assert r.cost["cost"] == pytest.approx(float(group["cost"]))
    assert r.cost["cost_per_effective_gpu_hour"] == pytest.approx(float(group["cost_per_effective_gpu_hour"]),
                                                                  nan_ok=True)
    # per GPU: the job's own rows; the hours add up to the job's
    assert r.gpus["gpu_hours"].sum() == pytest.approx(r.scores["allocated_gpu_hours"])
    rows = fleet.frame[fleet.frame["job"] == name]
    assert len(r.gpus) == len(rows[["hostname", "gpu"]].drop_duplicates())
    assert r.memory_high_water_bytes == pytest.approx(float(rows["mem_used"].max()))


def test_advice_matches_the_injected_problem(demo):
    batch = report(demo, "embed-batch")
    assert batch.advice[0].kind == "batch" and "batch" in batch.advice[0].text.lower()
    assert "95%" in batch.advice[0].text and "20%" in batch.advice[0].text  # reported vs SM activity, said
    notebook = report(demo, "nb-alice")
    assert notebook.advice[0].kind == "release" and "Release the GPUs" in notebook.advice[0].text
    assert notebook.advice[0].gpu_hours == pytest.approx(notebook.parts["idle_allocated_gpu_hours"])
    assert {a.kind for a in notebook.advice}.isdisjoint({"batch", "smaller_gpu"})  # release first, nothing else
    pretrain = report(demo, "pretrain-7b")
    kinds = [a.kind for a in pretrain.advice]
    assert "straggler" in kinds and "hardware" in kinds and "release" not in kinds
    assert any(f.kind == "straggler" for f in pretrain.findings)
    assert all(f.job == "pretrain-7b" or f.job is None for f in pretrain.findings)


def test_memory_well_under_capacity_advises_a_smaller_gpu(demo):
    r = report(demo, "embed-batch")
    r.gpus["memory_used_max_bytes"] = 19 * 2**30
    r.gpus["memory_total_bytes"] = 80 * 2**30
    advice = {a.kind: a.text for a in J.advise(r)}
    assert "you asked for 4 x 80 GiB and used at most 19 GiB" in advice["smaller_gpu"]
    r.gpus["memory_used_max_bytes"] = np.nan  # not collected: unknown, no advice either way
    assert "smaller_gpu" not in {a.kind for a in J.advise(r)}
    assert "unknown (memory not collected)" in J.format_text(r)


def test_a_pod_names_its_job_and_an_unknown_name_lists_the_workloads(demo):
    fleet, _, _ = demo
    pod = str(fleet.frame.loc[fleet.frame["job"] == "nb-alice", "pod"].iloc[0])
    assert J.resolve(fleet, pod) == "nb-alice"
    with pytest.raises(LookupError) as err:
        J.resolve(fleet, "serve")
    assert "no workload, Slurm job or pod named 'serve'" in str(err.value)
    assert "chat-serve" in str(err.value) and "ranker-serve" in str(err.value)


def test_json_text_and_page(demo):
    r = report(demo, "pretrain-7b")
    doc = J.to_json(r)
    json.dumps(doc, allow_nan=False)
    assert doc["workload"] == "pretrain-7b" and doc["gpus"] == 16 and doc["running"] is True
    assert doc["parts"]["straggler"] == pytest.approx(r.parts["straggler_gpu_hours"])
    assert len(doc["timeline"]) == 240 and doc["timeline"][0]["timestamp"].endswith("Z")
    text = J.format_text(r)
    assert "Job pretrain-7b (namespace llm)" in text and "GPUs:      16" in text
    assert f"{r.scores['allocated_gpu_hours']:,.1f} held" in text and "Advice:" in text
    page = render_job(r)
    root = ET.fromstring(re.sub(r"^<!DOCTYPE html>", "", page))
    ids = {e.get("id") for e in root.iter() if e.get("id")}
    assert {"job-util-t", "job-parts-t", "job-gpus-t", "gpus", "findings"} <= ids
    assert "<script" not in page and "http://" not in page.replace("http://www.w3.org/2000/svg", "")


def test_the_page_escapes_names():
    fleet = fleet_from_cluster(Cluster(load_scenario("mixed-fleet")), step=60.0)
    fleet.frame["job"] = fleet.frame["job"].cat.rename_categories({"nb-alice": HOSTILE})
    res = analyze(fleet)
    page = render_job(J.job_report(fleet, res.scores, res.findings, HOSTILE))
    ET.fromstring(re.sub(r"^<!DOCTYPE html>", "", page))
    assert HOSTILE not in page and "&lt;script&gt;" in page


def test_listing_below_a_bar_and_finished_jobs(demo):
    fleet, result, _ = demo
    jobs = job_list(fleet, result.scores, 0.3)
    assert list(jobs["job"]) == ["nb-alice", "ranker-serve", "chat-serve", "embed-batch"]  # lowest first
    assert (jobs["effective_util"] < 0.3).all() and jobs["running"].all()
    assert job_list(fleet, result.scores, 0.3, finished=True).empty
    # nb-alice released its GPUs an hour before the end: it finished within the window
    fleet = fleet_from_cluster(Cluster(load_scenario("mixed-fleet")), step=60.0)  # not the shared one: changed
    fr = fleet.frame
    late = (fr["job"] == "nb-alice").to_numpy() & (fr["timestamp"].to_numpy() >= fleet.end - 3600)
    for col in ("job", "pod", "namespace", "container"):
        fr.loc[late, col] = np.nan
    res = analyze(fleet)
    done = job_list(fleet, res.scores, 0.3, finished=True)
    assert list(done["job"]) == ["nb-alice"] and done["last_seen"].iloc[0] == fleet.end - 3600 - 60
    # unknown utilization is never "below"
    row = res.scores.allocated["job"]["job"].astype(str) == "embed-batch"
    res.scores.allocated["job"].loc[row, "effective_util"] = math.nan
    assert "embed-batch" not in set(job_list(fleet, res.scores, 0.3)["job"])


def test_one_mail_per_namespace(demo):
    fleet, result, _ = demo
    jobs = job_list(fleet, result.scores, 0.3)
    msgs = mail_messages(jobs, 0.3, fleet.start, fleet.end, to="{namespace}-owners@example.org",
                         link="https://truegpu.example/jobs/{job}")
    assert sorted(msgs) == ["batch", "notebooks", "serving"]
    parsed = email.message_from_bytes(bytes(msgs["serving"]))
    assert parsed["To"] == "serving-owners@example.org"
    assert parsed["Subject"] == "GPU jobs below 30% effective utilization of serving (2)"
    body = parsed.get_payload(decode=True).decode()
    assert "ranker-serve" in body and "chat-serve" in body and "nb-alice" not in body
    assert "https://truegpu.example/jobs/chat-serve" in body


def test_the_command_line(demo, capsys, tmp_path):
    assert main(["job", "--demo", "--quiet", "--json", "embed-batch"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc == json.loads(json.dumps(J.to_json(report(demo, "embed-batch"))))
    assert main(["job", "--demo", "--quiet", "nb-alice", "--html", str(tmp_path)]) == 0
    assert "Release the GPUs" in capsys.readouterr().out
    assert "Release the GPUs" in (tmp_path / "job-nb-alice.html").read_text()
    assert main(["job", "--demo", "--quiet", "--list", "--below", "30%", "--finished"]) == 0
    assert "No job below 30% effective utilization" in capsys.readouterr().out
    mail = tmp_path / "mail"
    assert main(["job", "--demo", "--quiet", "--list", "--below", "0.3", "--mail", str(mail)]) == 0
    assert sorted(p.name for p in mail.iterdir()) == ["batch.eml", "notebooks.eml", "serving.eml"]
    for argv, words in ((["job", "--demo"], "give a job NAME, or --list"),
                        (["job", "--demo", "x", "--list"], "give a job NAME, or --list"),
                        (["job", "--demo", "--list", "--mail", str(mail)], "--mail needs --below"),
                        (["job", "--demo", "nope"], "no workload, Slurm job or pod named 'nope'")):
        assert main(argv) == 2
        assert words in capsys.readouterr().err


def test_a_job_on_a_whole_gpu_and_a_mig_slice_lists_none_for_the_whole_gpus_instance():
    """None, not NaN (pandas 3 infers a string column whose missing value is NaN) where a device has no
    instance or profile, beside one that has."""
    from analyzer.pipeline import analyze as run
    from tests.fleets import timeline

    busy = {"gpu_util": 0.9, "sm_active": 0.5, "tensor_active": 0.2, "dram_active": 0.2, "mem_used": 2.0**30}
    owner = {"job": "mix", "namespace": "ns"}
    fleet = timeline([{"gpu": 0, "pod": "p0", **owner, **busy},
                      {"gpu": 1, "gpu_instance": "1", "mig_profile": "3g.40gb", "pod": "p1", **owner, **busy}], 30)
    res = run(fleet)
    r = J.job_report(fleet, res.scores, res.findings, "mix")
    assert r.gpus[["gpu", "gpu_instance", "mig_profile"]].to_dict("records") == [
        {"gpu": "0", "gpu_instance": None, "mig_profile": None},
        {"gpu": "1", "gpu_instance": "1", "mig_profile": "3g.40gb"}]


def test_a_mig_job_counts_its_gpus_and_its_slices():
    fleet = fleet_from_cluster(Cluster(load_scenario("mig-training")), step=60.0)
    result = analyze(fleet)
    r = J.job_report(fleet, result.scores, result.findings, "mig-finetune")
    assert (r.physical_gpus, len(r.gpus), r.slices) == (4, 8, "8 MIG slices (3g.40gb)")
    assert "GPUs:      4 as 8 MIG slices (3g.40gb)" in J.format_text(r)
    assert (J.to_json(r)["gpus"], J.to_json(r)["devices"]) == (4, 8)
    listed = job_list(fleet, result.scores).set_index("job")
    assert listed.loc["mig-finetune", "gpus"] == 4  # the listing counts GPUs as the report does
