"""The exposition text: golden output, promtool's lint, DCGM compatibility."""
import os
import subprocess

from prometheus_client import CollectorRegistry

from burnrate.exporter import catalog
from burnrate.exporter.collector import SnapshotCollector
from burnrate.exporter.exposition import encode
from burnrate.exporter.render import Exposition
from tests.conftest import require
from tests.snapshots import fixed_snapshot

GOLDEN = os.path.join(os.path.dirname(__file__), "golden", "exposition.txt")


def render(snap) -> str:
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(lambda: snap))
    return Exposition(registry, version=lambda: snap).plain().decode()


def test_golden_exposition():
    text = render(fixed_snapshot())
    if os.environ.get("BURNRATE_UPDATE_GOLDEN"):
        with open(GOLDEN, "w") as fh:
            fh.write(text)
    with open(GOLDEN) as fh:
        assert text == fh.read(), "exposition changed; rerun with BURNRATE_UPDATE_GOLDEN=1 if intended"


def test_dcgm_counters_keep_their_bare_names():
    text = render(fixed_snapshot())
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n" in text
    assert "\nDCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{" in text
    assert "# TYPE burnrate_train_steps_total counter\n" in text
    assert "_total_total" not in text


def test_every_series_is_in_the_catalog():
    text = render(fixed_snapshot())
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    assert names <= catalog.sample_names()
    # everything a fully populated snapshot can show does show, but the fields a counters
    # file must ask for
    on_request = {m.sample_name for m in catalog.CATALOG if not m.default}
    assert on_request and not names & on_request
    assert catalog.sample_names() - names - on_request <= {"burnrate_node_cpu_utilization_ratio",
                                                         "burnrate_pod_cpu_seconds_total"}


def test_pod_labels_only_on_the_allocated_gpu():
    text = render(fixed_snapshot())
    util = [line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_GPU_UTIL{")]
    assert len(util) == 2
    assert 'training_job="llm"' in util[0] and 'pod="llm-worker-0"' in util[0]
    assert "training_job" not in util[1]


def test_absent_field_means_absent_series():
    snap = fixed_snapshot()
    gpu0 = snap.gpus[0]
    fields = {k: v for k, v in gpu0.fields.items() if k != "tensor_active"}
    stripped = snap.__class__(**{**snap.__dict__, "gpus": (gpu0.__class__(**{**gpu0.__dict__, "fields": fields}),
                                                           *snap.gpus[1:])})
    lines = [line for line in render(stripped).splitlines() if line.startswith("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{")]
    assert len(lines) == 1 and 'gpu="1"' in lines[0]


def test_nan_loss_is_kept():
    from prometheus_client.metrics_core import Metric
    family = Metric("burnrate_train_loss", "loss", "gauge")
    family.add_sample("burnrate_train_loss", {"rank": "0"}, float("nan"))
    assert b'burnrate_train_loss{rank="0"} NaN\n' in encode([family])


ALLOWED = ("label names should be written in 'snake_case' not 'camelCase'",)


def test_promtool_check_metrics():
    promtool = require("promtool")
    text = render(fixed_snapshot())
    proc = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    complaints = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    unexpected = [c for c in complaints
                  if not c.endswith(ALLOWED)
                  and not (c.startswith("DCGM_FI_") and (c.endswith('counter metrics should have "_total" suffix')
                                                         or c.endswith("should not include type 'counter'")))]
    assert unexpected == []
    # the two forced complaints are really the only kinds present
    assert any("camelCase" in c for c in complaints)


def test_metrics_doc_matches_the_catalog():
    from burnrate.exporter import docs
    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "docs", "metrics.md")
    with open(path) as fh:
        assert fh.read() == docs.render(), "regenerate with: python -m burnrate.exporter.docs > docs/metrics.md"


def test_label_values_are_escaped():
    from prometheus_client.metrics_core import Metric
    family = Metric("burnrate_train_loss", "loss", "gauge")
    family.add_sample("burnrate_train_loss", {"training_job": 'a"b\\c\nd'}, 1.0)
    assert encode([family]).decode().splitlines()[-1] == 'burnrate_train_loss{training_job="a\\"b\\\\c\\nd"} 1'


def test_label_sets_freed_between_families_are_not_mixed_up():
    # The encoder remembers rendered label sets by id(); a collector that makes a fresh dict
    # per family and drops it must still get its own labels (CPython reuses freed addresses).
    from prometheus_client.metrics_core import Metric

    def families():
        for i in range(50):
            family = Metric(f"m{i}", "help", "gauge")
            family.add_sample(f"m{i}", {"i": str(i)}, float(i))
            yield family

    text = encode(families()).decode()
    for i in range(50):
        assert f'm{i}{{i="{i}"}} {i}\n' in text
