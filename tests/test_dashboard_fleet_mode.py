"""The dashboard over a store whose ruler keeps burnrate's roll-ups (tests/rollup_stores.py:
the shipped rules evaluated by promtool over back-filled history, in a real Prometheus): it
reads the store as `burnrate analyze` does with no flag, in fleet mode. Its findings and job
costs are fleet mode's, the fleet is drawn from every GPU at the display's step, a job's page
reads that job's nodes per GPU for its ledger, and a read that crosses the per-GPU path's point
bound no longer costs the pages their findings."""
from __future__ import annotations

import json

import pytest

from burnrate.analyzer.costing.pricing import load_catalog
from burnrate.cli import main as burnrate
from burnrate.analyzer.fleet.mode import analyze_fleet, costed_from_rollups
from burnrate.analyzer.output.report import to_document
from burnrate.analyzer.sources import PrometheusSource
from burnrate.analyzer.sources.promhttp import Limits
from burnrate.dashboard import aggregate
from burnrate.dashboard.data import DataService, Unavailable
from burnrate.dashboard.showback import Choice, period_analysis
from burnrate.dashboard.timerange import TimeRange
from burnrate.exporter.ledger import BADPUT
from tests.conftest import require
from tests.contract_fleet import backfill_prometheus
from tests.processes import prometheus
from tests.rollup_stores import evaluate_in_prometheus, rollup_rules
from tests.test_dashboard_showback import expected_rows
from tests.test_fleet_mode import END, START, WINDOW, hand_written

RANGE = TimeRange(start=WINDOW.start, end=WINDOW.end)
# The hand-written fleet's GPUs: ten agent nodes (one of four GPUs) and a dcgm-exporter node.
GPUS = 9 * 8 + 4 + 8
QUIET = {("ml", n) for n in ("pretrain", "finetune", "sweep", "spot-run", "before", "after", "beside")}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dashboard-fleet")
    rules = rollup_rules(tmp)
    data = backfill_prometheus(hand_written(), tmp)
    evaluate_in_prometheus(tmp, data, rules, START, END)
    with prometheus(tmp, storage=data, config=f"rule_files: [{rules!r}]\n") as prom:
        yield prom.url


def service_of(url: str, **kwargs) -> DataService:
    return DataService(PrometheusSource(url, min_step_s=15.0, **kwargs), load_catalog(), **{"ttl_s": 600.0})


def test_the_pages_read_a_store_with_roll_ups_as_analyze_does(store):
    a = service_of(store).analysis(RANGE)
    assert a.way.startswith("read the roll-ups (fleet mode): the store's ruler kept them over the window")
    fleet = analyze_fleet(PrometheusSource(store, min_step_s=15.0), WINDOW, load_catalog())
    ours, theirs = to_document(a.report), to_document(fleet)
    assert ours["jobs"] == theirs["jobs"] and ours["findings"] == theirs["findings"]
    assert {(j.namespace, j.training_job) for j in a.report.jobs if costed_from_rollups(j)} == QUIET
    # The fleet is drawn from every GPU at the display's step, not from the few read per GPU.
    assert len(a.fleet.gpu_labels) == GPUS and a.frames.step_s == a.overview.step > 15.0
    assert a.fleet.window_dollars == pytest.approx(a.overview.fleet.window_dollars)
    # Every job in the table has its dollars; a job costed from roll-ups has tokens/s over its held hours.
    table = a.jobs.set_index(["namespace", "training_job"])
    assert table["cost_dollars"].notna().all() and len(table) == len(a.report.jobs)
    pretrain = next(j for j in a.report.jobs if j.training_job == "pretrain")
    assert table.loc[("ml", "pretrain"), "tokens_per_s"] == pytest.approx(
        pretrain.tokens / (pretrain.gpu_hours / pretrain.gpus * 3600))


def test_a_jobs_page_reads_the_job_per_gpu_for_its_ledger(store):
    a = service_of(store).analysis(RANGE)
    rolled = next(j for j in a.report.jobs if (j.namespace, j.training_job) == ("ml", "pretrain"))
    assert rolled.ledger is None
    own = a.job(("ml", "pretrain"))
    assert own.way == "the job's 2 nodes read per GPU over its life"
    assert set(own.frames.gpu["Hostname"].astype(str)) == {"gpu-0", "gpu-1"}
    job = next(j for j in own.report.jobs if (j.namespace, j.training_job) == ("ml", "pretrain"))
    # The ledger adds up to the job's GPU-hours, which are the roll-ups' within a scrape at each edge.
    assert sum(h for h in job.ledger.gpu_hours.values() if h is not None) == pytest.approx(job.gpu_hours, rel=1e-6)
    assert job.gpu_hours == pytest.approx(rolled.gpu_hours, abs=2 * 16 * 60 / 3600)
    assert job.cost_dollars == pytest.approx(rolled.cost_dollars, rel=0.01)
    # The job's timeline is its own 16 GPUs, drawn over its life.
    detail = aggregate.job_detail(own.views, own.report, "ml", "pretrain")
    assert len(detail.gpu_labels) == 16
    # A job the window does not hold is said so, not read.
    assert a.job(("ml", "nonexistent")).jobs.query("training_job == 'nonexistent'").empty


