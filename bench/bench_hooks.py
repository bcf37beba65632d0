#!/usr/bin/env python3
"""Cost of the hooks: every job start waits for the prolog, every job end for the epilog.

Measures, as separate processes started with an empty environment like slurmd's:
- import time of what the hooks import,
- ``imexctl task-prolog`` (run per task, as ``python -I -m imexctl.channels.taskprolog``) for a
  job with a channel and for one without, against ``python -I -c pass``,
- ``imexctl epilog`` for a job without IMEX on this node (the most common run),
- ``imexctl prolog`` for a job the policy skips,
- a whole 1-tray prolog and epilog on the simulator,
and, in-process over FakeHost, how many subprocesses a prolog runs when the
domain is ready at the first probe.  Prints a table; exits 1 if a target is missed.

Run as root: ``python3 bench/bench_hooks.py`` (the prolog needs root).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

RUNS = 9
# target wall seconds / peak RSS MiB (2-core machine, warm page cache)
TARGETS = {
    "python -c pass (floor)": (None, None),
    "python -I -c pass (task-prolog floor)": (None, None),
    "task-prolog, job with a channel": (0.120, 30),
    "task-prolog, no job here": (0.120, 30),
    "import hook modules": (0.150, None),
    "epilog, no IMEX job here": (0.350, 45),
    "prolog, skipped by policy": (0.350, 45),
    "prolog+epilog, 1 tray, simulator": (2.0, 60),
}
MAX_PROLOG_SUBPROCESSES = 3
#: what the TaskProlog may add to the interpreter's own start-up, per task
MAX_TASK_PROLOG_OVERHEAD_S = 0.025
# -I ignores PYTHONPATH: put the checkout first by hand, then run the module as -m would
TASK_PROLOG = f"import sys, runpy; sys.path.insert(0, {str(REPO)!r}); runpy.run_module('imexctl.channels.taskprolog', run_name='__main__')"


def _run(argv: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    t0 = time.perf_counter()
    p = subprocess.Popen(
        argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/"
    )
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return time.perf_counter() - t0, usage.ru_maxrss / 1024, p.returncode


def _median(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    samples = [_run(argv, env) for _ in range(RUNS)]
    bad = [rc for _, _, rc in samples if rc != 0]
    if bad:
        raise SystemExit(f"{argv} exited {bad[0]}")
    return statistics.median(s[0] for s in samples), max(s[1] for s in samples)


def _config(root: Path, extra: str = "") -> Path:
    cfg = root / "imexctl.conf"
    cfg.write_text(f"[paths]\nroot = {root}\n[policy]\nfabric = none\n{extra}")
    cfg.chmod(0o644)
    return cfg


def bench_processes(root: Path) -> dict[str, tuple[float, float]]:
    py = sys.executable
    env = {"PYTHONPATH": str(REPO)}
    hook_env = {
        **env,
        "SLURM_JOB_ID": "77",
        "SLURMD_NODENAME": "n1",
        "SLURM_JOB_NODELIST": "n1",
        "SLURM_JOB_UID": "0",
        "SLURM_JOB_PARTITION": "cpu",
    }
    out = {
        "python -c pass (floor)": _median([py, "-c", "pass"], env),
        "import hook modules": _median(
            [
                py,
                "-c",
                "import imexctl.cli, imexctl.hooks.prolog, imexctl.hooks.readiness, imexctl.hooks.teardown",
            ],
            env,
        ),
    }
    cfg = _config(root, "jobs = partitions\npartitions = gpu\n")
    out["epilog, no IMEX job here"] = _median([py, "-m", "imexctl", "--config", str(cfg), "epilog"], hook_env)
    out["prolog, skipped by policy"] = _median([py, "-m", "imexctl", "--config", str(cfg), "prolog"], hook_env)
    out.update(bench_task_prolog(root))
    return out


def bench_task_prolog(root: Path) -> dict[str, tuple[float, float]]:
    from tests.support.jobtree import Tree

    base = root / "task-prolog"
    base.mkdir()
    tree = Tree(base)
    tree.add_job(77, uid=os.getuid(), minor=3, channel_path="/dev/null")  # /dev/null is 1:3 and root's
    py = sys.executable
    argv = [py, "-I", "-c", TASK_PROLOG]
    return {
        "python -I -c pass (task-prolog floor)": _median([py, "-I", "-c", "pass"], {}),
        "task-prolog, job with a channel": _median(argv, tree.env(77)),
        "task-prolog, no job here": _median(argv, tree.env(78)),
    }


def bench_simulator() -> tuple[float, float]:
    from imexctl.commands.demo import SimRack

    base = Path(tempfile.mkdtemp(prefix="imxb", dir="/tmp"))
    rack = SimRack(base, 1, deadline_s=30)
    t = rack.trays[0]
    walls, rss = [], 0.0
    try:
        for job in range(3):
            wall = 0.0
            for hook in ("prolog", "epilog"):
                w, r, rc = _run([sys.executable, "-m", "imexctl", hook], rack.job_env(t, 900 + job, hook))
                if rc != 0:
                    raise SystemExit(f"simulator {hook} exited {rc}")
                wall, rss = wall + w, max(rss, r)
            walls.append(wall)
    finally:
        rack.kill_all()
        shutil.rmtree(base, ignore_errors=True)
    return statistics.median(walls), rss


def prolog_subprocesses(root: Path) -> int:
    import structlog

    from imexctl.config import settings
    from imexctl.hooks.prolog import prolog
    from imexctl.hooks.runtime import Runtime
    from imexctl.hooks.teardown import epilog
    from tests.support.fakes import FakeGpu, FakeHost, job_env

    (root / "proc").mkdir(exist_ok=True)
    (root / "proc/devices").write_text("Character devices:\n234 nvidia-caps-imex-channels\nBlock devices:\n")
    cfg = _config(root, "[daemon]\nbackend = exec\n")
    host = FakeHost(addresses={"gb01": ["10.0.0.1"], "gb02": ["10.0.0.2"]})
    structlog.configure(logger_factory=lambda *_: structlog.ReturnLogger())
    rt = Runtime(host, FakeGpu(), settings.load(cfg, node="gb01"), structlog.get_logger())
    prolog(job_env(job_id=5), rt)
    count = len(host.calls)  # nvidia-imex-ctl -q, -N -j, and the daemon itself
    epilog(job_env(job_id=5), rt)
    return count


def main() -> int:
    if os.geteuid() != 0:
        print("run as root: the prolog needs it", file=sys.stderr)
        return 77
    root = Path(tempfile.mkdtemp(prefix="imxb", dir="/tmp"))
    try:
        rows = bench_processes(root)
        rows["prolog+epilog, 1 tray, simulator"] = bench_simulator()
        nproc = prolog_subprocesses(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ok = True
    print("| measurement | median wall ms | peak RSS MiB | target ms / MiB | |\n|---|---:|---:|---|---|")
    for name, (wall, rss) in rows.items():
        t_wall, t_rss = TARGETS[name]
        good = (t_wall is None or wall <= t_wall) and (t_rss is None or rss <= t_rss)
        ok &= good
        target = f"{t_wall * 1000:.0f} / {t_rss or '-'}" if t_wall else "-"
        print(f"| {name} | {wall * 1000:.1f} | {rss:.1f} | {target} | {'ok' if good else 'MISSED'} |")
    overhead = rows["task-prolog, job with a channel"][0] - rows["python -I -c pass (task-prolog floor)"][0]
    good = overhead <= MAX_TASK_PROLOG_OVERHEAD_S
    ok &= good
    print(
        f"\ntask-prolog over python -I -c pass: {overhead * 1000:.1f} ms"
        f" (target <= {MAX_TASK_PROLOG_OVERHEAD_S * 1000:.0f}) {'ok' if good else 'MISSED'}"
    )
    good = nproc <= MAX_PROLOG_SUBPROCESSES
    ok &= good
    print(
        f"\nsubprocesses of a prolog ready at the first probe: {nproc} (target <= {MAX_PROLOG_SUBPROCESSES})"
        f" {'ok' if good else 'MISSED'}"
    )
    print("OK" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
