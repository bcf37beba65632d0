"""imexctl's own cost by job size: the prolog and the epilog of jobs of 1 to 72 trays, in-process over FakeHost.

Run by bench/suite.py (section ``growth``, docs/performance.md "How the cost grows") as
``python -I bench/bench_growth.py --repo DIR --out FILE ...``: it imports DIR's imexctl and DIR's
tests/support/fakes.py, so that ``bench/run --against DIR`` measures another checkout the same way, and
writes one JSON document to FILE.

The fleet is four NVL72 racks: trays gb01..gb72, four NVLink domains of 18 (blocks gb[01-18] .. gb[55-72]),
its topology.conf made as ``imexctl topology blocks`` makes it from the trays' NVML keys, a slurm.conf
naming the 72 trays, and every other setting imexctl's default (the systemd backend, ``dns`` resolution,
the NVML fabric check, readiness level ``domain``).  Each tray has its own root, FakeHost and FakeGpu
(whose key is its rack's).  A job of N trays holds gb01..gbN; each tray sets up its own block's domain
(docs/design.md), so a job over 18 trays spans several.  The stand-in answers at once and as a healthy
domain would: ``nvidia-imex-ctl -q`` READY at the first probe, ``-N -j`` the domain UP with every tray of
the tray's nodes file READY and CONNECTED; it records every command (``squeue``, ``scontrol`` and
``sinfo`` are what asks slurmctld).  The environment is slurmd's from 23.02 on for a plain exclusive job
(``SLURM_JOB_OVERSUBSCRIBE=NO``, ``SLURM_CONF``).  Every prolog must exit 0 with its domain set up and
nothing on stderr, every epilog must exit 0 and leave no job directory: anything else stops the bench.

Measured per hook run, on this process's clocks: CPU (``time.process_time``) and wall
(``time.perf_counter``) of ``imexctl.cli.main`` with the fakes, the commands it ran, those that ask
slurmctld, and (in a second pass under tracemalloc, on the job's first and last tray) the peak of the
Python heap above what it held when the hook began.  The interpreter's start and imexctl's imports are
left out (a warm-up job loads them; ``startup.*`` and ``memory.prolog_peak_rss`` measure them); the cyclic
garbage collector is off during the runs, as the console script turns it off for a hook.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import math
import os
import sys
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: trays per NVLink domain (one NVL72 rack), and racks in the fleet
BLOCK_TRAYS, RACKS = 18, 4
#: the bench's clock moves this far between two jobs' starts: a tray's memory of the domains it tore down
#: (hooks/remnants.py) lasts past each domain's epilog deadline, and a real job lasts minutes
JOB_SPACING_S = 600.0
#: the commands that ask slurmctld (``scontrol version`` does not: it only prints the client's version)
SLURMCTLD = ("squeue", "sinfo", "scontrol")
PROC_DEVICES = "Character devices:\n195 nvidia\n234 nvidia-caps-imex-channels\nBlock devices:\n"


def _modules(repo: Path) -> dict[str, Any]:
    """imexctl and FakeHost from ``repo`` (the checkout measured), before anything imports them from elsewhere."""
    sys.path.insert(0, str(repo))
    from imexctl import cli
    from imexctl.gpu.fabric import FabricInfo
    from imexctl.slurm import blocks, nodefold
    from tests.support.fakes import FakeGpu, FakeHost, SlurmJob, domain_json, job_env

    return {"cli": cli, "FabricInfo": FabricInfo, "blocks": blocks, "fold": nodefold.fold, "FakeGpu": FakeGpu,
            "FakeHost": FakeHost, "SlurmJob": SlurmJob, "domain_json": domain_json, "job_env": job_env}  # fmt: skip


class Fleet:
    """The fleet's config, topology.conf and slurm.conf under ``base``, the roots of its first ``used`` trays.

    A fresh stand-in per tray and job (:meth:`host`).
    """

    def __init__(self, base: Path, mods: dict[str, Any], settings: list[tuple[str, str, str]], used: int) -> None:
        self.base, self.m = base, mods
        self.names = [f"gb{i:02d}" for i in range(1, BLOCK_TRAYS * RACKS + 1)]
        self.keys = {n: f"{uuid.UUID(int=(0x1111 << 112) + i // BLOCK_TRAYS)}.7" for i, n in enumerate(self.names)}
        self.addresses = {n: [f"10.1.{i // 200}.{i % 200 + 1}"] for i, n in enumerate(self.names)}
        blocks = mods["blocks"]
        got = blocks.collect(blocks.Report(n, self.keys[n], "", "", "fleet") for n in self.names)
        topology = blocks.render_conf(blocks.group(got), got)
        for n in self.names[:used]:
            (base / n / "proc").mkdir(parents=True)
            (base / n / "proc/devices").write_text(PROC_DEVICES)
            (base / n / "etc/slurm").mkdir(parents=True)
            (base / n / "etc/slurm/topology.conf").write_text(topology)
        self.slurm_conf = base / "slurm.conf"
        self.slurm_conf.write_text(
            "ClusterName=fleet\nSlurmctldHost=ctl\nPrologFlags=Alloc\nPrologEpilogTimeout=120\n"
            "TopologyPlugin=topology/block\nProctrackType=proctrack/cgroup\n"
            f"NodeName={mods['fold'](self.names)} CPUs=144 RealMemory=880000 State=UNKNOWN\n"
            "PartitionName=gpu Nodes=ALL Default=YES OverSubscribe=EXCLUSIVE\n"
        )
        self.config = base / "imexctl.conf"
        self.config.write_text(
            _with_settings(f"[paths]\nroot = {base}/%n\ntopology_file = /etc/slurm/topology.conf\n", settings)
        )
        self.config.chmod(0o644)
        #: ``nvidia-imex-ctl -N -j`` of each domain, by its trays' addresses: made before the hooks run
        self.answers: dict[tuple[str, ...], str] = {}
        #: slurmd's variables changed for every hook (None: unset), e.g. ``SLURM_JOB_OVERSUBSCRIBE`` for 22.05
        self.env_changes: dict[str, str | None] = {}

    def prepare(self, size: int) -> None:
        """The ``-N -j`` answer of each domain of a job on gb01..gb<size>: its block's share of the job, all UP."""
        for start in range(0, size, BLOCK_TRAYS):
            hosts = tuple(self.addresses[n][0] for n in self.names[start : min(size, start + BLOCK_TRAYS)])
            if hosts not in self.answers:
                self.answers[hosts] = self.m["domain_json"](hosts)

    def _domain(self, hosts: list[str]) -> tuple[int, str]:
        return 0, self.answers[tuple(hosts)]

    def host(self, node: str, now: float, job: int, trays: list[str]) -> Any:
        """The tray's stand-in, its clock at ``now``, slurmctld running ``job`` on ``trays``.

        The unit's ExecStart names the tray's own job configs.
        """
        unit_exec = f"/usr/bin/nvidia-imex -c {self.base}/{node}/run/imexctl/jobs/{{job}}/config.cfg"
        running = {job: self.m["SlurmJob"](job, nodes=self.m["fold"](trays), start_time=int(1_800_000_000 + now))}
        return self.m["FakeHost"](addresses=self.addresses, unit_exec=unit_exec, now=now, domain=self._domain,
                                  slurm_jobs=running)  # fmt: skip

    def gpu(self, node: str) -> Any:
        """Four GPUs registered in the tray's rack's NVLink domain."""
        cluster, _, clique = self.keys[node].rpartition(".")
        info = self.m["FabricInfo"]
        return self.m["FakeGpu"]([info(i, uuid.UUID(cluster).bytes, int(clique), 3, 0) for i in range(4)])

    def env(self, job: int, trays: list[str], node: str, hook: str) -> dict[str, str]:
        """slurmd's environment (23.02 on) for a plain exclusive job's ``hook`` on ``node``."""
        context = f"{hook}_slurmd"
        changes = {"SLURM_CONF": str(self.slurm_conf), "SLURM_SCRIPT_CONTEXT": context, **self.env_changes}
        return self.m["job_env"](job_id=job, nodelist=self.m["fold"](trays), node=node, uid=4242, gid=4343, **changes)

    def job_dir(self, node: str, job: int) -> Path:
        return self.base / node / f"run/imexctl/jobs/{job}"