def test_the_fleets_badput_is_drawn_on_the_overviews_steps(store):
    """The jobs read per GPU have ledgers on their parts' 15 s grids; the Cost page sums them
    into the overview's coarser steps, losing no GPU-second."""
    a = service_of(store).analysis(RANGE)
    timeline = aggregate.badput_timeline(a.report, a.views)
    jobs = [j for j in a.report.jobs if j.ledger is not None and j.ledger.timeline]
    assert timeline.jobs == len(jobs) > 0 and len(timeline.hours) == len(a.fleet.times)
    totals = {}
    for cause in BADPUT:
        totals[cause] = sum(float(j.ledger.timeline[cause].sum()) / 3600 * (j.ledger_dollars(1.0) if timeline.dollars
                                                                            else 1.0)
                            for j in jobs if cause in j.ledger.timeline)
        assert timeline.total(cause) == pytest.approx(totals[cause], rel=1e-5)
    assert max(totals.values()) > 0


def test_the_pages_say_what_the_roll_ups_leave_out(store):
    from burnrate.dashboard.app import create_app
    create_app(PrometheusSource(store, min_step_s=15.0))      # registers the pages
    from burnrate.dashboard.pages import cost, jobs
    a = service_of(store).analysis(RANGE)
    (hint,) = [p for p in cost.content(a, "") if getattr(p, "id", None) == "cost-ledger-basis"]
    assert hint.children.startswith(f"{len(QUIET)} training jobs were costed from roll-ups (fleet mode)")
    # Every job in the goodput chart has a ledger: the jobs costed from roll-ups are not counted as 0% goodput.
    ledgers = sum(j.ledger is not None and j.gpu_hours > 0 for j in a.report.jobs)
    assert aggregate.namespace_goodput(a.report)["jobs"].sum() == ledgers > 0
    (line, _) = jobs.content(a, "")
    assert f"tokens/s of the {len(QUIET)} jobs costed from roll-ups (fleet mode) is over the hours" in line.children


def test_the_first_paint_finds_the_datas_range_at_its_edges(store, monkeypatch):
    """Where the ruler counted reporting GPUs, the first paint asks where the data lies only
    around the count's ends, and reads the same window as a read without the hint."""
    from burnrate.analyzer.detectors import DetectorConfig
    from burnrate.dashboard import overview
    asked, real = [], PrometheusSource.query_range

    def spy(self, promql, start, end, step, tally=None):
        if promql.startswith("count(present_over_time(DCGM_FI_DEV_GPU_UTIL"):
            asked.append((start, end))
        return real(self, promql, start, end, step, tally)

    monkeypatch.setattr(PrometheusSource, "query_range", spy)
    early = overview.read(PrometheusSource(store, min_step_s=15.0), WINDOW, load_catalog(), DetectorConfig())
    hinted = list(asked)
    asked.clear()
    bare = PrometheusSource(store, min_step_s=15.0).frames(WINDOW, overview.COLUMNS, step=early.step)
    assert early.frames.window == bare.window and early.frames.gpu.equals(bare.gpu)
    # Without the hint, the whole window is asked (in buckets of steps, then around the ends).
    assert any(a < START + 900 and b > END - 900 for a, b in asked)
    # With it, around the data's two ends only: nothing of the hours between is read.
    assert hinted and all(b <= START + 900 or a >= END - 900 for a, b in hinted)


def test_teams_by_a_pod_label_are_read_per_gpu(store):
    service = service_of(store)
    a = service.analysis(RANGE)
    by_label = period_analysis(service, a, a.frames.window, "team", Choice(by="label:team", period="day"))
    assert by_label.overview is None and by_label.way == "read every GPU's series, as --by label:team asks"
    assert period_analysis(service, a, a.frames.window, None, Choice(by="namespace", period="day")) is a


