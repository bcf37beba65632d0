"""bench/run --smoke: the bench runs and prints every figure (CI checks no timing: the machine is shared)."""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

pytestmark = [
    pytest.mark.bench,
    pytest.mark.skipif(os.geteuid() != 0, reason="bench/run runs the hooks, which need root"),
]

REPO = Path(__file__).resolve().parent.parent
LINE = re.compile(r"^(\S+) (-?[\d.e+]+|nan|inf) (\S+) (\S+)( MISSED)?$")
NODELIST = [
    f"nodelist.{w}.{op}.{who}"
    for w in ("range10k", "frag10k", "range65536", "two100k")
    for op in ("expand", "fold")
    for who in ("imexctl", "hostlist_over_imexctl", "clustershell_over_imexctl")
]
FIGURES = [
    "startup.floor",
    *(f"startup.{h}.{k}" for h in ("version", "prolog_skipped", "epilog_idle") for k in ("over_floor", "ratio")),
    "crowd.epilog_idle.peak_rss",
    "crowd.epilog_idle.over_floor",
    *NODELIST,
    "nodelist.scontrol_checked",
    *(
        name
        for n in (2, 4)
        for name in (
            f"readiness.{n}trays.p50",
            f"readiness.{n}trays.p95",
            f"detection.{n}trays.lag_p50",
            f"detection.{n}trays.lag_p95",
            *(f"cpu.{hook}.{n}trays.{p}" for hook in ("prolog", "epilog") for p in ("p50", "p95")),
        )
    ),
    "rack.18trays.overhead",
    "rack.18trays.ctl_per_tray_s",
    "rack.18trays.tcp_per_tray_s",
    "readiness.18trays.p50",
    "readiness.18trays.p95",
    "epilog.running_domain.excl_shutdown",
    "memory.prolog_peak_rss",
    "drift.4trays.4cycles.last_over_first",
    "drift.4trays.leaks",
    *(f"health.idle.{k}" for k in ("wall_p50", "wall_p95", "cpu_p50", "cpu_p95", "slurmctld_queries")),
]
GROWTH_KINDS = ("cpu_p50", "cpu_p99", "wall_p50", "wall_p99", "subprocesses", "slurmctld_requests", "peak_mem")
GROWTH = [
    *(
        f"growth.{n}trays.{hook}.{kind}"
        for n in (1, 2, 4, 9, 18, 36, 72)
        for hook in ("prolog", "epilog")
        for kind in GROWTH_KINDS
    ),
    *(f"growth.{hook}.{kind}.72_over_1" for hook in ("prolog", "epilog") for kind in GROWTH_KINDS),
]
FIGURES += GROWTH


def test_smoke_prints_every_figure() -> None:
    """``bench/run --smoke`` exits 0 and prints each figure once as ``name value unit target [MISSED]``."""
    done = subprocess.run(
        [str(REPO / "bench/run"), "--smoke"], capture_output=True, text=True, timeout=600, check=False, cwd=REPO
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert re.fullmatch(rf"summary: {len(FIGURES)} figures, \d+ missed, \d+ s", lines[-1])
    parsed = [LINE.match(line) for line in lines[:-1]]
    assert all(parsed), [line for line, m in zip(lines, parsed) if not m]
    assert [m.group(1) for m in parsed if m] == FIGURES
    # scontrol is installed by .ci/setup test: the node lists were checked against Slurm's own expansion
    assert "nodelist.scontrol_checked 1 bool 1" in lines


def _suite() -> Any:
    spec = importlib.util.spec_from_file_location("bench_suite", REPO / "bench/suite.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_set_writes_into_the_trays_config() -> None:
    """``--set SECTION.KEY=VALUE`` adds the key to an existing section, or appends the section."""
    suite = _suite()
    text = "[paths]\nroot = /r\n[readiness]\ndeadline_s = 30\n"
    settings = [suite._setting("readiness.poll_max_s=0.1"), suite._setting(" log.level = debug ")]
    assert suite._with_settings(text, settings) == (
        "[paths]\nroot = /r\n[readiness]\npoll_max_s = 0.1\ndeadline_s = 30\n[log]\nlevel = debug\n"
    )
    with pytest.raises(argparse.ArgumentTypeError, match="'poll_max_s=1' is not SECTION.KEY=VALUE"):
        suite._setting("poll_max_s=1")


def test_covered_counts_overlaps_once_and_only_inside() -> None:
    """The detection lag subtracts the ctl runs' time between UP and the exit, overlapping runs once."""
    covered = _suite()._covered
    assert covered([], 0.0, 1.0) == 0.0
    # one run before UP, one straddling it, two overlapping after it, one past the exit
    spans = [(-1.0, -0.5, 0.0), (-0.2, 0.1, 0.0), (0.3, 0.5, 0.0), (0.4, 0.6, 0.0), (0.9, 1.4, 0.0)]
    assert abs(covered(spans, 0.0, 1.0) - (0.1 + 0.3 + 0.1)) < 1e-9


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(REPO / "bench/run"), *args], capture_output=True, text=True, timeout=300, check=False, cwd=REPO
    )


