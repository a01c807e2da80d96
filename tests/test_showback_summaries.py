"""`burnrate report --summaries` (docs/showback.md, "Past the store's retention"): a real
Prometheus whose data begins about an hour ago, and the summaries the real keeper (`analyze
--serve --keep-summaries`) kept of a fleet that ran the day before. Days before the store
come from the summaries, the days it holds from the store, each run counted once."""
from __future__ import annotations

import json
import time

import pytest

from burnrate.analyzer.grid.frames import Window
from burnrate.analyzer.output.showback import exact, period_start
from burnrate.analyzer.output.showback_summaries import kept_jobs, kept_runs
from burnrate.analyzer.sources.summaries import append_summary, read_summaries
from burnrate.analyzer.sources.timeparse import format_time, parse_time
from burnrate.cli import main as burnrate
from burnrate.exporter.errors import UserError
from burnrate.simulator.simulate import Spec, simulate
from test_prometheus_source import backfill
from test_retention import serve_until
from tests.processes import prometheus

STEP = 15.0
DAY = 86400.0


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """An hour of a fleet ending two minutes ago (or, just after midnight UTC, ten minutes
    before it) in a Prometheus keeping 15 days, and the
    summaries kept of another fleet's hour the day before; the report's window starts two
    days before the store's."""
    tmp = tmp_path_factory.mktemp("showback-summaries")
    end = time.time() // STEP * STEP - 120
    # The store's hour lies within one UTC day, which the test reads as "today": just after
    # midnight, the hour before it.
    midnight = period_start(end, "day")
    end = end if end - 3600 - 300 >= midnight else midnight - 600
    spec = Spec(nodes=1, gpus_per_node=2, hours=1.0, step_s=STEP, seed=3, end=end)
    simulate(str(tmp / "rec"), spec)
    first, end = spec.start_end()
    today = period_start(first, "day")
    earlier = Spec(nodes=1, gpus_per_node=4, hours=1.0, step_s=STEP, seed=5, end=today - DAY + 12 * 3600)
    simulate(str(tmp / "earlier"), earlier)
    begin, finish = earlier.start_end()
    kept = tmp / "kept.jsonl"
    serve_until(str(tmp / "earlier"), ("--start", format_time(begin), "--end", format_time(finish + 3600)), kept)
    with prometheus(tmp, storage=backfill(tmp, str(tmp / "rec")),
                    extra_args=("--storage.tsdb.retention.time=15d",)) as prom:
        yield prom.url, kept, first, end, today