def _with_settings(text: str, settings: list[tuple[str, str, str]]) -> str:
    """``key = value`` added to (or appended as) each ``[section]`` (``bench/run --set``)."""
    for section, key, value in settings:
        header, line = f"[{section}]\n", f"{key} = {value}\n"
        text = text.replace(header, header + line, 1) if header in text else text + header + line
    return text


def _run(fleet: Fleet, hook: str, job: int, trays: list[str], node: str, host: Any) -> dict[str, float]:
    """One hook on one tray: CPU and wall seconds, commands run, slurmctld asked; stop the bench on any failure."""
    cli, before = fleet.m["cli"], len(host.calls)
    argv = ["--config", str(fleet.config), hook]
    env, gpu = fleet.env(job, trays, node, hook), fleet.gpu(node)
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        w0, c0 = time.perf_counter(), time.process_time()
        rc = cli.main(argv, env=env, host=host, gpu=gpu)
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    done = fleet.job_dir(node, job).is_dir() == (hook == "prolog")
    if rc != 0 or err.getvalue() or not done:
        what = "set up no domain" if hook == "prolog" else "left its job directory"
        raise SystemExit(f"bench: the {hook} of job {job} ({len(trays)} trays) on {node} exited {rc}"
                         f"{'' if done else ', ' + what}: {err.getvalue()[-2000:]}")  # fmt: skip
    calls = [c for c in host.calls[before:] if c[0].startswith("/") or c[0] == "spawn"]  # not /proc or socket reads
    asked = [c for c in calls if Path(c[0]).name in SLURMCTLD and c[1:] != ("version",)]
    return {"cpu": cpu, "wall": wall, "subprocesses": len(calls), "slurmctld": len(asked)}


