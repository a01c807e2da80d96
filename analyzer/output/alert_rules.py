"""The alerts that mirror the detectors, rendered from a DetectorConfig: the `burnrate-training`
and `burnrate-gpu` groups of manifests/alerts/burnrate-rules.yaml. Each threshold, window and
duration is the detector's own field, so an alert fires where `burnrate analyze` finds the same
problem; tests/test_rule_thresholds.py fails while the shipped file holds other groups than the
defaults render. `burnrate rules` writes them (docs/thresholds.md).

Every group is evaluated each minute: a `for:` of N minutes is N + 1 evaluations in a row.
"""
from __future__ import annotations

from burnrate.exporter import rules_yaml as Y
from burnrate.exporter.telemetry import KEEPALIVE_S

from ..costing import budgets as B
from ..detectors import DetectorConfig
from ..detectors.gpu_error import CRITICAL_XIDS

TRAINING, GPU = "burnrate-training", "burnrate-gpu"
SOURCE = "analyzer/output/alert_rules.py from the detectors' thresholds (`burnrate rules`)"
# The workload's namespace (and pod, container) where the exported-labels profile put them.
NS = '"namespace", "$1", "exported_namespace", "(.+)"'
POD = '"pod", "$1", "exported_pod", "(.+)"'
# A living process is heard at least every KEEPALIVE_S (its monitor's keep-alives), and the
# agent's time of it reaches the store within a scrape: a job none of whose ranks was heard for
# two minutes has no process, at any scrape interval up to a minute.
UNHEARD_S = 120
_WORDS = {3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine", 10: "ten"}


def _m(minutes: float) -> str:
    return Y.duration(60 * minutes)


def _pct(share: float) -> str:
    return f"{round(100 * share, 6):g}%"


def _times(ratio: float, words: bool = False) -> str:
    """2 -> twice; 10 -> 10 times (ten times in words)."""
    if ratio == 2:
        return "twice"
    return f"{_WORDS[int(ratio)] if words and ratio in _WORDS else f'{ratio:g}'} times"


def _for(minutes: float) -> dict:
    return {"for": _m(minutes)} if minutes > 0 else {}


def _alert(name: str, expr: str, for_minutes: float, labels: dict, summary: str, description: str) -> dict:
    return {"alert": name, "expr": expr, **_for(for_minutes), "labels": labels,
            "annotations": {"summary": summary, "description": description,
                            "runbook_url": f"docs/runbooks.md#{name.lower()}"}}


def training(config: DetectorConfig) -> list[tuple[str, dict]]:
    stalled, diverging, starving, straggler = (config.stalled, config.diverging, config.dataloader_starvation,
                                               config.straggler)
    factor, floor_s = f"{stalled.interval_factor:g}", f"{stalled.floor_minutes * 60:g}"
    last_step = (f"max by (namespace, training_job) (label_replace(max_over_time("
                 f"burnrate_train_last_step_timestamp_seconds[6h]), {NS}))")
    unheard = (f"time() - max by (namespace, training_job) (label_replace(max_over_time("
               f"burnrate_train_last_report_timestamp_seconds[6h]), {NS}))")
    held = f"sum by (namespace, training_job) (label_replace(burnrate_gpu_allocated, {NS})) > 0"
    # In seconds, as the floor is above: the chart's trainingStalledFloor shortens both.
    apart = "".join(f"\nunless on (namespace, training_job)\nsum by (namespace, training_job) (label_replace("
                    f"increase(burnrate_train_{name}_seconds_total[{floor_s}s]), {NS})) > 0"
                    for name in ("checkpoint", "eval"))
    out = [(f"No step for max({factor} usual step times, {stalled.floor_minutes:g} min) while the job still holds "
            "GPUs and its process lives. max_over_time keeps a hung job's last step time visible after the agent "
            f"forgets its silent ranks; without steps in the last hour the {stalled.floor_minutes:g}-minute floor "
            f"applies. A job no agent has heard for {UNHEARD_S} s has no process (keep-alives come every "
            f"{KEEPALIVE_S:g} s): its GPUs held after are TrainingHeldAfterExit's. A save or an evaluation is no "
            f"stall: none is paged while one went on in the last {stalled.floor_minutes:g} min (the monitor tells of "
            "one under way as it goes); nor is a process that started after the job's last step (a restart starting "
            "up, heard from its monitor's creation on).", _alert(
        "TrainingStalled",
        f"(\n  time()\n  - {last_step}\n)\n"
        f"> on (namespace, training_job)\n"
        f"(\n  clamp_min(\n    {factor} * (\n"
        f"      sum by (namespace, training_job) (label_replace(rate(burnrate_train_step_seconds_total[1h]), {NS}))\n"
        f"      / sum by (namespace, training_job) (label_replace(rate(burnrate_train_steps_total[1h]), {NS}))\n"
        f"      > 0\n    ),\n    {floor_s}\n  )\n"
        f"  or on (namespace, training_job)\n  0 * {last_step} + {floor_s}\n)\n"
        f"and on (namespace, training_job)\n{held}\n"
        f"unless on (namespace, training_job)\n({unheard}) > {UNHEARD_S}{apart}\n"
        f"unless on (namespace, training_job)\n(max by (namespace, training_job) (label_replace("
        f"burnrate_train_start_timestamp_seconds, {NS})) > on (namespace, training_job) {last_step})",
        1, {"severity": "critical"},
        "Training job {{ $labels.namespace }}/{{ $labels.training_job }} has made no step for "
        "{{ $value | humanizeDuration }}.",
        f"No rank has completed an optimizer step for longer than max({factor} usual step times, "
        f"{Y.spelled(_m(stalled.floor_minutes))}) while the job's process lives and holds its GPUs, and no "
        f"checkpoint save or evaluation went on in the last {Y.spelled(_m(stalled.floor_minutes))}. A hung "
        "collective, a dead rank or a wedged data pipeline; every minute of it is paid for."))]
    after_s = f"{config.ledger.held_after_exit_minutes * 60:g}"
    out.append((f"GPUs a training job holds {config.ledger.held_after_exit_minutes:g} min after the agent last "
                "heard any of its ranks: the process ended or died and its pods kept the GPUs.", _alert(
        "TrainingHeldAfterExit",
        f"({unheard}) > {after_s}\nand on (namespace, training_job)\n{held}",
        1, {"severity": "critical"},
        "Training job {{ $labels.namespace }}/{{ $labels.training_job }} holds GPUs with no process: none of "
        "its ranks heard for {{ $value | humanizeDuration }}.",
        f"No rank of the job has reported, keep-alives included, for over "
        f"{Y.spelled(_m(config.ledger.held_after_exit_minutes))} while its pods still hold GPUs: the trainer "
        "ended or died and nothing released them. Delete the finished pods or have the job clean them up; every "
        "minute of it is paid for.")))
    out.append(("A NaN or infinite loss or gradient norm: every later step is wasted. `x != x` holds only for NaN.",
                _alert("TrainingDiverging",
                       "count by (namespace, training_job) (label_replace(\n"
                       "  burnrate_train_loss != burnrate_train_loss\n  or abs(burnrate_train_loss) == Inf\n"
                       "  or burnrate_train_grad_norm != burnrate_train_grad_norm\n"
                       f"  or abs(burnrate_train_grad_norm) == Inf,\n  {NS}\n)) > 0",
                       0, {"severity": "critical", "signal": "non_finite"},
                       "Training job {{ $labels.namespace }}/{{ $labels.training_job }} reports a non-finite loss "
                       "or gradient norm on {{ $value }} rank(s).",
                       "The loss or the gradient norm is NaN or infinite; the run cannot recover by itself and "
                       "every further step burns GPU time.")))
    history = _m(diverging.history_minutes)
    for metric, what, ratio, reports, signal, why in (
            ("burnrate_train_loss", "loss", diverging.loss_ratio, diverging.loss_reports, "loss_spike",
             f"The job's median loss at {_times(diverging.loss_ratio)} its mean of the {Y.spelled(history)} before. "
             "The mean ends 5 minutes ago, so a blow-up does not raise its own baseline before it can fire; `for` "
             f"asks for {diverging.loss_reports} evaluations in a row, so one bad batch does not. `> -Inf < Inf` "
             "keeps finite values only (NaN fails every comparison)."),
            ("burnrate_train_grad_norm", "gradient norm", diverging.grad_ratio, diverging.grad_reports,
             "grad_norm_spike", "Clipped training runs near its clip value; "
             f"{_times(diverging.grad_ratio)} its recent level is instability that usually precedes a loss blow-up.")):
        out.append((why, _alert(
            "TrainingDiverging",
            f"quantile by (namespace, training_job) (0.5, label_replace({metric} > -Inf < Inf, {NS}))\n"
            f">= on (namespace, training_job)\n"
            f"{ratio:g} * quantile by (namespace, training_job) (0.5,\n"
            f"  label_replace(avg_over_time({metric}[{history}] offset 5m) > 0, {NS})\n)",
            reports - 1, {"severity": "warning", "signal": signal},
            f"Training job {{{{ $labels.namespace }}}}/{{{{ $labels.training_job }}}} {what} is at "
            f'{{{{ $value | printf "%.3g" }}}}, {_times(ratio, words=True)} its recent mean.',
            f"The median {what} across ranks has been at least {_times(ratio)} its mean over the "
            f"{Y.spelled(history)} before the last 5, for {reports} evaluations in a row.")))
    window = _m(starving.window_minutes)
    for i, (share, severity) in enumerate(((starving.warning_share, "warning"),
                                           (starving.critical_share, "critical"))):
        why = (f"Share of step time spent waiting for the next batch, over windows of {Y.spelled(window)}, for "
               f"{Y.spelled(_m(starving.min_minutes))}: worth fixing from {_pct(starving.warning_share)}, severe "
               f"from {_pct(starving.critical_share)}." if i == 0 else "")
        out.append((why, _alert(
            "DataLoaderStarvation",
            f"sum by (namespace, training_job) (label_replace(rate(burnrate_train_data_wait_seconds_total[{window}]), "
            f"{NS}))\n/ sum by (namespace, training_job) (label_replace(rate(burnrate_train_step_seconds_total"
            f"[{window}]), {NS}))\n>= {share:g}",
            starving.min_minutes, {"severity": severity},
            "Training job {{ $labels.namespace }}/{{ $labels.training_job }} waits for data "
            "{{ $value | humanizePercentage }} of its step time.",
            "The GPUs sit idle while the DataLoader produces the next batch. More loader workers, pinned memory, "
            "pre-tokenized data or faster storage buy this time back.")))
    block = _m(straggler.block_minutes)
    per_step = (f"rate(burnrate_train_compute_seconds_total[{block}]) / "
                f"(rate(burnrate_train_steps_total[{block}]) > 0)")
    for i, (slowdown, severity) in enumerate(((straggler.slowdown, "warning"),
                                              (straggler.critical_slowdown, "critical"))):
        why = (f"A rank whose own compute per step is {_pct(straggler.slowdown - 1)} above the job's median for "
               f"{Y.spelled(_m(straggler.min_minutes))} ({_pct(straggler.critical_slowdown - 1)}: critical). Wall "
               "step times are equal under all-reduce; compute is what differs." if i == 0 else "")
        out.append((why, _alert(
            "StragglerRank",
            f"label_replace(label_replace(label_replace(\n  {per_step},\n"
            f'  {NS}), {POD}), "container", "", "container", ".*")\n'
            f">= on (namespace, training_job) group_left ()\n"
            f"{slowdown:g} * quantile by (namespace, training_job) (0.5, label_replace(\n"
            f"  {per_step},\n  {NS}\n))",
            straggler.min_minutes, {"severity": severity},
            "Rank {{ $labels.rank }} ({{ $labels.pod }} on {{ $labels.Hostname }}) holds back "
            "{{ $labels.namespace }}/{{ $labels.training_job }}.",
            f"This rank's compute takes at least {_pct(slowdown - 1)} longer per step than the job's median rank, "
            "and every other rank waits for it in each all-reduce.")))
    return [(why, Y.read_back(rule)) for why, rule in out]


def gpu(config: DetectorConfig) -> list[tuple[str, dict]]:
    idle, thermal = config.idle_gpu, config.thermal_throttle
    gap, warning_for = _m(idle.gap_minutes), _m(idle.min_minutes)
    critical_for = _m(idle.critical_hours * 60)
    out = []
    for i, (after, severity, why_not) in enumerate((
            (warning_for, "warning", "Nobody else can use it until the pod releases it."),
            (critical_for, "critical", "A forgotten allocation, not a pause."))):
        why = (f"At most {idle.util_max_pct:g}% utilization for {Y.spelled(warning_for)} ({Y.spelled(critical_for)}: "
               f"critical) on a GPU a pod holds. min_over_time: a busy blip shorter than {Y.spelled(gap)} does not "
               "restart the clock." if i == 0 else "")
        out.append((why, _alert(
            "GPUIdleWhileAllocated",
            f"label_replace(label_replace(label_replace(\n"
            f"  min_over_time(DCGM_FI_DEV_GPU_UTIL[{gap}]) <= {idle.util_max_pct:g},\n"
            f'  {NS}), {POD}), "container", "$1", "exported_container", "(.+)")\n'
            f"and on (UUID)\nburnrate_gpu_allocated > 0",
            (idle.min_minutes if severity == "warning" else idle.critical_hours * 60), {"severity": severity},
            "GPU {{ $labels.gpu }} on {{ $labels.Hostname }} is allocated to {{ $labels.namespace }}/{{ $labels.pod }} "
            "and idle.",
            f"The GPU has been at or below {idle.util_max_pct:g}% utilization for {Y.spelled(after)} while a pod holds "
            f"it. {why_not}")))
    for i, (ratio, severity) in enumerate(((thermal.clock_ratio, "warning"), (thermal.critical_ratio, "critical"))):
        why = ("Thermal clocks-event reasons set (software 0x20 or hardware 0x40: bits 5 and 6, which PromQL reads "
               f"as floor(x / 32) % 4) with the SM clock below {_pct(thermal.clock_ratio)} of the usual peak of that "
               f"GPU model ({_pct(thermal.critical_ratio)}: critical), for {Y.spelled(_m(thermal.min_minutes))}. The "
               "usual peak is the median over GPUs of the model of each one's highest clock in the last 6 hours."
               if i == 0 else "")
        out.append((why, _alert(
            "GPUThermalThrottling",
            f"DCGM_FI_DEV_SM_CLOCK\n< on (modelName) group_left ()\n"
            f"  {ratio:g} * quantile by (modelName) (0.5, max by (UUID, modelName) "
            f"(max_over_time(DCGM_FI_DEV_SM_CLOCK[6h])))\n"
            f"and on (UUID)\nfloor(DCGM_FI_DEV_CLOCK_THROTTLE_REASONS / 32) % 4 > 0",
            thermal.min_minutes, {"severity": severity},
            "GPU {{ $labels.gpu }} on {{ $labels.Hostname }} is throttling for heat at {{ $value }} MHz.",
            f"The driver reports thermal slowdown and the SM clock is below {_pct(ratio)} of this GPU model's usual "
            "peak. Everything running on it, and every rank that waits for it, runs slower.")))
    codes = "|".join(str(code) for code in sorted(CRITICAL_XIDS))
    for i, (match, severity, description) in enumerate((
            ("=~", "critical", "XID {{ $labels.xid }} means the GPU, its memory or its links need service. The job "
                               "on it has most likely failed or will."),
            ("!~", "warning", "The driver reported XID {{ $labels.xid }}. Codes such as 13, 31 and 43 usually point "
                              "at the application; repeated events on one GPU point at the GPU."))):
        why = ("A new XID event in the last 5 minutes. The agent starts a code's series at its first event, which "
               "increase() cannot see (it needs two samples), so a series that did not exist 5 minutes earlier "
               "counts too, provided the agent was scraped then (otherwise an agent coming back from a scrape "
               "outage would look like new events). Codes that mean the GPU, its memory or its links need service "
               "(the gpu_error detector's CRITICAL_XIDS) are critical; the others can be caused by the application."
               if i == 0 else "")
        xid = f'burnrate_gpu_xid_errors_total{{xid{match}"{codes}"}}'
        out.append((why, _alert(
            "GPUXidError",
            f"increase({xid}[5m]) > 0\nor\n(\n  ({xid} unless {xid} offset 5m)\n"
            "  and on (instance) (up offset 5m == 1)\n)",
            0, {"severity": severity},
            "GPU {{ $labels.gpu }} on {{ $labels.Hostname }} reported XID {{ $labels.xid }}.", description)))
    out.append(("", _alert(
        "GPULost", "burnrate_gpu_up == 0", 1, {"severity": "critical"},
        "GPU {{ $labels.gpu }} ({{ $labels.UUID }}) on {{ $labels.Hostname }} no longer answers NVML.",
        "NVML calls for this GPU fail or hang; it has fallen off the bus or the driver lost it. Whatever ran on it "
        "has stopped making progress.")))
    return [(why, Y.read_back(rule)) for why, rule in out]


GROUPS = {TRAINING: training, GPU: gpu}


def group(name: str, config: DetectorConfig = DetectorConfig()) -> dict:
    return Y.group(name, GROUPS[name](config))


def render(name: str, config: DetectorConfig = DetectorConfig()) -> str:
    """Group `name` as an item of a rules file's `groups:`, between its markers."""
    return Y.render(name, SOURCE, "", GROUPS[name](config))


BUDGETS = "burnrate-budgets"
BUDGETS_SOURCE = "analyzer/output/alert_rules.py (`burnrate rules`)"
FORECAST_FOR_MINUTES = 60


def budgets() -> list[tuple[str, dict]]:
    """The alerts on the gauges `burnrate analyze --serve --budgets` exports (docs/budgets.md)."""
    on = f"on ({', '.join(B.GAUGE_LABELS)})"
    exceeded = f"{B.SPENT}\n> {on}\n{B.BUDGET}"
    nested = exceeded.replace("\n", "\n  ")
    team = "Team {{ $labels.team }} ({{ $labels.team_by }})"
    out = [("The spend to date in the period is over the team's budget. Spend only grows within a period, so "
            "there is nothing to wait for.", _alert(
                "BudgetExceeded", exceeded, 0, {"severity": "critical"},
                f"{team} has spent {{{{ $value | humanize }}}} dollars this {{{{ $labels.period }}}}, over its "
                "budget.",
                "The team's GPU spend since the start of the period is over its budget; every further GPU-hour "
                "adds to the overrun until the period ends.")),
           (f"The expected forecast to the end of the period (spend to date + time left × burn rate) over "
            f"the budget for {Y.spelled(_m(FORECAST_FOR_MINUTES))}, so that a burst does not fire it; once "
            "the spend itself is over, BudgetExceeded takes over.", _alert(
                "BudgetForecastOverrun", f"{B.FORECAST}\n> {on}\n{B.BUDGET}\nunless {on}\n(\n  {nested}\n)",
                FORECAST_FOR_MINUTES, {"severity": "warning"},
                f"{team} is forecast to spend {{{{ $value | humanize }}}} dollars this {{{{ $labels.period }}}}, "
                "over its budget.",
                "At the burn rate of the period so far, the team's GPU spend will pass its budget before the "
                "period ends; burnrate_budget_forecast_low_dollars and _high_dollars bound the forecast."))]
    return [(why, Y.read_back(rule)) for why, rule in out]


def render_budgets() -> str:
    return Y.render(BUDGETS, BUDGETS_SOURCE, "", budgets())