def test_a_read_past_the_per_gpu_bound_keeps_its_findings_in_fleet_mode(store):
    """The per-GPU read of the window crosses the bound (as a day of 1,024 GPUs crosses
    100 M points); fleet mode reads less and gives the page its findings."""
    points = 500_000
    per_gpu = DataService(PrometheusSource(store, min_step_s=15.0, limits=Limits(points=points)), load_catalog(),
                          forced_by="--per-gpu")
    with pytest.raises(Unavailable, match="points"):
        per_gpu.analysis(RANGE)
    a = service_of(store, limits=Limits(points=points)).analysis(RANGE)
    assert a.report.findings and len(a.report.jobs) == len(QUIET) + 4


def test_a_jobs_read_past_the_bound_is_one_line_on_its_page(store):
    from burnrate.dashboard.app import create_app
    create_app(PrometheusSource(store, min_step_s=15.0))      # registers the pages
    from burnrate.dashboard.pages import job
    service = service_of(store)
    a = service.analysis(RANGE)
    service.source._http.limits = Limits(points=10_000)    # the job's own read, not the range's
    shown = job.content(a, "ml", "pretrain", "")
    (line,) = shown
    assert line.children.startswith("Cannot read ml/pretrain per GPU: Prometheus at ")
    assert "more than 10,000 points (--max-points)" in line.children


@pytest.mark.slow
def test_the_browser_shows_fleet_modes_findings_and_a_jobs_ledger(store, tmp_path, capsys):
    """What a user sees: the header says how the store was read, the Fleet page's findings are
    fleet mode's, and a job costed from roll-ups opens on its own ledger."""
    pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.common.by import By
    from burnrate.dashboard.app import create_app
    from burnrate.dashboard.testing import chromium, screenshot, serve, stat_cards, table_rows, wait, wait_drawn
    require("chromium"), require("chromedriver")
    search = f"?start={WINDOW.start!r}&end={WINDOW.end!r}"
    app = create_app(PrometheusSource(store, min_step_s=15.0), load_catalog(), refresh_s=3600)
    fleet = analyze_fleet(PrometheusSource(store, min_step_s=15.0), WINDOW, load_catalog())
    assert burnrate(["report", "--prometheus", store, "--start", repr(WINDOW.start), "--end", repr(WINDOW.end),
                     "--period", "day", "--format", "json"]) == 0
    reported = json.loads(capsys.readouterr().out)
    with serve(app) as base, chromium(str(tmp_path / "profile")) as driver:
        driver.get(base + "/" + search)
        # The header says how the range was read once its own callback polls after the analysis:
        # the findings table may be drawn a moment before it.
        wait(driver, 90).until(lambda d: d.find_elements(By.ID, "fleet-findings") and d.find_elements(By.ID, "app-way"))
        assert driver.find_element(By.ID, "app-way").text.startswith("read the roll-ups (fleet mode)")
        assert stat_cards(driver)["findings"][0] == str(len(fleet.findings))
        screenshot(driver, "fleet-mode-fleet")
        driver.get(base + "/job/ml/pretrain" + search)
        wait_drawn(driver, "#job-waterfall", timeout_s=90)
        assert not driver.find_elements(By.ID, "job-ledger-none")
        assert driver.find_element(By.ID, "job-way").text == ("This page: the job's 2 nodes read per GPU over its "
                                                              "life; the other pages' figures are fleet mode's.")
        cards = stat_cards(driver)
        pretrain = next(j for j in fleet.jobs if j.training_job == "pretrain")
        assert cards["GPUs"][0] == "16" and cards["goodput"][0].endswith("%")
        # Its own read's dollars, the roll-ups' within a scrape at each edge of its holding.
        assert float(cards["cost so far"][0].lstrip("$").replace(",", "")) == pytest.approx(pretrain.cost_dollars,
                                                                                            rel=0.01)
        screenshot(driver, "fleet-mode-job")
        driver.get(base + "/cost" + search)
        wait_drawn(driver, "#cost-badput", timeout_s=90)
        assert driver.find_element(By.ID, "cost-ledger-basis").text.startswith(
            f"{len(QUIET)} training jobs were costed from roll-ups (fleet mode)")
        # The showback's two days, each analysed as `burnrate report` analyses it (fleet mode where
        # the day's roll-ups cover it): the same rows, to the cent (the page marks a partial day).
        rows = wait(driver, 120).until(lambda d: table_rows(d, "#cost-showback-table tr.br-showback-row"))
        assert [(r[0].split(" ")[0], r[1], r[3], r[9]) for r, _ in rows] == expected_rows(reported)
        assert {r[1] for r, _ in rows} >= {"ml", "research", "inference"}
        screenshot(driver, "fleet-mode-cost")
        assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []
