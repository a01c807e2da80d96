"""The benchmark table of docs/benchmarks.md, derived from bench/RESULTS.md.

    python bench/readme_table.py     # rewrites the table in docs/benchmarks.md after RESULTS.md changed

Each row reads one figure from a table of RESULTS.md, found by the section's title, the
row's first cell and the column's header, so a figure that moves or is renamed fails
loudly here instead of going stale. tests/test_readme.py checks the page is current.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "RESULTS.md")
PAGE = os.path.join(ROOT, "docs", "benchmarks.md")
BEGIN = "<!-- benchmark table: generated from bench/RESULTS.md by bench/readme_table.py -->"
END = "<!-- end of benchmark table -->"


@dataclass(frozen=True)
class Section:
    command: str                        # the script and its arguments, from the section's heading
    rows: dict[str, dict[str, str]]     # first cell -> {column header: cell}


def sections(markdown: str) -> dict[str, Section]:
    """The first table of every `## Title: `command`` section."""
    out: dict[str, Section] = {}
    for block in re.split(r"^## ", markdown, flags=re.M)[1:]:
        heading, _, body = block.partition("\n")
        title, _, rest = heading.partition(":")
        command = re.search(r"`([^`]+)`", rest)
        table = [_cells(line) for line in _first_table(body.splitlines())]
        if command is None or len(table) < 3:
            continue
        header, rows = table[0], table[2:]   # table[1] is the |---| line
        out[title.strip()] = Section(command.group(1), {row[0]: dict(zip(header, row)) for row in rows})
    return out


def _first_table(lines: list[str]) -> list[str]:
    """The lines of the first table: from its first `|` line up to the first line that is not one."""
    start = next((i for i, line in enumerate(lines) if line.startswith("|")), len(lines))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[start:end]


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


class Missing(LookupError):
    """RESULTS.md no longer holds a figure the benchmark table summarizes."""


def _lookup(section: Section, row: str, column: str) -> str:
    try:
        return section.rows[row][column]
    except KeyError:
        raise Missing(f"no {column!r} in the row {row!r}") from None


def _number(text: str) -> float:
    return float(text.replace(",", "").rstrip("%"))


Figure = Callable[[Section], float]


def cell(row: str, column: str) -> Figure:
    return lambda section: _number(_lookup(section, row, column))


def share_of_step(row: str, cost_us: str, base: str, step_ms: str) -> Figure:
    """`row`'s cost in microseconds as a percent of `base`'s step in milliseconds."""
    return lambda section: 100 * (_number(_lookup(section, row, cost_us)) / 1000
                                  / _number(_lookup(section, base, step_ms)))


def ratio(row: str, column: str) -> Figure:
    """The ratio of a cell written `a / b = Nx`."""
    return lambda section: _number(_lookup(section, row, column).rpartition("=")[2].strip().rstrip("x"))


def largest(column: str) -> Figure:
    """The largest figure of the column; cells that are not one number (a range, a dash) are skipped."""
    def figure(section: Section) -> float:
        cells = [row[column].replace(",", "") for row in section.rows.values() if column in row]
        numbers = [float(c) for c in cells if re.fullmatch(r"\d+(\.\d+)?", c)]
        if not numbers:
            raise Missing(f"no number in the column {column!r}")
        return max(numbers)
    return figure


@dataclass(frozen=True)
class Row:
    measure: str
    section: str                        # the RESULTS.md section the figure is in
    figure: Figure
    unit: str
    target: float | None = None         # the project's target; lower is better
    higher_is_better: bool = False      # MFU: the target is a floor


ROWS = (
    Row("agent scrape p99, 64 ranks sending 10 messages/s, scraped every second", "Agent",
        cell("scrape p99 (ms)", "64 ranks x 10/s"), "ms", 5),
    Row("agent memory (RSS), same load", "Agent", cell("RSS (MB)", "64 ranks x 10/s"), "MB", 80),
    Row("agent memory growth after warm-up, job names changing every 20 s", "Agent soak",
        cell("RSS spread after warm-up (MiB)", "value"), "MiB", 2),
    Row("agent CPU, same load, scraped every 15 s as deployed", "Agent",
        cell("CPU (% of one core)", "64 ranks x 10/s, deployed scrape"), "% of a core", 0.5),
    Row("agent CPU, same load, scraped every second (upper bound)", "Agent",
        cell("CPU (% of one core)", "64 ranks x 10/s"), "% of a core", 1),
    Row("trainer monitor's cost per step, default cadence (7 ms CPU step)", "Monitor overhead",
        share_of_step("monitor, default", "monitor alone us/step", "plain", "median ms/step"), "%", 0.5),
    Row("trainer monitor's cost per step, a report every step (worst case)", "Monitor overhead",
        share_of_step("monitor, every step", "monitor alone us/step", "plain", "median ms/step"), "%", 0.5),
    Row("MFU, tiny model on CPU (the target, 45%, is for an H100)", "MFU", cell("tiny", "MFU"), "%"),
    Row("MFU, gpt2-124m, bf16, torch.compile, one H100", "GPU, H100",
        cell("MFU, gpt2-124m, bf16, torch.compile, batch 16 × 1024", "H100"), "%", 45, higher_is_better=True),
    Row("MFU, gpt2-350m, the same", "GPU, H100", cell("MFU, gpt2-350m, same", "H100"), "%", 45,
        higher_is_better=True),
    Row("trainer monitor's overhead, gpt2-124m on an H100, default cadence", "GPU, H100",
        cell("monitor overhead, default cadence, gpt2-124m (median of 30 blocks)", "H100"), "%", 0.5),
    Row("agent NVML collection per GPU, H100, idle", "GPU, H100",
        cell("agent collection per GPU, idle (ms)", "H100"), "ms"),
    Row("agent CPU on one H100, 64 ranks sending 10 messages/s, scraped every 15 s", "GPU, H100",
        cell("agent CPU, same, at 8375ddb (% of one core)", "H100"), "% of a core", 0.5),
    Row("agent memory (RSS) on one H100, same load", "GPU, H100",
        cell("agent RSS, same load, at 8375ddb: no `kubernetes` package in a pod (MB)", "H100"), "MB", 80),
    Row("MFU of the reference trainer (`burnrate train`), gpt2-124m, batch 16, one H200", "GPU, H200, the reference trainer",
        cell("MFU of the reference trainer, gpt2-124m, bf16, torch.compile, batch 16 × 1024", "H200"), "%", 45,
        higher_is_better=True),
    Row("MFU of the reference trainer, gpt2-124m, batch 32, one H200", "GPU, H200, the reference trainer",
        cell("MFU of the reference trainer, the same at batch 32 × 1024", "H200"), "%", 45, higher_is_better=True),
    Row("reference trainer on an H200, fed: compute plus data wait over the step time", "GPU, H200, the reference trainer",
        cell("compute plus data wait over the step time, fed, batch 16, the monitor now", "H200"), "%"),
    Row("reference trainer on an H200, starved by 50 ms a batch: data wait over the step time", "GPU, H200, the reference trainer",
        cell("data wait over the step time, starved by 50 ms a batch, the monitor now", "H200"), "%"),
    Row("analyze 1,024 GPUs x 7 days: time", "Analyzer", cell("1024", "total s"), "s", 10),
    Row("analyze 1,024 GPUs x 7 days: peak memory", "Analyzer", cell("1024", "peak RSS GB"), "GB", 2),
    Row("1,024 GPUs x 24 h from Prometheus, per-GPU path (past the default point bound): time",
        "1,024 GPUs × 24 h from Prometheus",
        cell("per-GPU (`--per-gpu --max-points 400000000`)", "total s"), "s", 15),
    Row("1,024 GPUs x 24 h from Prometheus, per-GPU path: peak memory", "1,024 GPUs × 24 h from Prometheus",
        cell("per-GPU (`--per-gpu --max-points 400000000`)", "peak RSS GB"), "GB", 2),
    Row("1,024 GPUs x 24 h from Prometheus, `analyze` with no flag (fleet mode, chosen): time",
        "1,024 GPUs × 24 h from Prometheus", cell("no flag (the store's roll-ups, chosen)", "total s"), "s"),
    Row("1,024 GPUs x 24 h from Prometheus, fleet mode: peak memory", "1,024 GPUs × 24 h from Prometheus",
        cell("fleet mode (`--fleet`)", "peak RSS GB"), "GB", 4),
    Row("1,024 GPUs x 24 h from Prometheus, fleet mode: time over the store's for GPU-hours alone",
        "1,024 GPUs × 24 h from Prometheus", ratio("fleet mode (`--fleet`)", "analyzer s / store s"), "x", 1.5),
    Row("128 GPUs x 24 h from Prometheus, per-GPU path: time over the store's for GPU-hours alone", "Store floor",
        ratio("per-GPU, 128 GPUs × 24 h", "analyzer s / store s = ratio"), "x", 2),
    Row("128 GPUs x 24 h from Prometheus, fleet mode: time over the store's for GPU-hours alone", "Store floor",
        ratio("fleet, 128 GPUs × 24 h", "analyzer s / store s = ratio"), "x", 1.5),
    Row("fleet mode, 1,024 GPUs x 7 days at 15 s on VictoriaMetrics: time", "Fleet mode",
        cell("fleet, 1024 GPUs × 7 d at 15 s", "total s"), "s", 10),
    Row("fleet mode, 1,024 GPUs x 7 days at 15 s on VictoriaMetrics: peak memory", "Fleet mode",
        cell("fleet, 1024 GPUs × 7 d at 15 s", "peak RSS GB"), "GB", 4),
    Row("fleet mode, 10,000 GPUs x 7 days of roll-ups: time", "Fleet mode",
        cell("fleet (roll-ups only), 10000 GPUs × 7 d", "total s"), "s", 30),
    Row("fleet mode, 10,000 GPUs x 7 days of roll-ups: peak memory", "Fleet mode",
        cell("fleet (roll-ups only), 10000 GPUs × 7 d", "peak RSS GB"), "GB", 4),
    Row("dashboard, 1,024 GPUs x 24 h from Prometheus, cold: Fleet page's first paint "
        "(median of 9 loads, 2.5 to 3.4 s)", "Dashboard in fleet mode",
        cell("first paint (5-minute read: heatmap, charts, cards), s", "54f3824, median of 9"), "s", 3),
    Row("dashboard, the same, every page cold (Fleet, Jobs, Cost, Findings, a job): the slowest page's first "
        "paint (median of 3 loads)", "Every page, cold", largest("first paint s, median"), "s", 3),
    Row("dashboard, the same: findings drawn (fleet mode)", "Dashboard in fleet mode",
        cell("findings drawn, s", "54f3824, median of 9"), "s"),
    Row("dashboard, slowest page once the analysis is cached", "Dashboard", largest("build s"), "s", 2),
)


def _format(value: float, unit: str) -> str:
    number = f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return number + unit if unit.startswith("%") else f"{number} {unit}"


def render(results: str) -> str:
    tables = sections(results)
    lines = ["| measure | result | target | met | measured by |", "|---|---:|---:|:---:|---|"]
    for row in ROWS:
        if row.section not in tables:
            raise Missing(f"bench/RESULTS.md has no table under '## {row.section}: `command`'")
        try:
            value = row.figure(tables[row.section])
        except Missing as exc:
            raise Missing(f"bench/RESULTS.md, '## {row.section}': {exc}") from None
        target = "–" if row.target is None else _format(row.target, row.unit)
        met = "–" if row.target is None else (
            "yes" if (value >= row.target if row.higher_is_better else value <= row.target) else "no")
        lines.append(f"| {row.measure} | {_format(value, row.unit)} | {target} | {met} | "
                     f"`{tables[row.section].command}` |")
    return "\n".join(lines) + "\n"


def between(text: str, begin: str, end: str) -> str:
    """What lies between the marker lines `begin` and `end`."""
    return text.split(begin + "\n", 1)[1].split(end, 1)[0]


def replace_between(text: str, begin: str, end: str, new: str) -> str:
    head, rest = text.split(begin + "\n", 1)
    return head + begin + "\n" + new + end + rest.split(end, 1)[1]


def main() -> None:
    with open(RESULTS, encoding="utf-8") as fh:
        table = render(fh.read())
    with open(PAGE, encoding="utf-8") as fh:
        page = fh.read()
    with open(PAGE, "w", encoding="utf-8") as fh:
        fh.write(replace_between(page, BEGIN, END, table))


if __name__ == "__main__":
    main()