def _runs(
    fleet: Fleet, size: int, jobs: int, first_job: int, start: float = 1000.0
) -> Iterator[tuple[str, dict[str, float]]]:
    """``jobs`` jobs of ``size`` trays, one after another from ``start`` (the stand-ins' clock).

    Each tray's prolog, then each tray's epilog; yields each hook run as it ends: ``(hook, what _run measured)``.
    """
    held = fleet.names[:size]
    fleet.prepare(size)
    for k in range(jobs):
        job, now = first_job + k, start + k * JOB_SPACING_S
        hosts = {n: fleet.host(n, now, job, held) for n in held}
        for hook in ("prolog", "epilog"):
            for node, host in hosts.items():
                yield hook, _run(fleet, hook, job, held, node, host)


def measure(fleets: dict[int, Fleet], samples: int, first_job: int) -> dict[str, Any]:
    """At least ``samples`` runs of each hook per size (``ceil(samples / size)`` jobs), each size on its own fleet.

    The sizes' hook runs are interleaved one by one, each size's spread evenly
    over the whole measurement, so that the machine's load falls on every size
    alike; the cyclic garbage collector is off throughout, as in a hook.
    """
    jobs = {size: math.ceil(samples / size) for size in fleets}
    streams = {size: _runs(fleet, size, jobs[size], first_job) for size, fleet in fleets.items()}
    order = sorted(((i + 0.5) / (2 * n * s), s) for s, n in jobs.items() for i in range(2 * n * s))
    found: dict[int, dict[str, list[dict[str, float]]]] = {s: {"prolog": [], "epilog": []} for s in fleets}
    gc.collect()
    gc.disable()
    try:
        for _, size in order:
            hook, ran = next(streams[size])
            found[size][hook].append(ran)
    finally:
        gc.enable()
    peaks = _peaks(fleets, first_job + max(jobs.values()), 1000.0 + max(jobs.values()) * JOB_SPACING_S)
    return {str(s): {h: _columns(found[s][h], peaks[s][h]) for h in ("prolog", "epilog")} for s in fleets}