def test_against_runs_another_checkout_beside_this_one(tmp_path: Path) -> None:
    """``--against DIR`` adds the other checkout's start-up figures and the differences; refuses a non-checkout."""
    done = _bench("--smoke", "--only", "startup", "--against", str(REPO))
    assert done.returncode == 0, done.stderr[-2000:]
    names = [line.split()[0] for line in done.stdout.splitlines()[:-1]]
    assert names == [
        "startup.floor",
        *(
            f"startup.{h}.{k}"
            for h in ("version", "prolog_skipped", "epilog_idle")
            for k in ("over_floor", "ratio", "against.over_floor", "vs_against")
        ),
    ]
    refused = _bench("--smoke", "--only", "startup", "--against", str(tmp_path))
    assert refused.returncode == 2
    assert f"--against {tmp_path}: not a checkout of imexctl" in refused.stderr


def test_against_figures_pair_own_cpu_figures() -> None:
    """The readiness section's other-checkout figures: each own-CPU figure, its value there and the difference."""
    suite = _suite()
    fig = suite.Figure
    ours = [fig("detection.2trays.lag_p50", 5.0, "ms"), fig("cpu.prolog.2trays.p50", 50.0, "ms", "<=60", True)]
    theirs = [fig("detection.2trays.lag_p50", 9.0, "ms"), fig("cpu.prolog.2trays.p50", 54.0, "ms", "<=60", True)]
    assert suite._against_figures(ours, theirs) == [
        fig("cpu.prolog.2trays.p50.against", 54.0, "ms"),
        fig("cpu.prolog.2trays.p50.vs_against", -4.0, "ms"),
    ]


def _module(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, REPO / f"bench/{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_growth_runs_alone_and_against_another_checkout() -> None:
    """``--only growth`` prints every size's figures and the growth lines; ``--against`` adds the CPU pairs."""
    done = _bench("--smoke", "--only", "growth")
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert [line.split()[0] for line in lines[:-1]] == GROWTH
    # a plain exclusive job under 23.02+ asks slurmctld nothing, at any size, in either hook
    assert [line for line in lines if ".slurmctld_requests " in line and "trays." in line] == [
        f"growth.{n}trays.{hook}.slurmctld_requests 0 count 0"
        for n in (1, 2, 4, 9, 18, 36, 72)
        for hook in ("prolog", "epilog")
    ]
    against = _bench("--smoke", "--only", "growth", "--against", str(REPO))
    assert against.returncode == 0, against.stderr[-2000:]
    pairs = [
        f"growth.{n}trays.{hook}.{kind}.{what}"
        for n in (1, 2, 4, 9, 18, 36, 72)
        for hook in ("prolog", "epilog")
        for kind in ("cpu_p50", "cpu_p99")
        for what in ("against", "vs_against")
    ]
    assert [line.split()[0] for line in against.stdout.splitlines()[:-1]] == GROWTH + pairs


def test_growth_counts_what_asks_slurmctld(tmp_path: Path) -> None:
    """The stand-in counts a prolog's question to slurmctld: none for 23.02+, one squeue under 22.05 (no
    SLURM_JOB_OVERSUBSCRIBE: the prolog asks whether the job shares its trays); the epilog asks nothing."""
    growth = _module("bench_growth")
    fleet = growth.Fleet(tmp_path, growth._modules(REPO), [], 2)
    runs = list(growth._runs(fleet, 2, 1, 500))
    assert [(hook, r["subprocesses"], r["slurmctld"]) for hook, r in runs] == [
        ("prolog", 4, 0),
        ("prolog", 4, 0),
        ("epilog", 3, 0),
        ("epilog", 3, 0),
    ]
    fleet.env_changes = {"SLURM_JOB_OVERSUBSCRIBE": None}
    runs = list(growth._runs(fleet, 2, 1, 501))
    assert [(hook, r["subprocesses"], r["slurmctld"]) for hook, r in runs] == [
        ("prolog", 5, 1),
        ("prolog", 5, 1),
        ("epilog", 3, 0),
        ("epilog", 3, 0),
    ]


def test_growth_figures_judge_each_size_and_the_growth() -> None:
    """A prolog that asks slurmctld at 72 trays misses that figure and its growth line (none at 1 tray: infinite
    growth); none at either size is no growth; the CPU's growth is the 72-tray p50 over the 1-tray one."""
    suite = _suite()
    values = {
        (n, hook, kind): {"cpu_p50": 2.0 + n / 72, "subprocesses": 3.0, "slurmctld_requests": 0.0}.get(kind, 1.0)
        for n in suite.GROWTH_SIZES
        for hook in ("prolog", "epilog")
        for kind in GROWTH_KINDS
    }
    values[72, "prolog", "slurmctld_requests"] = 1.0
    figures = suite._growth_figures(values)
    assert [f.name for f in figures] == GROWTH
    missed = [f for f in figures if not f.ok]
    assert missed == [
        suite.Figure("growth.72trays.prolog.slurmctld_requests", 1.0, "count", "0", False),
        suite.Figure("growth.prolog.slurmctld_requests.72_over_1", float("inf"), "x", "<=1", False),
    ]
    by_name = {f.name: f for f in figures}
    assert by_name["growth.epilog.slurmctld_requests.72_over_1"] == suite.Figure(
        "growth.epilog.slurmctld_requests.72_over_1", 1.0, "x", "<=1", True
    )
    assert by_name["growth.prolog.cpu_p50.72_over_1"] == suite.Figure(
        "growth.prolog.cpu_p50.72_over_1", 3.0 / (2.0 + 1 / 72), "x", "<=2", True
    )
    assert by_name["growth.18trays.prolog.cpu_p50"] == suite.Figure(
        "growth.18trays.prolog.cpu_p50", 2.25, "ms", "<=10", True
    )
    assert by_name["growth.18trays.prolog.wall_p99"] == suite.Figure("growth.18trays.prolog.wall_p99", 1.0, "ms")
