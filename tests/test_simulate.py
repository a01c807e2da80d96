"""`burnrate simulate`: deterministic, loadable, physically sane, with ground truth for every kind."""
import filecmp
import json
import os

import numpy as np
import pytest

from burnrate.exporter.recording import TABLES
from burnrate.simulator import fleet as F
from burnrate.analyzer.sources.recording_tables import load_table
from burnrate.simulator.simulate import Spec, add_arguments, run, simulate
from burnrate.analyzer.sources import RecordingSource
from burnrate.exporter.errors import UserError

END = 1_800_000_000.0
KINDS = {"dataloader_starvation", "idle_gpu", "unallocated_gpu", "straggler", "stalled", "diverging",
         "thermal_throttle", "gpu_error", "low_mfu", "held_after_exit"}
FIELDS = ["kind", "namespace", "training_job", "Hostname", "gpu", "pod", "rank", "start", "end"]


@pytest.fixture(scope="module")
def default_fleet(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("sim") / "fleet")
    truth = simulate(out, Spec(hours=2.0, end=END, seed=7))
    return out, truth


def files(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, names in os.walk(root) for f in names)


def test_same_seed_same_files(tmp_path):
    spec = Spec(nodes=2, gpus_per_node=8, hours=0.5, end=END, seed=11)
    simulate(str(tmp_path / "a"), spec)
    simulate(str(tmp_path / "b"), spec)
    assert files(tmp_path / "a") == files(tmp_path / "b")
    match, mismatch, errors = filecmp.cmpfiles(tmp_path / "a", tmp_path / "b", files(tmp_path / "a"), shallow=False)
    assert not mismatch and not errors
    simulate(str(tmp_path / "c"), Spec(nodes=2, gpus_per_node=8, hours=0.5, end=END, seed=12))
    assert not filecmp.cmp(tmp_path / "a" / "gpu" / "simulated" / "power_w.f4",
                           tmp_path / "c" / "gpu" / "simulated" / "power_w.f4", shallow=False)


def test_every_table_loads(default_fleet):
    out, _ = default_fleet
    samples = Spec(hours=2.0).samples
    for table in TABLES:
        assert len(load_table(out, table)) > 0, table
    gpu = load_table(out, "gpu")
    assert len(gpu) == 64 * samples and gpu["t"].max() == END
    assert gpu["modelName"].astype(str).str.endswith("(simulated)").all()
    frames = RecordingSource(out).frames()
    assert frames.simulated and frames.step_s == 15.0 and frames.missing == ()


def test_ground_truth_covers_every_kind(default_fleet):
    out, truth = default_fleet
    with open(os.path.join(out, "ground_truth.json")) as fh:
        assert json.load(fh) == truth
    assert {t["kind"] for t in truth} == KINDS
    assert all(list(t) == FIELDS for t in truth)
    rank = load_table(out, "rank")
    for t in truth:
        assert t["start"] <= t["end"]
        if t["pod"] is not None and t["rank"] is not None:
            mine = rank[(rank["pod"] == t["pod"]) & (rank["training_job"] == t["training_job"])]
            assert set(mine["rank"].astype(str)) == {str(t["rank"])}


def test_healthy_only_has_no_faults(tmp_path):
    truth = simulate(str(tmp_path), Spec(hours=0.5, end=END, seed=7, healthy_only=True))
    assert truth == []
    rank = load_table(str(tmp_path), "rank")
    assert np.isfinite(rank["loss"]).all() and np.isfinite(rank["grad_norm"]).all()
    gpu = load_table(str(tmp_path), "gpu")
    assert (gpu["up"] == 1).all() and (gpu["throttle_reasons"].astype(int) & 0x60 == 0).all()
    assert (gpu["training_job"].astype(str) != "").all()   # every GPU is held


def test_physically_sane(default_fleet):
    out, _ = default_fleet
    gpu = load_table(out, "gpu")
    live = gpu[gpu["up"] == 1]
    idle_w = np.where(live["modelName"].astype(str).str.startswith("NVIDIA A100"), 50.0, 70.0)
    tdp = np.where(idle_w == 50.0, 400.0, 700.0)
    assert ((live["power_w"] >= idle_w) & (live["power_w"] <= tdp)).all()
    assert live["gpu_util"].between(0, 100).all() and live["temp_c"].between(20, 95).all()
    assert (live["fb_used_mib"] + live["fb_free_mib"]).isin([81559, 40960]).all()
    # Counters never go backwards.
    for table, column, key in (("gpu", "energy_mj", "UUID"), ("rank", "steps", "pod"), ("rank", "flops", "pod")):
        frame = load_table(out, table)
        frame = frame[frame[column].notna()]
        assert (frame.groupby(key, observed=True)[column].diff().dropna() >= 0).all(), column
    lost = gpu[gpu["up"] == 0]
    assert len(lost) and lost["power_w"].isna().all() and (lost["last_xid"] == 79).all()


