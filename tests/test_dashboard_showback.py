"""The Cost page's showback (docs/dashboard.md, docs/showback.md) against `burnrate report`:
the same fleet of known spend in a real Prometheus (tests/test_showback.py), the same window;
the page's table holds the report's dollars per team and period, to the cent, and its change."""
from __future__ import annotations

import argparse
import json

import pytest

from burnrate.analyzer.options import add_source_arguments, source_options
from burnrate.analyzer.sources import RecordingSource
from burnrate.dashboard.app import create_app
from burnrate.dashboard.showback import Choice
from burnrate.dashboard.timerange import with_params
from burnrate.dashboard.ui import current_service
from burnrate.simulator.simulate import Spec, simulate
from tests.conftest import require
from tests.test_showback import END, START, report

WINDOW = f"?start={START!r}&end={END - 0.001!r}"


@pytest.fixture(scope="module")
def app(store):
    parser = argparse.ArgumentParser()
    add_source_arguments(parser, "")
    options = source_options(parser.parse_args(["--prometheus", store]))   # the store as `burnrate report` opens it
    return create_app(options.open(), options.catalog(), refresh_s=3600, config=options.detectors())


def page_rows(app, search: str) -> list[list[str]]:
    """The showback table's rows, as the Cost page's callback draws them for the URL's query."""
    from burnrate.dashboard.pages import cost
    from burnrate.dashboard.timerange import from_query
    from burnrate.dashboard.ui import current_service
    with app.server.app_context():
        service = current_service(search)
        service.analysis(from_query(search, service.default_range))   # the section follows the analysis
        section = cost.update_showback(search, None)
    assert isinstance(section, list), section
    body = section[0].children[1]
    return [[cell.children for cell in row.children] for row in body.children]


def expected_rows(doc: dict) -> list[tuple[str, str, str, str]]:
    """(period, team, dollars, change in dollars) of each team, as the report's JSON has them."""
    return [(p["period"], t["team"], f"{t['dollars']:,.2f}",
             "-" if t["change"]["dollars"]["absolute"] is None else f"{t['change']['dollars']['absolute']:+,.2f}")
            for p in doc["periods"] for t in p["teams"]]


@pytest.mark.slow
@pytest.mark.parametrize("by", ["namespace", "label:team"])
def test_the_showback_table_holds_the_reports_dollars_and_change(app, store, capsys, by):
    doc = json.loads(report(capsys, store, "--by", by, "--format", "json"))
    rows = page_rows(app, with_params(WINDOW, by=by, period="day"))
    assert [(r[0], r[1], r[3], r[9]) for r in rows] == expected_rows(doc)
    assert {r[0] for r in rows} == {"2025-12-19", "2025-12-20", "2025-12-21"}
    # the change column says what the report's change says: a day after a day, in % too
    second_ml = next(t for t in doc["periods"][1]["teams"] if t["team"] == ("ml" if by == "namespace" else "alpha"))
    shown = next(r for r in rows if r[0] == "2025-12-20" and r[1] == second_ml["team"])
    assert shown[10] == f"{second_ml['change']['dollars']['percent']:+.1f}%"
    # a period analysed once: the second render reads the cache, and draws the same rows
    with app.server.app_context():
        cached = len(current_service().periods._entries)
    assert cached == 3 and page_rows(app, with_params(WINDOW, by=by, period="day")) == rows


@pytest.mark.slow
def test_a_range_within_one_period_reuses_the_pages_analysis(app, store, capsys):
    doc = json.loads(report(capsys, store, "--format", "json", "--period", "month"))
    rows = page_rows(app, with_params(WINDOW, period="month"))
    assert [(r[0].split(" ")[0], r[1], r[3], r[9]) for r in rows] == expected_rows(doc)
    assert rows[0][0] == "2025-12 (partial: the window ends within it)"


@pytest.mark.slow
@pytest.mark.parametrize("query, message", [
    ("period=year", "period= wants month, week, day, not 'year'"),
    ("by=team", "teams are by namespace or label:KEY (e.g. label:team), not 'team'"),
])
def test_a_wrong_choice_in_the_url_is_one_line(app, query, message):
    from burnrate.dashboard.pages import cost
    with app.server.app_context():
        section = cost.update_showback(WINDOW + "&" + query, None)
    assert section.children == f"Showback: {message}"


def test_pod_labels_need_prometheus(tmp_path):
    from burnrate.dashboard.pages import cost
    simulate(str(tmp_path / "rec"), Spec(nodes=1, gpus_per_node=2, hours=0.25, step_s=15.0, seed=0,
                                         end=1_795_000_000.0))
    recorded = create_app(RecordingSource(str(tmp_path / "rec")), refresh_s=3600)
    with recorded.server.app_context():
        assert len(page_rows(recorded, "")) >= 1     # by namespace, a recording's teams show
        section = cost.update_showback("?by=label:team", None)
    assert section.children == ("Showback: label:team reads kube-state-metrics' kube_pod_labels from Prometheus; "
                                "a recording does not carry pod labels: group by namespace")


def test_the_choice_lives_in_the_url():
    assert Choice.from_query("?range=6h") == Choice("namespace", "day")
    assert Choice.of(" label:team ", "week").in_query("?range=6h") == "?range=6h&by=label%3Ateam&period=week"
    assert Choice.from_query("?by=label%3Ateam&period=week") == Choice("label:team", "week")
    assert Choice.of("namespace", "day").in_query("?range=6h&by=x&period=week") == "?range=6h"


@pytest.mark.slow
def test_the_browser_shows_the_reports_rows(app, store, capsys, tmp_path):
    pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.common.by import By
    from burnrate.dashboard.testing import chromium, screenshot, serve, table_rows, wait
    require("chromium"), require("chromedriver")
    doc = json.loads(report(capsys, store, "--by", "label:team", "--format", "json"))
    row_css = "#cost-showback-table tr.br-showback-row"
    with serve(app) as base, chromium(str(tmp_path / "profile")) as driver:
        driver.get(base + "/cost" + with_params(WINDOW, by="label:team"))
        rows = wait(driver, 60).until(lambda d: table_rows(d, row_css, ("data-period", "data-team")))
        assert [(r[0], r[1], r[3], r[9]) for r, _ in rows] == expected_rows(doc)
        assert [tuple(attributes) for _, attributes in rows] == [(r[0], r[1]) for r in expected_rows(doc)]
        screenshot(driver, "cost-showback")
        # the period chosen on the page goes into the URL, and the table follows it
        driver.find_element(By.ID, "cost-showback-period").click()
        wait(driver, 10).until(lambda d: d.find_element(
            By.XPATH, "//*[@role='option'][normalize-space()='month']")).click()
        wait(driver, 60).until(lambda d: "period=month" in d.current_url)
        wait(driver, 60).until(lambda d: [cells[0] for cells, _ in table_rows(d, row_css)][:1]
                               == ["2025-12 (partial: the window ends within it)"])
        assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []
