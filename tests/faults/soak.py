"""``python -m tests.faults.soak --cycles N [--seed S] [--only I] [--workers W]``: random fault cycles, what they found.

Runs :mod:`tests.faults.cycles` (root only, like the hooks): W worker
processes, each on its own simulated two-tray rack, share the cycles (cycle
``i`` goes to worker ``i % W``).  Prints one block per failed cycle, with the
line that replays it, then a summary per fault kind.  Exit status 0 when every
cycle held every invariant, 1 otherwise.  tests/faults/README.md describes the
cycles.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path

from tests.faults.cycles import Cycler, Result, make_plan, replay_hint, seed_from_env
from tests.faults.rack import REPO, FaultRack
from tests.support.racks import JOB_GID, JOB_UID

__all__ = ["main", "report", "run_cycles", "run_parallel", "summary"]

_TAG = "CYCLE "


def run_cycles(seed: int, indices: Sequence[int], *, address: int = 20) -> list[Result]:
    """Run the cycles ``indices`` of run ``seed`` here, on a fresh rack; every process it started is ended after."""
    base = Path(tempfile.mkdtemp(prefix="imxsoak", dir="/tmp"))
    rack = FaultRack(base, 2, deadline_s=1.2, uid=JOB_UID, gid=JOB_GID, first_address=address)
    results = []
    try:
        cycler = Cycler(rack)
        for index in indices:
            res = cycler.run(make_plan(seed, index))
            results.append(res)
            record = {"index": index, "problems": res.problems, "exits": res.exits, "seconds": res.seconds}
            print(_TAG + json.dumps(record), flush=True)
    finally:
        rack.kill_all()
        shutil.rmtree(base, ignore_errors=True)
    return results


def run_parallel(seed: int, indices: Sequence[int], workers: int, *, echo: bool = False) -> list[Result]:
    """Run the cycles in ``workers`` processes (``python -m tests.faults.soak --worker``); their results in order."""
    procs = []
    for k in range(workers):
        mine = [str(i) for i in indices[k::workers]]
        argv = [
            sys.executable,
            "-m",
            "tests.faults.soak",
            "--worker",
            "--seed",
            str(seed),
            "--address",
            str(20 + 4 * k),
        ]
        procs.append(
            subprocess.Popen(
                [*argv, *(a for i in mine for a in ("--only", i))],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                bufsize=1,
                cwd=REPO,
                env={**os.environ, "PYTHONPATH": str(REPO)},
            )
        )
    results, stray = [], []
    with selectors.DefaultSelector() as sel:  # read all workers as they write: a full pipe would stall one
        for proc in procs:
            sel.register(proc.stdout, selectors.EVENT_READ)  # type: ignore[arg-type]
        while sel.get_map():
            for key, _ in sel.select():
                line = key.fileobj.readline()  # type: ignore[union-attr]
                if not line:
                    sel.unregister(key.fileobj)
                elif line.startswith(_TAG):
                    rec = json.loads(line[len(_TAG) :])
                    res = Result(make_plan(seed, rec["index"]), rec["problems"], rec["exits"], rec["seconds"])
                    results.append(res)
                    if echo and res.problems:
                        print(report(res), flush=True)
                else:
                    stray.append(line)
    for proc in procs:
        if proc.wait() != 0:
            raise RuntimeError(f"soak worker exited {proc.returncode}: {''.join(stray)[-4000:]}")
    return sorted(results, key=lambda r: r.plan.index)


def report(res: Result) -> str:
    """A failed cycle: what it did, what it found, how to replay it."""
    lines = [f"FAILED {res.plan.describe()}", *(f"  {p}" for p in res.problems)]
    return "\n".join([*lines, f"  hooks: {'; '.join(res.exits)}", f"  {replay_hint(res.plan.seed, res.plan.index)}"])


def summary(seed: int, results: Sequence[Result], seconds: float) -> str:
    """Cycles, failures and mean time per fault kind; the replay line."""
    by_kind: dict[str, list[Result]] = defaultdict(list)
    for res in results:
        by_kind[res.plan.kind].append(res)
    failed = [res for res in results if res.problems]
    per_cycle = seconds / max(len(results), 1)
    lines = [
        f"{len(results)} cycles, seed {seed}, {len(failed)} failed, {seconds:.0f}s wall ({per_cycle:.2f}s per cycle)",
        f"{'fault kind':40} {'cycles':>6} {'failed':>6} {'mean s':>7}",
    ]
    for kind in sorted(by_kind):
        rs = by_kind[kind]
        bad = sum(1 for r in rs if r.problems)
        lines.append(f"{kind:40} {len(rs):6d} {bad:6d} {sum(r.seconds for r in rs) / len(rs):7.2f}")
    exits = Counter(e.rsplit(": ", 1)[1] for r in results for e in r.exits)
    lines.append("hook exit codes seen: " + ", ".join(f"{code} x{n}" for code, n in sorted(exits.items())))
    if failed:
        lines.append("failed cycles: " + " ".join(str(r.plan.index) for r in failed))
    lines.append(replay_hint(seed))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the arguments, run the cycles, print the summary."""
    parser = argparse.ArgumentParser(prog="python -m tests.faults.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=1000, help="how many cycles (default 1000)")
    parser.add_argument("--seed", type=int, help="the run's seed (default: $IMEXCTL_FAULT_SEED, else random)")
    parser.add_argument("--only", type=int, action="append", help="run only cycle I of the seed (repeatable)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes, one rack each (default 2)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--address", type=int, default=20, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("the hooks need root (device nodes, chown)")
    seed = args.seed if args.seed is not None else seed_from_env()
    indices = args.only or list(range(args.cycles))
    if args.worker:
        run_cycles(seed, indices, address=args.address)
        return 0
    print(f"soak: seed {seed}, {len(indices)} cycles, {args.workers} workers", flush=True)
    t0 = time.monotonic()
    results = run_parallel(seed, indices, max(1, min(args.workers, len(indices))), echo=True)
    print(summary(seed, results, time.monotonic() - t0), flush=True)
    return 1 if any(r.problems for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