def test_faults_show_in_the_signals(default_fleet):
    out, truth = default_fleet
    gpu, rank = load_table(out, "gpu"), load_table(out, "rank")
    by_kind = {t["kind"]: t for t in truth}
    starving = rank[rank["training_job"] == by_kind["dataloader_starvation"]["training_job"]]
    last, first = starving.groupby("pod", observed=True).last(), starving.groupby("pod", observed=True).first()
    assert ((last["data_wait_s"] - first["data_wait_s"]) / (last["step_s"] - first["step_s"]) > 0.5).all()
    util = gpu[gpu["training_job"] == by_kind["dataloader_starvation"]["training_job"]]["gpu_util"]
    assert util.quantile(0.95) > 80 and util.quantile(0.05) < 10
    hot = gpu[(gpu["Hostname"] == by_kind["thermal_throttle"]["Hostname"])
              & (gpu["gpu"] == by_kind["thermal_throttle"]["gpu"])]
    throttled = hot[(hot["throttle_reasons"].astype(int) & 0x60) == 0x60]
    assert len(throttled) and (throttled["temp_c"] >= 87).all() and (throttled["sm_clock_mhz"] < 1500).all()
    straggler = by_kind["straggler"]
    job = rank[rank["training_job"] == straggler["training_job"]]
    compute = job.groupby("rank", observed=True)["compute_s"].agg(lambda s: s.iloc[-1] - s.iloc[0])
    assert compute.idxmax() == str(straggler["rank"]) and compute.max() > 1.3 * compute.median()
    diverging = rank[rank["training_job"] == by_kind["diverging"]["training_job"]]
    assert diverging["loss"].isna().any()


def test_realized_mfu_leaves_a_gap_around_any_floor(default_fleet):
    out, truth = default_fleet
    rank = load_table(out, "rank")
    mfu = rank.groupby("training_job", observed=True)["mfu"].mean()
    low = {t["training_job"] for t in truth if t["kind"] == "low_mfu"}
    assert set(mfu[mfu < F.LOW_MFU_BELOW].index) == low
    assert not mfu.between(F.LOW_MFU_BELOW, F.HEALTHY_MFU_ABOVE).any()


def test_fractional_share_present(default_fleet):
    out, _ = default_fleet
    alloc = load_table(out, "alloc")
    shared = alloc[alloc["share"] < 1]
    assert len(shared) and (shared.groupby(["t", "UUID"], observed=True)["share"].sum() == 1.0).all()
    gpu = load_table(out, "gpu")
    assert (gpu[gpu["UUID"].isin(shared["UUID"].unique())]["pod"].astype(str) == "").all()


def test_spot_and_on_demand_nodes(default_fleet):
    node = load_table(default_fleet[0], "node")
    assert set(node["capacity_type"]) == {"spot", "on-demand"}
    assert len(set(node["instance_type"])) >= 2


def parse(*argv):
    import argparse
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize("argv, message", [
    (["--nodes", "0"], "--nodes"),
    (["--gpus-per-node", "0"], "--gpus-per-node"),
    (["--step", "-1"], "--step"),
    (["--hours", "0"], "--hours"),
    (["--end", "yesterday"], "invalid time"),
])
def test_bad_arguments_are_user_errors(tmp_path, argv, message):
    with pytest.raises(UserError, match=message):
        run(parse("--out", str(tmp_path / "x"), *argv))


def test_unwritable_directory_is_a_user_error(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match="cannot write"):
        run(parse("--out", str(tmp_path / "file" / "fleet"), "--nodes", "1", "--hours", "0.1"))


def test_a_second_run_replaces_its_own_fleet_and_nothing_else(tmp_path, capsys):
    """Running the documented `burnrate simulate --out fleet` twice works; an agent's recording or a directory of
    other files is never written over."""
    out = tmp_path / "fleet"
    args = parse("--out", str(out), "--nodes", "1", "--hours", "0.1", "--end", "2027-01-15T08:00:00Z")
    assert run(args) == 0
    first = (out / "ground_truth.json").read_text()
    assert run(parse("--out", str(out), "--nodes", "1", "--hours", "0.1", "--end", "2027-01-15T09:00:00Z")) == 0
    assert "replacing the simulated fleet" in capsys.readouterr().err
    second = (out / "ground_truth.json").read_text()
    assert first != second and len(RecordingSource(str(out)).frames().gpu)
    (out / "ground_truth.json").unlink()          # now it looks like an agent's recording
    with pytest.raises(UserError, match="did not write"):
        run(args)
    other = tmp_path / "photos"
    other.mkdir()
    (other / "cat.jpg").write_bytes(b"\xff")
    with pytest.raises(UserError, match="other files"):
        run(parse("--out", str(other), "--nodes", "1", "--hours", "0.1"))
    assert (other / "cat.jpg").read_bytes() == b"\xff"