def report(capsys, url: str, start: float, end: float, *flags: str) -> dict:
    assert burnrate(["report", "--prometheus", url, "--start", format_time(start), "--end", format_time(end),
                     "--period", "day", "--format", "json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_old_days_come_from_the_summaries_and_the_stores_days_from_the_store(store, capsys, tmp_path):
    url, kept, first, end, today = store
    summaries = tmp_path / "summaries.jsonl"
    summaries.write_bytes(kept.read_bytes())
    earlier = read_summaries(str(summaries)).summaries
    assert earlier
    append_summary(str(summaries), earlier[0])           # the same run kept twice is one run
    # a store job's run, kept too (its summary ends in the store's span): the store counts it
    store_jobs = report(capsys, url, today, end)["periods"][0]["teams"]
    assert store_jobs
    ns = store_jobs[0]["team"]
    append_summary(str(summaries), {"namespace": ns, "training_job": "twice", "start": format_time(first - 600),
                                    "end": format_time(first + 1800), "gpu_hours": 100.0, "cost_dollars": 1000.0,
                                    "capacity_type": "on-demand"})
    # a run that ended today before the store's data begins
    before = first - (first - today) / 2
    append_summary(str(summaries), {"namespace": "early", "training_job": "a", "start": format_time(before - 600),
                                    "end": format_time(before), "gpu_hours": 2.5, "cost_dollars": 7.25,
                                    "capacity_type": "spot", "waste_dollars": {"idle_gpu": 1.5}})

    doc = report(capsys, url, today - 2 * DAY, end, "--summaries", str(summaries))
    empty, old, *held = doc["periods"]
    # a day before the store with no summaries says so, in one line
    assert empty["basis"] == "kept job summaries" and empty["teams"] == [] and len(empty["notes"]) == 1
    assert "no kept job summaries" in empty["notes"][0] and "before the store's data begins" in empty["notes"][0]

    # the day before: each team's dollars are its summaries' dollars, to the cent
    assert old["basis"] == "kept job summaries" and old["notes"] == []
    truth: dict[str, dict[str, float]] = {}
    for s in earlier:
        team = truth.setdefault(s["namespace"], {"dollars": 0.0, "gpu_hours": 0.0, "spot": 0.0})
        team["dollars"] += s["cost_dollars"]
        team["gpu_hours"] += s["gpu_hours"]
        team["spot"] += s["cost_dollars"] if s["capacity_type"] == "spot" else 0.0
    teams = {t["team"]: t for t in old["teams"]}
    assert set(teams) == set(truth)
    for name, want in truth.items():
        assert teams[name]["dollars"] == round(want["dollars"], 2), name
        assert teams[name]["gpu_hours"] == pytest.approx(want["gpu_hours"], abs=1e-3)
        assert teams[name]["spot_dollars"] == round(want["spot"], 2)
    assert old["dollars"] == round(sum(s["cost_dollars"] for s in earlier), 2)
    ledgered = [s for s in earlier if s["ledger"]]
    assert ledgered          # goodput: the productive GPU-hours over the ledgered jobs' GPU-hours
    for name in {s["namespace"] for s in ledgered}:
        mine = [s for s in ledgered if s["namespace"] == name]
        productive = sum(s["ledger"]["productive"]["gpu_hours"] for s in mine)
        assert teams[name]["goodput"] == pytest.approx(productive / sum(s["gpu_hours"] for s in mine), abs=1e-4)
    assert sum(t["jobs"] for t in old["teams"]) == len(earlier)

    # today: the part before the store from the summaries, the rest from the store, each once
    today_doc = held[0]
    assert today_doc["basis"] == "kept job summaries and store"
    (part_kept, part_store) = today_doc["parts"]
    assert part_kept["basis"] == "kept job summaries" and part_store["basis"] == "store"
    assert first - 4 * STEP <= parse_time(part_store["start"]) <= first     # to the step the store is read at
    assert parse_time(part_kept["end"]) < parse_time(part_store["start"])
    teams = {t["team"]: t for t in today_doc["teams"]}
    assert teams["early"]["dollars"] == 7.25 and teams["early"]["spot_dollars"] == 7.25
    assert teams["early"]["waste_dollars"] == {"idle_gpu": 1.5}
    for t in store_jobs:      # the store's figures, and not the kept run of the store's job again
        assert teams[t["team"]]["dollars"] == t["dollars"] and teams[t["team"]]["jobs"] == t["jobs"]
    assert today_doc["dollars"] == round(7.25 + sum(t["dollars"] for t in store_jobs), 2)
    assert "1 kept run(s) ending in the store's span are counted from the store, not from their summaries" \
        in today_doc["notes"]

    # the change against the day before crosses the two bases
    change = teams[ns]["change"]["dollars"]
    previous = {t["team"]: t for t in old["teams"]}.get(ns, {"dollars": 0.0})["dollars"]
    assert change["previous"] == pytest.approx(previous, abs=1e-4)
    assert change["absolute"] == pytest.approx(teams[ns]["dollars"] - previous, abs=1e-4)


@pytest.mark.slow
def test_without_summaries_every_period_is_the_stores(store, capsys):
    url, _, first, end, today = store
    doc = report(capsys, url, today, end)
    assert {p["basis"] for p in doc["periods"]} == {"store"}
    assert doc["periods"][0]["parts"] == [{"basis": "store", "start": doc["periods"][0]["start"],
                                           "end": doc["periods"][0]["end"]}]


@pytest.mark.slow
def test_the_table_and_csv_state_each_periods_basis(store, capsys):
    url, kept, first, end, today = store
    argv = ["report", "--prometheus", url, "--start", format_time(today - DAY), "--end", format_time(end),
            "--period", "day", "--summaries", str(kept)]
    assert burnrate(argv) == 0
    table = capsys.readouterr().out
    assert "basis: kept job summaries\n" in table
    assert "basis: kept job summaries (" in table and ") and store (" in table
    assert burnrate(argv + ["--format", "csv"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].startswith("period,start,end,partial,basis,team,")
    assert any(",kept job summaries," in r for r in rows[1:])


@pytest.mark.slow
def test_summaries_with_teams_by_label_is_one_line(store, capsys):
    url, kept, *_ = store
    assert burnrate(["report", "--prometheus", url, "--by", "label:team", "--summaries", str(kept)]) == 2
    assert capsys.readouterr().err == ("burnrate report: error: --by label:team with --summaries: kept job summaries "
                                       "carry no pod labels; use --by namespace\n")


def test_each_run_is_counted_once(tmp_path):
    path = str(tmp_path / "kept.jsonl")
    run = {"namespace": "ml", "training_job": "a", "start": "2026-11-01T00:00:00Z", "end": "2026-11-01T02:00:00Z",
           "cost_dollars": 10.0}
    again = {**run, "end": "2026-11-01T05:00:00Z", "cost_dollars": 25.0}      # the keeper summed both runs here
    later = {**run, "start": "2026-11-01T08:00:00Z", "end": "2026-11-01T09:00:00Z", "cost_dollars": 4.0}
    in_store = {**run, "training_job": "b", "end": "2026-11-02T01:00:00Z"}
    for summary in (run, run, again, later, in_store):
        append_summary(path, summary)
    kept = kept_runs(path, parse_time("2026-11-02T00:00:00Z"),
                     Window(parse_time("2026-10-01T00:00:00Z"), parse_time("2026-12-01T00:00:00Z")))
    assert kept.runs == [again, later] and kept.in_store == [in_store]
    assert [s["cost_dollars"] for s in kept.ended_in(Window(parse_time("2026-11-01T00:00:00Z"),
                                                            parse_time("2026-11-01T23:59:59.999Z")))] == [25.0, 4.0]


@pytest.mark.slow
def test_a_recording_begins_where_its_first_sample_is(tmp_path, capsys):
    spec = Spec(nodes=1, gpus_per_node=2, hours=1.0, step_s=STEP, seed=3, end=1795647600.0)
    simulate(str(tmp_path / "rec"), spec)
    first, end = spec.start_end()
    today = period_start(first, "day")
    path = str(tmp_path / "kept.jsonl")
    append_summary(path, {"namespace": "old", "training_job": "a", "start": format_time(today - DAY + 3600),
                          "end": format_time(today - DAY + 7200), "gpu_hours": 4.0, "cost_dollars": 11.11,
                          "capacity_type": "on-demand"})
    assert burnrate(["report", "--recording", str(tmp_path / "rec"), "--start", format_time(today - DAY),
                     "--end", format_time(end), "--period", "day", "--format", "json", "--summaries", path]) == 0
    old, held = json.loads(capsys.readouterr().out)["periods"]
    assert old["basis"] == "kept job summaries" and old["teams"][0]["dollars"] == 11.11
    assert held["basis"] == "kept job summaries and store"
    assert held["parts"][1]["start"] == exact(first) and held["dollars"] > 0


def test_a_summary_that_is_not_one_the_keeper_writes_is_one_line(tmp_path):
    path = str(tmp_path / "kept.jsonl")
    append_summary(path, {"namespace": "ml", "training_job": "a", "start": "2026-11-01T00:00:00Z",
                          "end": "2026-11-01T02:00:00Z", "gpu_hours": "many"})
    with pytest.raises(UserError) as error:
        kept_jobs(path, read_summaries(path).summaries)
    assert str(error.value) == (f"{path}: the summary of ml/a ending 2026-11-01T02:00:00Z is not one `burnrate analyze "
                                "--keep-summaries` writes (ValueError: could not convert string to float: 'many')")
