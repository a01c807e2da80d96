"""`burnrate report` (docs/showback.md) against a fleet of known spend: three teams over three
days in a real Prometheus, with kube-state-metrics' kube_pod_labels beside the GPU series.

The truth is the fleet's exact intervals (tests/contract_fleet.py) at the list prices of
docs/pricing.md; the fleet's dollars per day are what `burnrate analyze` reports for the
day's window."""
from __future__ import annotations

import csv
import json
import math
import os
import re
import shutil

import numpy as np
import pytest

from burnrate.analyzer.grid.frames import Window
from burnrate.analyzer.output.showback import apportion, periods
from burnrate.cli import main as burnrate
from tests.conftest import built_once, require
from tests.contract_fleet import (BASE_TIME, KSM_SCRAPE_S, Node, Series, Workload, backfill_prometheus, generate,
                                  pod_names)
from tests.processes import prometheus

DAY = 86400.0
START = BASE_TIME + 200 * DAY       # a midnight (UTC), in the past
END = START + 3 * DAY
# docs/pricing.md: p4d.24xlarge (8 x A100 40GB), on-demand $21.96/h, spot $7.7864/h
RATE = {"on-demand": 21.96 / 8, "spot": 7.7864 / 8}
NODES = (Node("od-1", 8, "agent", 60.0), Node("spot-1", 8, "agent", 60.0, capacity_type="spot"))
WORKLOADS = (
    Workload("ml", "llm", "training", "PyTorchJob", (("od-1", (0, 1, 2, 3)), ("spot-1", (0, 1, 2, 3))),
             START + 2 * 3600, START + DAY + 5 * 3600, telemetry=True, tokens_per_step=1e5),
    Workload("research", "nb", "interactive", "Notebook", (("od-1", (4,)),), START, END, util_pct=0.0),
    Workload("data", "embed", "batch", "Job", (("spot-1", (4, 5)),), START + DAY + 3600, START + DAY + 13 * 3600),
    Workload("data", "tail", "batch", "Job", (("od-1", (6,)),), START + 2 * DAY + 600, START + 2 * DAY + 4200),
)
TEAM = {"ml": "alpha", "research": "alpha", "data": "beta"}     # the pods' `team` label, by namespace
CAPACITY = {n.name: n.capacity_type for n in NODES}


def truth(day: int, team_of=lambda ns: ns) -> dict[str, dict[str, float]]:
    """Team -> GPU-hours and dollars (spot, on-demand) held in the day, from the exact intervals."""
    start, end = START + day * DAY, START + (day + 1) * DAY
    out: dict[str, dict[str, float]] = {}
    for w in WORKLOADS:
        held_h = max(0.0, min(w.end, end) - max(w.start, start)) / 3600
        if held_h <= 0:
            continue
        team = out.setdefault(team_of(w.namespace), {"gpu_hours": 0.0, "spot": 0.0, "on-demand": 0.0})
        for node, gpus in w.placements:
            hours = w.share * len(gpus) * held_h
            team["gpu_hours"] += hours
            team[CAPACITY[node]] += hours * RATE[CAPACITY[node]]
    return out


def pod_labels(fleet) -> list[Series]:
    """kube-state-metrics' kube_pod_labels, with the allowlisted `team` label, for every pod."""
    out = []
    for w in WORKLOADS:
        t = np.arange(w.start, w.end, KSM_SCRAPE_S)
        for pod in pod_names(w, fleet.seed):
            out.append(Series("kube_pod_labels", {"namespace": w.namespace, "pod": pod, "label_team": TEAM[w.namespace],
                                                  "instance": "10.0.0.2:8080", "job": "kube-state-metrics"},
                              t, np.ones(len(t))))
    return out


def serve_fleet(tmp_path_factory):
    """The teams' fleet, with its pods' labels, in a real Prometheus: its URL. One for the
    session (tests/conftest.py's `store`): the showback, budgets and Cost page tests read it."""
    require("prometheus")

    def build(directory) -> None:
        fleet = generate(NODES, WORKLOADS, START, END, seed=3)
        fleet.series += pod_labels(fleet)
        backfill_prometheus(fleet, directory)   # its blocks, and the OpenMetrics they came from
        (directory / "fleet.om").unlink()

    tmp = tmp_path_factory.mktemp("showback")
    storage = tmp / "tsdb"   # this Prometheus's own copy: it writes beside the blocks
    shutil.copytree(os.path.join(built_once(tmp_path_factory, "showback", build), "blocks"), storage)
    with prometheus(tmp, storage=str(storage)) as prom:
        yield prom.url


def report(capsys, url: str, *flags: str) -> str:
    assert burnrate(["report", "--prometheus", url, "--start", str(START), "--end", str(END - 0.001),
                     "--period", "day", *flags]) == 0
    return capsys.readouterr().out


def analyze_totals(capsys, url: str, start: str, end: str) -> tuple[float, float]:
    """The jobs' cost `burnrate analyze` reports for the window, and the waste it finds beyond them."""
    assert burnrate(["analyze", "--prometheus", url, "--start", start, "--end", end]) == 0
    found = re.search(r"jobs' cost \$([\d,.]+),[\s\S]*? other capacity \$([\d,.]+)", capsys.readouterr().out)
    return float(found.group(1).replace(",", "")), float(found.group(2).replace(",", ""))


@pytest.mark.slow
def test_each_teams_day_is_its_true_spend_and_adds_up_to_what_analyze_reports(store, capsys):
    doc = json.loads(report(capsys, store, "--format", "json"))
    assert [p["period"] for p in doc["periods"]] == ["2025-12-19", "2025-12-20", "2025-12-21"]
    for day, period in enumerate(doc["periods"]):
        expected = truth(day)
        teams = {t["team"]: t for t in period["teams"]}
        assert set(teams) == set(expected), day
        for name, want in expected.items():
            got = teams[name]
            assert got["gpu_hours"] == pytest.approx(want["gpu_hours"], abs=1e-3), (day, name)
            assert got["spot_dollars"] == pytest.approx(want["spot"], abs=0.005), (day, name)
            assert got["on_demand_dollars"] == pytest.approx(want["on-demand"], abs=0.005), (day, name)
            assert got["dollars"] == pytest.approx(got["spot_dollars"] + got["on_demand_dollars"], abs=1e-9)
        # the teams' dollars add up, to the cent, to the jobs' cost `analyze` reports for the window
        jobs, beyond = analyze_totals(capsys, store, period["start"], period["end"])
        assert round(sum(t["dollars"] for t in period["teams"]), 2) == period["dollars"] == jobs
        assert period["beyond_jobs_waste_dollars"] == beyond
        assert not period["partial"]
    first, second, third = ({t["team"]: t for t in p["teams"]} for p in doc["periods"])
    # the idle notebook's whole day is waste; the training job has a goodput and a token cost
    assert sum(first["research"]["waste_dollars"].values()) == pytest.approx(first["research"]["dollars"], abs=0.01)
    assert first["research"]["dollars"] == pytest.approx(24 * RATE["on-demand"], abs=0.005)
    assert 0 < first["ml"]["goodput"] <= 1 and first["ml"]["cost_per_billion_tokens"] > 0
    # change against the day before: none on the first day, and none in % where it had nothing
    assert first["ml"]["change"]["dollars"] == {"previous": None, "absolute": None, "percent": None,
                                                "reason": "no previous period in the window"}
    change = second["ml"]["change"]["dollars"]
    assert change["absolute"] == pytest.approx(second["ml"]["dollars"] - first["ml"]["dollars"], abs=1e-6)
    assert change["percent"] == pytest.approx(100 * change["absolute"] / first["ml"]["dollars"], abs=0.01)
    assert second["data"]["change"]["dollars"]["percent"] is None
    assert second["data"]["change"]["dollars"]["reason"] == "nothing in the previous period"
    assert third["research"]["change"]["gpu_hours"]["percent"] == pytest.approx(0.0, abs=0.01)


@pytest.mark.slow
def test_by_label_groups_the_pods_by_their_kube_state_metrics_label(store, capsys):
    doc = json.loads(report(capsys, store, "--by", "label:team", "--format", "json"))
    assert doc["notes"] == []
    for day, period in enumerate(doc["periods"]):
        expected = truth(day, TEAM.get)
        teams = {t["team"]: t for t in period["teams"]}
        assert set(teams) == set(expected), day
        for name, want in expected.items():
            assert teams[name]["dollars"] == pytest.approx(want["spot"] + want["on-demand"], abs=0.01), (day, name)
    # a label no pod carries: every job is unlabelled, and the page says why in one line
    doc = json.loads(report(capsys, store, "--by", "label:cost-center", "--format", "json"))
    assert {t["team"] for p in doc["periods"] for t in p["teams"]} == {"(no label)"}
    assert len(doc["notes"]) == 1 and "label_cost_center" in doc["notes"][0]


@pytest.mark.slow
def test_csv_and_table_carry_the_json_figures(store, capsys):
    doc = json.loads(report(capsys, store, "--format", "json"))
    rows = report(capsys, store, "--format", "csv").splitlines()
    parsed = list(csv.DictReader(rows))
    assert [(r["period"], r["team"], float(r["dollars"])) for r in parsed] == \
        [(p["period"], t["team"], t["dollars"]) for p in doc["periods"] for t in p["teams"]]
    table = report(capsys, store)
    for period in doc["periods"]:
        assert f"{period['period']}" in table and f"${period['dollars']:,.2f}" in table


@pytest.mark.slow
def test_the_html_page_shows_the_json_figures_in_a_real_browser(store, capsys, tmp_path):
    pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.common.by import By
    from burnrate.dashboard.testing import chromium
    require("chromium"), require("chromedriver")
    page = tmp_path / "showback.html"
    doc = json.loads(report(capsys, store, "--format", "json", "--html", str(page)))
    text = page.read_text()
    assert "http://" not in text and "https://" not in text and "<script" not in text
    with chromium(str(tmp_path / "profile")) as driver:
        driver.get(page.as_uri())
        shown = {}
        for section in driver.find_elements(By.CSS_SELECTOR, "section.period"):
            period = section.get_attribute("data-period")
            for bar in section.find_elements(By.CSS_SELECTOR, "g.bar"):
                width = sum(float(r.get_attribute("width")) for r in bar.find_elements(By.TAG_NAME, "rect"))
                shown[(period, bar.get_attribute("data-team"))] = (float(bar.get_attribute("data-dollars")), width)
            for row in section.find_elements(By.CSS_SELECTOR, "tr.team"):
                cells = [c.text for c in row.find_elements(By.TAG_NAME, "td")]
                assert float(cells[2].replace(",", "")) == shown[(period, cells[0])][0]
        assert driver.get_log("browser") == []
    expected = {(p["period"], t["team"]): t["dollars"] for p in doc["periods"] for t in p["teams"]}
    assert {k: v[0] for k, v in shown.items()} == expected
    for period in doc["periods"]:     # bars drawn to scale: the largest team fills the width
        widths = {t["team"]: shown[(period["period"], t["team"])][1] for t in period["teams"]}
        top = max(period["teams"], key=lambda t: t["dollars"])
        for t in period["teams"]:
            assert widths[t["team"]] == pytest.approx(widths[top["team"]] * t["dollars"] / top["dollars"], abs=0.2)


def test_periods_are_calendar_months_iso_weeks_and_days_in_utc():
    jan1 = 1767225600.0          # 2026-01-01T00:00:00Z, a Thursday: ISO week 2026-W01 began on Monday 2025-12-29
    weeks = periods(Window(jan1 - 4 * DAY, jan1 + 5 * DAY), "week", now=jan1 + 30 * DAY)
    assert [p.name for p in weeks] == ["2025-W52", "2026-W01", "2026-W02"]
    assert weeks[1].window.start == jan1 - 3 * DAY and weeks[1].window.end == jan1 + 4 * DAY - 0.001
    assert weeks[0].partial == "the window starts within it" and weeks[1].partial is None
    assert weeks[2].partial == "the window ends within it"
    months = periods(Window(jan1 - DAY, jan1 + 40 * DAY), "month", now=jan1 + 40 * DAY - 60)
    assert [p.name for p in months] == ["2025-12", "2026-01", "2026-02"]
    assert months[2].partial == "the period is still running"


def test_the_cents_add_up_to_the_rounded_total():
    shares = [33.333, 33.333, 33.334, 0.4, 0.4]
    cents = apportion(shares, round(sum(shares)))
    assert sum(cents) == round(sum(shares)) == 101
    assert all(abs(c - s) < 1 for c, s in zip(cents, shares))
    assert math.isclose(sum(apportion([], 0)), 0)


@pytest.mark.parametrize("flags, message", [
    (["--by", "team"], "--by wants namespace or label:KEY (e.g. label:team), not 'team'"),
    (["--by", "label:team"], "--by label:team reads kube-state-metrics' kube_pod_labels from Prometheus; "
                             "a recording does not carry pod labels: use --by namespace, or --prometheus URL"),
    (["--end", "2026-01-01T00:00:00Z"], "--end needs --start"),
])
def test_a_mistake_is_one_line(flags, message, tmp_path, capsys):
    assert burnrate(["report", "--recording", str(tmp_path), *flags]) == 2
    assert capsys.readouterr().err == f"burnrate report: error: {message}\n"
