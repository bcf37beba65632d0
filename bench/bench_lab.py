#!/usr/bin/env python3
"""What a job start costs under real Slurm: the lab's prolog timings, per Slurm version.

Brings a 4-node lab up (tests/lab), then measures
- bring-up and teardown of the lab,
- for a few 4-node ``srun`` jobs of the unprivileged job user: each node's prolog time as slurmd itself
  logs it (REQUEST_LAUNCH_PROLOG to the script's result), imexctl's own ``prolog.done`` duration, and
  the whole ``srun`` (prolog, step, epilog),
- 20 two-node jobs back to back (median and slowest ``srun``).
Prints a table per version; exits 1 if the slowest prolog of a 4-node job takes a third of the
PrologEpilogTimeout or more (a daemon holding slurmd's pipe, a lock held too long).

Run as root from the repository root, with imexctl installed (``bash .ci/setup test``)::

    /opt/imexctl/bin/python bench/bench_lab.py [--slurm 22.05|24.11|all] [--jobs 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.lab import debroot  # noqa: E402
from tests.lab.cluster import LabError, SlurmLab  # noqa: E402
from tests.lab.jobs import PROLOG_TIMEOUT, SlurmdLogs, events, install_stepcheck, srun_check, wait_done  # noqa: E402
from tests.lab.versions import HostSlurm, RootSlurm, SlurmInstall  # noqa: E402

VERSIONS = ("22.05", "24.11")


def _install(version: str) -> SlurmInstall:
    if version == "22.05":
        return HostSlurm()
    return RootSlurm(debroot.ensure_root().path)


def four_node_jobs(lab: SlurmLab, jobs: int) -> list[tuple[int, dict[str, float], dict[str, float], float]]:
    """Run 4-node jobs one after another; return (job, slurmd prolog s, imexctl prolog s, srun wall s) each."""
    out = []
    for _ in range(jobs):
        logs = SlurmdLogs(lab)
        t0 = time.monotonic()
        job, _checks = srun_check(lab, lab.nodes)
        wall = time.monotonic() - t0
        times = logs.prolog_times()
        if sorted(times) != sorted(lab.nodes):
            raise LabError(f"no prolog timing in slurmd's log for job {job}: {times}")
        imex = {n: float((events(lab, n, job, "prolog.done") or [{}])[-1].get("duration_s", "nan")) for n in lab.nodes}
        wait_done(lab, job)
        out.append((job, times, imex, wall))
    return out


def back_to_back(lab: SlurmLab, jobs: int = 20) -> list[float]:
    """Run two-node jobs back to back on the same nodes; return each srun's wall time."""
    durations = []
    done = []
    for _ in range(jobs):
        t0 = time.monotonic()
        job, _checks = srun_check(lab, lab.nodes[2:])
        durations.append(time.monotonic() - t0)
        done.append(job)
    for job in done:
        wait_done(lab, job)
    return durations


def bench(version: str, jobs: int) -> bool:
    """Measure one version, print its table, and say whether the target was met."""
    t0 = time.monotonic()
    lab = SlurmLab(_install(version), nodes=4, slurmd_debug="debug2", prolog_epilog_timeout=PROLOG_TIMEOUT).up()
    up_s = time.monotonic() - t0
    running = lab.version
    try:
        install_stepcheck(lab)
        runs = four_node_jobs(lab, jobs)
        series = back_to_back(lab)
    finally:
        t1 = time.monotonic()
        lab.down()
        down_s = time.monotonic() - t1
    print(f"\n## Slurm {running}\n")
    print("| measurement | value |\n|---|---|")
    print(f"| lab bring-up / teardown | {up_s:.2f} s / {down_s:.2f} s |")
    for job, times, imex, wall in runs:
        per_node = ", ".join(f"{n} {t * 1000:.0f}" for n, t in sorted(times.items()))
        own = ", ".join(f"{n} {t * 1000:.0f}" for n, t in sorted(imex.items()))
        print(f"| 4-node job {job}: slurmd prolog ms | {per_node} |")
        print(f"| 4-node job {job}: imexctl prolog.done ms | {own} |")
        print(f"| 4-node job {job}: srun wall | {wall:.2f} s |")
    print(f"| 20 x srun -N2 (prolog+step+epilog) | median {statistics.median(series):.2f} s, max {max(series):.2f} s |")
    slowest = max(max(times.values()) for _job, times, _imex, _wall in runs)
    good = slowest < PROLOG_TIMEOUT / 3
    print(
        f"| slowest 4-node prolog | {slowest * 1000:.0f} ms (target < {PROLOG_TIMEOUT / 3:.0f} s): "
        f"{'ok' if good else 'MISSED'} |"
    )
    return good


def main() -> int:
    """Benchmark the chosen versions; exit 1 if a target is missed."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--slurm", choices=[*VERSIONS, "all"], default="all")
    ap.add_argument("--jobs", type=int, default=3, help="4-node jobs to time (default 3)")
    args = ap.parse_args()
    ok = True
    for version in VERSIONS if args.slurm == "all" else (args.slurm,):
        ok = bench(version, args.jobs) and ok
    print("\nOK" if ok else "\nFAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
