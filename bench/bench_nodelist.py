"""Benchmark imexctl.nodelist: import time, expand and fold of 10k and 100k names.

Run from anywhere as ``python3 bench/bench_nodelist.py``.  The workloads follow
reference/slurm.md section 4.3: a contiguous ``gpu[...]`` list and a
"fragmented" one (each of 2n candidate names kept with probability 0.5, seeded
RNG, folded into one ``gpu[...]`` expression).  The 100k contiguous list is
written as two ranges (slurm.md case 41) because one range of 100,000 hosts is
an error in Slurm and in imexctl.

Each timing is taken RUNS times; the table shows the best and the median run.
Targets are checked against the best run, which estimates the cost on an idle
machine: this script often shares its CPUs with other work, and the median is
printed so that noise stays visible.  Exits 1 when a target is missed.
"""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from imexctl.nodelist import expand, fold  # noqa: E402 # after the sys.path line above

TARGET_IMPORT_MS = 2.0
TARGET_EXPAND_10K_MS = 5.0
TARGET_FOLD_10K_MS = 25.0
RUNS = 15
IMPORT_RUNS = 15
SEED = 20240601
HEADER = (
    "| input      |       n |   hosts |    chars | expand best / med ms | PH expand "
    "| fold best / med ms | PH fold |\n"
    "|------------|--------:|--------:|---------:|---------------------:|----------:"
    "|-------------------:|--------:|"
)


class Workload(NamedTuple):
    """One benchmark input and python-hostlist's reference timings (slurm.md 4.3)."""

    label: str
    n: int
    text: str
    names: list[str]
    ref_expand_ms: float
    ref_fold_ms: float


def _timings_ms(func: Callable[[], object]) -> tuple[float, float]:
    """Return the best and the median wall time of *func* in milliseconds."""
    func()
    samples = []
    for _ in range(RUNS):
        start = time.perf_counter()
        func()
        samples.append((time.perf_counter() - start) * 1e3)
    return min(samples), statistics.median(samples)


def _import_ms(module: str, pycache: str, *, site: bool) -> tuple[float, float]:
    """Best and median cumulative ``-X importtime`` of *module*, fresh interpreters.

    Byte code is written to and then read from *pycache*, as for an installed
    package.  ``site=False`` runs ``python -S``: nothing that ``.pth`` files
    import (often ``typing`` and ``re``) is preloaded then.
    """
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    argv = [
        sys.executable,
        *([] if site else ["-S"]),
        "-X",
        "importtime",
        "-X",
        f"pycache_prefix={pycache}",
        "-c",
        f"import {module}",
    ]
    samples = []
    for _ in range(IMPORT_RUNS + 1):
        proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=True)
        line = [ln for ln in proc.stderr.splitlines() if ln.rstrip().endswith(f"| {module}")]
        samples.append(int(line[-1].split("|")[1]) / 1e3)
    return min(samples[1:]), statistics.median(samples[1:])


def _fragmented(n: int) -> list[str]:
    rng = random.Random(SEED + n)
    width = len(str(2 * n))
    return [f"gpu{i:0{width}d}" for i in range(1, 2 * n + 1) if rng.random() < 0.5]


def _workloads() -> list[Workload]:
    contiguous_100k = "gpu[000001-050000],gpu[050001-100000]"
    frag_10k, frag_100k = _fragmented(10_000), _fragmented(100_000)
    return [
        Workload("contiguous", 10_000, "gpu[00001-10000]", expand("gpu[00001-10000]"), 2.24, 20.20),
        Workload("fragmented", 10_000, fold(frag_10k), frag_10k, 8.70, 22.67),
        Workload("contiguous", 100_000, contiguous_100k, expand(contiguous_100k), 21.30, 242.4),
        Workload("fragmented", 100_000, fold(frag_100k), frag_100k, 92.36, 274.8),
    ]


def _row(w: Workload, failures: list[str]) -> str:
    if expand(w.text) != w.names or expand(fold(w.names)) != w.names:
        raise SystemExit(f"wrong result for {w.label} {w.n}")
    expand_ms = _timings_ms(lambda: expand(w.text))
    fold_ms = _timings_ms(lambda: fold(w.names))
    if w.n == 10_000 and expand_ms[0] > TARGET_EXPAND_10K_MS:
        failures.append(f"expand {w.label} 10k: {expand_ms[0]:.2f} ms")
    if w.n == 10_000 and fold_ms[0] > TARGET_FOLD_10K_MS:
        failures.append(f"fold {w.label} 10k: {fold_ms[0]:.2f} ms")
    return (
        f"| {w.label:<10} | {w.n:>7,} | {len(w.names):>7,} | {len(w.text):>8,} "
        f"| {expand_ms[0]:>9.2f} / {expand_ms[1]:>8.2f} | {w.ref_expand_ms:>9.2f} "
        f"| {fold_ms[0]:>8.2f} / {fold_ms[1]:>7.2f} | {w.ref_fold_ms:>7.2f} |"
    )


def main() -> int:
    """Print the benchmark table; return 1 if a target is missed."""
    failures: list[str] = []
    with tempfile.TemporaryDirectory() as pycache:
        imports = {
            (module, site): _import_ms(module, pycache, site=site)
            for module in ("imexctl.nodelist", "imexctl.errors")
            for site in (True, False)
        }
    print(
        f"Python {sys.version.split()[0]}; best / median of {RUNS} runs ({IMPORT_RUNS} fresh interpreters for imports)."
    )
    for site in (True, False):
        best, median = imports["imexctl.nodelist", site]
        if best > TARGET_IMPORT_MS:
            failures.append(f"import ({'site' if site else '-S'}): {best:.2f} ms")
        print(
            f"import imexctl.nodelist, {'with site' if site else 'python -S '}: "
            f"{best:5.2f} / {median:5.2f} ms (target <= {TARGET_IMPORT_MS} ms); "
            f"imexctl.errors, imported when a parse fails: "
            f"{imports['imexctl.errors', site][0]:5.2f} ms"
        )
    print()
    print(HEADER)
    for workload in _workloads():
        print(_row(workload, failures))
    print()
    print(
        f"targets (best run, 10k rows): expand <= {TARGET_EXPAND_10K_MS} ms, fold <= "
        f"{TARGET_FOLD_10K_MS} ms; PH = python-hostlist 2.3.0 medians from slurm.md 4.3"
    )
    for failure in failures:
        print(f"MISSED {failure}")
    print("FAIL" if failures else "OK")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