def _peaks(fleets: dict[int, Fleet], job: int, now: float) -> dict[int, dict[str, list[float]]]:
    """One more job per size under tracemalloc, on its first and last tray: each hook's peak heap above its start, KiB.

    A job of the first size runs first, untraced: the first calls under tracemalloc allocate 7 to 14 KiB once.
    """
    out: dict[int, dict[str, list[float]]] = {}
    tracemalloc.start()
    try:
        first = next(iter(fleets))
        for _ in _runs(fleets[first], first, 1, job, now):
            pass
        for size, fleet in fleets.items():
            out[size] = {"prolog": [], "epilog": []}
            held = fleet.names[:size]
            for node in dict.fromkeys((held[0], held[-1])):
                host = fleet.host(node, now + JOB_SPACING_S, job + 1, held)
                for hook in ("prolog", "epilog"):
                    tracemalloc.reset_peak()
                    start = tracemalloc.get_traced_memory()[0]
                    _run(fleet, hook, job + 1, held, node, host)
                    out[size][hook].append((tracemalloc.get_traced_memory()[1] - start) / 1024)
    finally:
        tracemalloc.stop()
    return out


def _columns(runs: list[dict[str, float]], peaks: list[float]) -> dict[str, list[float]]:
    return {**{k: [r[k] for r in runs] for k in ("cpu", "wall", "subprocesses", "slurmctld")}, "peak_kib": peaks}


def _setting(text: str) -> tuple[str, str, str]:
    name, _, value = text.partition("=")
    section, _, key = name.strip().partition(".")
    return section, key.strip(), value.strip()


def main() -> int:
    p = argparse.ArgumentParser(prog="bench/bench_growth.py", description=__doc__.splitlines()[0])
    p.add_argument("--repo", type=Path, required=True, help="the checkout whose imexctl runs")
    p.add_argument("--out", type=Path, required=True, help="where the JSON document goes")
    p.add_argument("--sizes", default="1,2,4,9,18,36,72", help="job sizes, in trays (at most 72)")
    p.add_argument("--samples", type=int, default=72, help="at least this many runs of each hook per size")
    p.add_argument("--first-job", type=int, default=1000)
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None  # a tmpfs, as /run is on a tray
    p.add_argument("--tmp", default=shm, help="where the trays' roots go (default: /dev/shm, a tmpfs)")
    p.add_argument("--set", type=_setting, action="append", default=[], metavar="SECTION.KEY=VALUE")
    args = p.parse_args()
    if os.geteuid() != 0:
        print("bench/bench_growth.py: run as root (the hooks need it)", file=sys.stderr)
        return 77
    sizes = list(dict.fromkeys(int(s) for s in args.sizes.split(",")))
    if not all(1 <= s <= BLOCK_TRAYS * RACKS for s in sizes):
        p.error(f"--sizes {args.sizes}: each between 1 and {BLOCK_TRAYS * RACKS}")
    with tempfile.TemporaryDirectory(prefix="imxgrowth", dir=args.tmp) as tmp:
        mods = _modules(args.repo.resolve())
        warm = Fleet(Path(tmp) / "warm-up", mods, args.set, 2)
        for _ in _runs(warm, 2, 1, args.first_job):  # the imports, untimed
            pass
        fleets = {size: Fleet(Path(tmp) / f"{size}trays", mods, args.set, size) for size in sizes}
        found = measure(fleets, max(1, args.samples), args.first_job)
    args.out.write_text(json.dumps({"repo": str(args.repo), "sizes": found}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
