"""The shipped roll-ups evaluated over back-filled history by each engine's own tool:
Prometheus's (`promtool tsdb create-blocks-from rules`, which queries a running Prometheus and
writes the results as blocks) and VictoriaMetrics' (`vmalert -replay`, which writes them back
through remote write)."""
from __future__ import annotations

import datetime
import os
import json
import shutil
import subprocess
import urllib.parse
import urllib.request

import yaml

from tests.conftest import ROOT, require
from tests.processes import prometheus

RULES = os.path.join(ROOT, "manifests", "alerts", "burnrate-rules.yaml")
EVAL_S = 60.0   # the roll-up group's interval
# Evaluated past the data's end, so that the last 5-minute windows are all counted.
AFTER_S = 600.0


def rollup_rules(tmp_path, groups: tuple[str, ...] = ("burnrate-rollups",)) -> str:
    """The shipped groups named, their recording rules alone (the alerts need no back-filling)."""
    with open(RULES) as fh:
        shipped = yaml.safe_load(fh)["groups"]
    path = tmp_path / "rollups.yaml"
    path.write_text(yaml.safe_dump({"groups": [{**g, "rules": [r for r in g["rules"] if "record" in r]}
                                               for g in shipped if g["name"] in groups]}))
    return str(path)


def rfc3339(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def evaluate_in_prometheus(tmp_path, data: str, rules: str, start: float, end: float) -> None:
    """The roll-ups over the blocks in `data`, added to them as blocks of their own."""
    (tmp_path / "source").mkdir()
    with prometheus(tmp_path / "source", storage=data) as prom:
        # The rules file named by a path of its own, not the test's temporary one: a group's
        # evaluations are offset within the interval by a hash of its file's path and name, and
        # promtool drops an evaluation that falls in the last second before a 2-hour block's
        # end (the block's end truncated to whole seconds). Named so, the offset is the same in
        # every run and clear of that second.
        proc = subprocess.run([require("promtool"), "tsdb", "create-blocks-from", "rules",
                               f"--start={int(start)}", f"--end={int(end + AFTER_S)}", f"--url={prom.url}",
                               f"--output-dir={tmp_path / 'recorded'}", f"--eval-interval={int(EVAL_S)}s",
                               os.path.basename(rules)],
                              capture_output=True, text=True, timeout=300, cwd=os.path.dirname(rules))
        assert proc.returncode == 0, proc.stdout + proc.stderr
    for block in os.listdir(tmp_path / "recorded"):
        shutil.move(str(tmp_path / "recorded" / block), data)


def replay_in_victoria(tmp_path, url: str, rules: str, start: float, end: float, timeout_s: float = 300,
                       missed: tuple[tuple[float, int], ...] = ()) -> None:
    """The roll-ups over what VictoriaMetrics at `url` holds, written back into it by vmalert;
    `missed` as for `miss_evaluations`, by replaying the stretches between."""
    edges = [start] + [t for after, n in missed for t in (after, after + (n + 1) * EVAL_S)] + [end + AFTER_S]
    for part_start, part_end in zip(edges[::2], edges[1::2]):
        proc = subprocess.run([require("vmalert"), f"-rule={rules}", f"-datasource.url={url}",
                               f"-remoteWrite.url={url}", f"-replay.timeFrom={rfc3339(part_start)}",
                               f"-replay.timeTo={rfc3339(part_end)}", "-replay.disableProgressBar",
                               "-replay.rulesDelay=0s", f"-evaluationInterval={int(EVAL_S)}s",
                               # a range query's step, in replay; its default (5m) would skip evaluations
                               f"-datasource.queryStep={int(EVAL_S)}s",
                               "-httpListenAddr=127.0.0.1:0"],
                              capture_output=True, text=True, timeout=timeout_s, cwd=str(tmp_path))
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with urllib.request.urlopen(f"{url}/internal/force_flush", timeout=60) as resp:
        resp.read()


def miss_evaluations(url: str, stretches: tuple[tuple[float, int], ...]) -> None:
    """A ruler that missed evaluations, in the Prometheus at `url` (started with its admin
    API): from the first evaluation after each time, that many in a row are deleted from
    every roll-up."""
    for after, n in stretches:
        query = urllib.parse.urlencode({"query": "min(timestamp(cluster_hostname:burnrate_gpus_reporting:count))",
                                        "time": after + EVAL_S})
        with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=30) as resp:
            first = float(json.load(resp)["data"]["result"][0]["value"][1])
        form = urllib.parse.urlencode({"match[]": '{__name__=~"cluster_.+:.+"}', "start": first,
                                       "end": first + (n - 1) * EVAL_S}).encode()
        with urllib.request.urlopen(f"{url}/api/v1/admin/tsdb/delete_series", data=form, timeout=30) as resp:
            assert resp.status == 204, resp.status
