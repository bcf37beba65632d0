"""Random fault cycles on the simulator: a job's hooks under one random fault each, then recovery and the invariants.

One cycle is one job on a :class:`FaultRack` (one or both of its two trays):

1. ``world``: maybe a simulator fault on one tray's daemon (``crash_after``,
   ``slow_start``, ``never_ready``, ``hang_ctl``, ``stop_delay``,
   ``ignore_sigterm``);
2. the job's prolog on its trays, then maybe an intruder on one tray (another
   job's prolog or late epilog, both with the job's channel number, or a
   plain ``imexctl cleanup``), then maybe the job's epilog or an admin's
   ``cleanup`` (plain or ``--force``); exactly one of these hooks gets a
   hook fault on one tray: ``kill``, ``term`` or ``pause`` then SIGKILL at a
   random step it reaches, or ``kill_after:S`` (SIGKILL S seconds after a
   step, wherever the hook is then);
3. ``imexctl status`` on every tray must tell the truth (:func:`status_lies`);
4. recovery as documented: ``cleanup --dry-run`` then ``cleanup`` (what the
   dry run names is exactly what the run does), then the job's epilog on its
   trays (slurmd runs it at the job's end; plain cleanup keeps a set-up job
   whose epilog has not begun while its daemon lives, design.md);
5. then nothing is left (no daemon, channel, file or held lock) and status
   says so; an intruder never changed the job's domain.

Every cycle's plan comes from ``random.Random(f"{seed}:{index}")`` alone, so
``seed`` and ``index`` replay it (the timing of the simulated daemons is not
replayed: a cycle under load may take another branch, which the invariants
hold for as well).  Hooks run as forked children of this process (no
interpreter start per hook) that call ``imexctl.cli.main`` with the fault
driver's :class:`~tests.faults.driver.Injector`, exactly as
``python -m tests.faults.driver`` does; SIGKILL and SIGTERM are real.

``tests/faults/test_cycles.py`` runs 200 cycles in CI; ``python -m
tests.faults.soak`` runs thousands (tests/faults/README.md).
"""

from __future__ import annotations

import configparser
import dataclasses
import hashlib
import importlib
import json
import os
import random
import re
import signal
import stat
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil

from imexctl.commands.demo import Tray
from tests.faults import driver
from tests.faults.rack import FaultRack

__all__ = ["SEED_ENV", "Cycler", "Plan", "Result", "make_plan", "replay_hint", "seed_from_env", "status_lies"]

#: pins the seed of the cycle test and the soak command
SEED_ENV = "IMEXCTL_FAULT_SEED"

STEPS: Mapping[str, tuple[str, ...]] = {
    "prolog": ("start", "locked", "claimed", "files_written", "daemon_started", "ready", "channel_created"),
    "epilog": ("start", "locked", "daemon_stopped", "channel_removed", "removed"),
    "cleanup": ("start", "locked", "daemon_stopped", "channel_removed", "removed"),
}
HOOK_ACTIONS = ("kill", "term", "pause_kill", "kill_after")
#: simulator faults (imexctl/sim/README.md) and how a cycle draws their values
WORLD: Mapping[str, str] = {
    "none": "",
    "crash": "crash_after={:.2f}",
    "slow_start": "slow_start={:.2f}",
    "never_ready": "never_ready",
    "hang_ctl": "hang_ctl",
    "stop_delay": "stop_delay={:.2f}",
    "ignore_sigterm": "ignore_sigterm",
}
INTRUDERS = ("none", "other_prolog", "other_epilog", "cleanup")
#: the simulated trays have no topology source and no SLURM_CONF, so their channel number is the job-id rule
#: 1 + job id % 2047 (design.md "The channel rule", a domain without a place): the intruder shares the number
SAME_MINOR = 2047
#: what a hook may exit with in a cycle: ok, busy, file failed, lock timeout / not ready (never 70: unsafe or a bug)
ALLOWED_EXITS = frozenset({0, 69, 71, 75})
#: what the hooks import lazily (cli.main imports per command)
PRELOAD = (
    "imexctl.cli", "imexctl.hooks.prolog", "imexctl.hooks.teardown", "imexctl.commands.status", "imexctl.config.settings", "imexctl.platform.host",
    "imexctl.cli.dispatch", "imexctl.platform.log", "imexctl.platform.logsetup", "imexctl.gpu.fabric", "imexctl.hooks.metrics", "imexctl.imex.ctl", "imexctl.hooks.readiness", "structlog",
)  # fmt: skip
_ITEM = re.compile(r"^(?:would )?(.*?)(?: \(.*\))?$")


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one cycle does; a pure function of ``(seed, index)``."""

    seed: int
    index: int
    job: int
    trays: int  # the job's trays: 1 or 2 (tray01 first)
    phase: str  # the hook that gets the fault: prolog, epilog or cleanup
    step: str
    action: str  # kill, term, pause_kill, kill_after
    after_s: float  # kill_after's delay
    victim: int  # index of the tray whose hook gets the fault
    world: str  # a key of WORLD
    world_entry: str  # the simulator fault entry (without the @address)
    world_tray: int
    intruder: str
    force: bool  # the cleanup phase runs cleanup --force

    @property
    def kind(self) -> str:
        """The fault kind a soak summary counts this cycle under."""
        return f"{self.phase}:{self.action}" + ("" if self.world == "none" else f"+{self.world}")

    def describe(self) -> str:
        """One line: everything the cycle does."""
        fault = f"{self.step}={self.action}" + (f":{self.after_s:.2f}" if self.action == "kill_after" else "")
        world = "" if self.world == "none" else f", daemon of tray {self.world_tray + 1}: {self.world_entry}"
        extra = f", intruder {self.intruder}" if self.intruder != "none" else ""
        force = " --force" if self.phase == "cleanup" and self.force else ""
        return (
            f"cycle {self.index} (seed {self.seed}): job {self.job} on {self.trays} tray(s), "
            f"{self.phase}{force} of tray {self.victim + 1} faulted at {fault}{world}{extra}"
        )


def make_plan(seed: int, index: int) -> Plan:
    """The plan of cycle ``index`` of run ``seed``."""
    rng = random.Random(f"{seed}:{index}")
    phase = rng.choice(("prolog", "prolog", "epilog", "cleanup"))
    world = rng.choice(("none", "none", "none", *list(WORLD)[1:]))
    value = {"crash": rng.uniform(0.05, 0.4), "slow_start": rng.uniform(0.1, 0.6), "stop_delay": rng.uniform(0.1, 0.8)}
    trays = rng.choice((1, 1, 1, 2))
    return Plan(
        seed=seed,
        index=index,
        job=100 + (seed * 7919 + index * 13) % 50000,
        trays=trays,
        phase=phase,
        step=rng.choice(STEPS[phase]),
        action=rng.choice(HOOK_ACTIONS),
        after_s=rng.uniform(0.0, 0.8),
        victim=rng.randrange(trays),
        world=world,
        world_entry=WORLD[world].format(value.get(world, 0)),
        world_tray=rng.randrange(trays),
        intruder=rng.choice(INTRUDERS),
        force=rng.random() < 0.5,
    )


def seed_from_env(env: Mapping[str, str] = os.environ) -> int:
    """The seed pinned in ``IMEXCTL_FAULT_SEED``, or a fresh one."""
    text = env.get(SEED_ENV, "").strip()
    return int(text) if text else random.SystemRandom().randrange(1, 1 << 31)


def replay_hint(seed: int, index: int | None = None) -> str:
    """How to replay a run (or one cycle of it)."""
    one = f" --only {index}" if index is not None else ""
    return (
        f"replay: {SEED_ENV}={seed} python -m pytest -m faults tests/faults/test_cycles.py, "
        f"or python -m tests.faults.soak --seed {seed}{one}"
    )


@dataclasses.dataclass
class Result:
    """What one cycle found: the problems (none: every invariant held) and the exits of its hooks."""

    plan: Plan
    problems: list[str]
    exits: list[str]
    seconds: float


# ---------------------------------------------------------------- hooks as forked children


@dataclasses.dataclass
class Child:
    """One imexctl command in a forked child of this process, with the fault driver's injector."""

    pid: int
    dir: Path
    label: str
    rc: int | None = None

    def wait(self, timeout: float = 120) -> int:
        """Wait for the child's end (SIGKILL it at ``timeout``); its exit code, -N for signal N."""
        deadline = time.monotonic() + timeout
        while self.rc is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.rc = os.waitstatus_to_exitcode(status)
            elif time.monotonic() > deadline:  # a hook that hangs: end it, the invariants will tell
                os.kill(self.pid, signal.SIGKILL)
                deadline = float("inf")
            else:
                time.sleep(0.005)
        return self.rc

    def output(self) -> str:
        """What the child printed: stdout, then stderr (the log lines)."""
        return self.stdout() + "".join(p.read_text(errors="replace") for p in [self.dir / "err"] if p.exists())

    def stdout(self) -> str:
        path = self.dir / "out"
        return path.read_text(errors="replace") if path.exists() else ""

    def steps(self) -> list[str]:
        path = self.dir / "steps"
        return [line.split(" ", 1)[1] for line in path.read_text().splitlines()] if path.exists() else []

    def paused(self, step: str, timeout: float = 60) -> bool:
        """Wait until the child pauses at ``step``; False if it ended first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (self.dir / f"{step}.reached").exists():
                return True
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.rc = os.waitstatus_to_exitcode(status)
                return False
            time.sleep(0.005)
        return False


def fork(argv: list[str], env: Mapping[str, str], faults: str, fdir: Path, label: str) -> Child:
    """Run ``imexctl <argv>`` in a forked child: stdio on ``fdir/out``, steps and pauses in ``fdir``."""
    fdir.mkdir(parents=True)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return Child(pid, fdir, label)
    rc = 70
    try:  # the child: never returns into the parent's code
        signal.alarm(0)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, name in ((1, "out"), (2, "err")):
            os.dup2(os.open(fdir / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - the child's stdio, ended by os._exit
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
        from imexctl.cli import main

        injector = driver.Injector(driver.parse(faults), fdir, 60)
        injector("start")
        rc = main(argv, env=dict(env), on_step=injector)
    except BaseException:  # report anything: the child must end here, never return into the parent
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)


# ---------------------------------------------------------------- what is really on a tray


def reality(t: Tray) -> dict[str, Any]:
    """Job directories, daemons (by the config path in their argv), channel nodes and the claimed minors."""
    jobs_dir = t.root / "run/imexctl/jobs"
    dirs = sorted(int(p.name) for p in jobs_dir.glob("*")) if jobs_dir.exists() else []
    pattern = re.compile(re.escape(f"{jobs_dir}/") + r"(\d+)/config\.cfg$")
    daemons: dict[int, list[int]] = {}
    for p in psutil.process_iter(["cmdline", "status"]):
        if p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        for arg in p.info["cmdline"] or []:
            m = pattern.match(arg)
            if m:
                daemons.setdefault(int(m.group(1)), []).append(p.pid)
    chan_dir = t.root / "dev/nvidia-caps-imex-channels"
    channels = sorted(str(p) for p in chan_dir.glob("*")) if chan_dir.exists() else []
    states = {j: _state(jobs_dir / str(j) / "state.json") for j in dirs}
    return {"dirs": dirs, "daemons": {j: sorted(p) for j, p in sorted(daemons.items())}, "channels": channels,
            "states": states}  # fmt: skip


def _state(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def domain(t: Tray, job: int) -> dict[str, Any]:
    """Job ``job``'s domain on tray ``t``: files (inode, mtime, content), daemon pids, channel node."""
    jd = t.root / f"run/imexctl/jobs/{job}"
    files = {}
    if jd.exists():
        for p in sorted(jd.iterdir()):
            st = p.lstat()
            files[p.name] = (st.st_ino, st.st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
    chan = t.root / f"dev/nvidia-caps-imex-channels/channel{1 + job % 2047}"
    st = chan.lstat() if os.path.lexists(chan) else None
    config = str(jd / "config.cfg")
    daemons = sorted(
        p.pid
        for p in psutil.process_iter(["cmdline", "status"])
        if config in (p.info["cmdline"] or [])
        and p.info["status"] != psutil.STATUS_ZOMBIE
        # not a readiness probe (nvidia-imex-ctl -c <config> -q) that a killed prolog left to run out
        and not any(Path(a).name.startswith("nvidia-imex-ctl") for a in p.info["cmdline"])
    )
    return {
        "files": files,
        "daemons": daemons,
        "channel": (st.st_ino, st.st_rdev, st.st_uid, stat.S_IMODE(st.st_mode)) if st else None,
    }


def status_lies(st: Mapping[str, Any], real: Mapping[str, Any]) -> list[str]:
    """Where ``imexctl status --json``'s data ``st`` disagrees with what is on the tray (``reality()``).

    The rules are design.md's: a job is one with a directory or a daemon; it
    "runs" (not stale) only while set up, not ended, with its daemon alive (the
    simulated trays have no slurmstepd); a channel is stale unless some job's
    state claims it.
    """
    lies = []
    jobs = {j["job_id"]: j for j in st["jobs"]}
    known = set(real["dirs"]) | set(real["daemons"])
    if set(jobs) != known:
        lies.append(f"status names jobs {sorted(jobs)}, the tray has {sorted(known)}")
    for jid, j in jobs.items():
        state = real["states"].get(jid)
        alive = jid in real["daemons"]
        runs = bool(state and state.get("set_up") and not state.get("ended") and alive)
        if j["running"] != runs:
            lies.append(f"job {jid}: status says running={j['running']}, the truth is {runs}")
        if ("no daemon process" in j["stale"]) == alive:
            lies.append(f"job {jid}: status says daemon alive={not alive}, the truth is {alive}")
        if ("daemon without job directory" in j["stale"]) == (jid in real["dirs"]):
            lies.append(f"job {jid}: status is wrong about its job directory")
    claimed = {s.get("channel_minor") for s in real["states"].values() if s}
    shown = {c["path"]: c for c in st["channels"]}
    if sorted(shown) != real["channels"]:
        lies.append(f"status names channels {sorted(shown)}, the tray has {real['channels']}")
    for path, c in shown.items():
        if c["stale"] != (c["minor"] not in claimed and c["minor"] != 0):
            lies.append(f"status calls {path} stale={c['stale']} (claimed minors {sorted(map(str, claimed))})")
    clean = not known and not real["channels"]
    if clean and st["stale"]:
        lies.append(f"the tray is clean, status says stale: {st['stale']}")
    return lies


# ---------------------------------------------------------------- one cycle


class Cycler:
    """Runs cycles on one rack (two trays), which each cycle leaves as clean as it found it."""

    def __init__(self, rack: FaultRack) -> None:
        self.rack = rack
        self.n = 0
        for module in PRELOAD:  # imported once here, not in every forked hook
            importlib.import_module(module)
        for t in rack.trays:  # bounded waits: a daemon deaf to SIGTERM, a hung ctl, a lock held by a paused hook
            conf = configparser.ConfigParser()
            conf.read(t.config)
            conf.set("daemon", "stop_timeout_s", "1")
            conf.set("daemon", "kill_grace_s", "0.2")
            conf.set("daemon", "lock_timeout_s", "20")
            conf.set("readiness", "ctl_timeout_s", "0.5")
            conf.set("readiness", "poll_max_s", "0.1")
            with t.config.open("w") as f:
                conf.write(f)

    def run(self, plan: Plan) -> Result:
        """Run one cycle; never raises for what it finds, only for a broken harness."""
        t0 = time.monotonic()
        c = _Cycle(self, plan)
        try:
            c.go()
        finally:
            self.rack.set_faults("")
            left = self.rack.dirty()
            if left:
                c.problems.append(f"left behind: {left}")
                self.rack.kill_all()
                for t in self.rack.trays:
                    self._scrub(t)
        return Result(plan, c.problems, c.exits, time.monotonic() - t0)

    def _scrub(self, t: Tray) -> None:
        """After a failed cycle: remove what it left so the next cycle starts clean."""
        import shutil

        for sub in ("run/imexctl/jobs", "dev/nvidia-caps-imex-channels"):
            shutil.rmtree(t.root / sub, ignore_errors=True)

    def fork(self, t: Tray, argv: list[str], env: Mapping[str, str], faults: str = "") -> Child:
        self.n += 1
        return fork(argv, env, faults, self.rack.base / f"c{self.n}", f"{argv[0]} on {t.name}")

    def admin_env(self, t: Tray) -> dict[str, str]:
        return {"SLURMD_NODENAME": t.name, "IMEXCTL_CONFIG": str(t.config)}


class _Cycle:
    def __init__(self, cycler: Cycler, plan: Plan) -> None:
        self.cy, self.p, self.rack = cycler, plan, cycler.rack
        self.trays = self.rack.trays[: plan.trays]
        self.problems: list[str] = []
        self.exits: list[str] = []

    def go(self) -> None:
        p = self.p
        if p.world != "none":
            self.rack.set_faults(f"@{self.trays[p.world_tray].address} {p.world_entry}")
        self.hooks("prolog", p.job)
        self.intrude()
        if p.phase == "epilog":
            self.hooks("epilog", p.job)
        elif p.phase == "cleanup":
            args = ["cleanup", "--force"] if p.force else ["cleanup"]
            self.admin(self.trays[p.victim], args, faulted=True)
        self.rack.set_faults("")
        if p.world in ("crash", "stop_delay"):
            # let the daemon die as planned, or finish the slow shutdown that a killed hook's SIGTERM began:
            # the dry run and the run must not race it (seed 494551871 cycle 108: the dry run saw the daemon
            # still stopping and named nothing, the run found it gone and tore the job down)
            t = self.trays[p.world_tray]
            deadline = time.monotonic() + (3 if p.world == "crash" else float(p.world_entry.split("=")[1]) + 0.5)
            while domain(t, p.job)["daemons"] and time.monotonic() < deadline:
                time.sleep(0.02)
        for t in self.trays:
            self.truthful(t, "after the faults")
        self.recover()

    # -- running hooks

    def fault(self) -> str:
        p = self.p
        action = {"pause_kill": "pause", "kill_after": f"kill_after:{p.after_s:.2f}"}.get(p.action, p.action)
        return f"{p.step}={action}"

    def hooks(self, hook: str, job: int) -> None:
        """The hook on every tray of the job at once; the victim's under the fault when this is the phase."""
        env = {t.name: self.rack.job_env(t, job, hook, self.trays) for t in self.trays}
        faulted = self.p.phase == hook
        kids = [
            self.cy.fork(t, [hook], env[t.name], self.fault() if faulted and i == self.p.victim else "")
            for i, t in enumerate(self.trays)
        ]
        for i, kid in enumerate(kids):
            self.finish(kid, faulted and i == self.p.victim)

    def admin(self, t: Tray, args: list[str], *, faulted: bool = False) -> Child:
        kid = self.cy.fork(t, args, self.cy.admin_env(t), self.fault() if faulted else "")
        self.finish(kid, faulted)
        return kid

    def finish(self, kid: Child, faulted: bool) -> None:
        """Wait for a hook; a paused victim is killed there (its lock must have been held, and is freed)."""
        if faulted and self.p.action == "pause_kill" and kid.paused(self.p.step):
            t = next(t for t in self.rack.trays if kid.label.endswith(t.name))
            if self.p.step != "start" and not self.rack.lock_held(t):
                self.problems.append(f"{kid.label} paused at {self.p.step} without the node lock")
            os.kill(kid.pid, signal.SIGKILL)
        rc = kid.wait()
        self.exits.append(f"{kid.label}: {rc}")
        signals = (-signal.SIGKILL, -signal.SIGTERM) if faulted else ()
        if rc not in ALLOWED_EXITS and rc not in signals:
            self.problems.append(f"{kid.label} exited {rc}: {kid.output()[-2000:]}")
        if faulted and rc in signals and self.p.action in ("kill", "term") and kid.steps()[-1:] != [self.p.step]:
            self.problems.append(f"{kid.label} died at {kid.steps()[-1:]}, not at {self.p.step}")

    # -- the invariants

    def intrude(self) -> None:
        """Another job's hook, or plain cleanup, on one tray of the job: it must not change the job's domain."""
        p, t = self.p, self.trays[-1]
        before = domain(t, p.job)
        if p.intruder == "none" or not (before["files"] or before["daemons"]):
            return
        other = p.job + SAME_MINOR
        if p.intruder == "cleanup":
            state = reality(t)["states"].get(p.job) or {}
            if not (state.get("set_up") and not state.get("ended") and before["daemons"]):
                return  # a dead job's leftovers: plain cleanup may (and should) remove them
            if p.world == "crash" and t == self.trays[p.world_tray]:
                return  # the daemon may die before cleanup looks: then its leftovers are fair game
            self.admin(t, ["cleanup"])
        else:
            hook = "prolog" if p.intruder == "other_prolog" else "epilog"
            # issue 22: a prolog clears what a job that no longer runs here left (its own prolog killed, say),
            # as plain cleanup would; a job whose domain is set up, not ended and alive keeps the tray (69)
            state = reality(t)["states"].get(p.job) or {}
            alive = bool(state.get("set_up") and not state.get("ended") and before["daemons"])
            if hook == "prolog" and p.world == "crash" and t == self.trays[p.world_tray]:
                return  # the daemon may die before the prolog looks: then either outcome is right
            if hook == "prolog" and not alive:
                self._clearing_prolog(t, other)
                return
            kid = self.cy.fork(t, [hook], self.rack.job_env(t, other, hook, self.trays))
            rc = kid.wait()
            self.exits.append(f"intruder {hook} of job {other} on {t.name}: {rc}")
            want = 69 if hook == "prolog" else 0
            if rc != want:
                self.problems.append(f"intruder {hook} of job {other} exited {rc}, not {want}: {kid.output()[-2000:]}")
        after = domain(t, p.job)
        if after != before and not _died_alone(before, after):
            self.problems.append(f"intruder {p.intruder} changed job {p.job}'s domain on {t.name}: {before} -> {after}")

    def _clearing_prolog(self, t: Tray, other: int) -> None:
        """Job ``other``'s one-tray prolog on a tray holding a dead job's leftovers: it clears them and sets up
        (exit 0; or, when the dead job's daemon would not stop, fails with nothing of its own left), and its
        epilog then removes its own domain."""
        env = self.rack.job_env(t, other, "prolog", [t])
        kid = self.cy.fork(t, ["prolog"], env)
        rc = kid.wait()
        self.exits.append(f"clearing prolog of job {other} on {t.name}: {rc}")
        # its own domain meets this tray's simulated daemon faults (never_ready, ...) like any job's would
        faulted = self.p.world != "none" and t == self.trays[self.p.world_tray]
        if rc != 0 and not faulted:
            self.problems.append(f"clearing prolog of job {other} exited {rc}, not 0: {kid.output()[-2000:]}")
        if f"leftovers of job {self.p.job}" not in kid.output():
            self.problems.append(f"clearing prolog of job {other} did not log clearing job {self.p.job}")
        if domain(t, self.p.job)["files"]:
            self.problems.append(f"clearing prolog of job {other} left job {self.p.job}'s files on {t.name}")
        epi = self.cy.fork(t, ["epilog"], self.rack.job_env(t, other, "epilog", [t]))
        erc = epi.wait()
        self.exits.append(f"epilog of job {other} on {t.name}: {erc}")
        if erc != 0:
            self.problems.append(f"epilog of job {other} exited {erc}: {epi.output()[-2000:]}")

    def status(self, t: Tray) -> dict[str, Any] | None:
        kid = self.cy.fork(t, ["status", "--json"], self.cy.admin_env(t))
        rc = kid.wait()
        try:
            data: dict[str, Any] = json.loads(kid.stdout())["data"] if rc == 0 else {}
        except (ValueError, KeyError, TypeError):
            data = {}
        if not data:
            self.problems.append(f"status on {t.name} exited {rc}: {kid.output()[-2000:]}")
            return None
        return data

    def truthful(self, t: Tray, when: str) -> dict[str, Any] | None:
        """``imexctl status`` agrees with the tray (read again if a daemon died meanwhile); its data."""
        lies: list[str] = []
        st = None
        for _ in range(3):
            before = reality(t)
            st = self.status(t)
            if st is None:
                return None
            lies = status_lies(st, before)
            if not lies or reality(t) == before:
                break
        self.problems += [f"{when}, on {t.name}: {lie}" for lie in lies]
        return st

    def recover(self) -> None:
        """cleanup --dry-run, cleanup (the same items), the job's epilog; then nothing is left and status says so."""
        for t in self.trays:
            dry = self.cleanup_items(t, dry=True)
            done = self.cleanup_items(t, dry=False)
            if dry is not None and done is not None and dry != done:
                self.problems.append(f"on {t.name}: cleanup --dry-run named {dry}, cleanup did {done}")
        self.hooks_plain("epilog")
        for t in self.trays:
            st = self.truthful(t, "after recovery")
            if st is not None and (st["jobs"] or st["channels"] or st["stale"]):
                self.problems.append(f"after recovery, status on {t.name} is not clean: {st['stale']}")
            if self.rack.lock_held(t):
                self.problems.append(f"after recovery, {t.name}'s node lock is held")

    def hooks_plain(self, hook: str) -> None:
        kids = [self.cy.fork(t, [hook], self.rack.job_env(t, self.p.job, hook, self.trays)) for t in self.trays]
        for kid in kids:
            rc = kid.wait()
            self.exits.append(f"recovery {kid.label}: {rc}")
            if rc != 0:
                self.problems.append(f"recovery {kid.label} exited {rc}: {kid.output()[-2000:]}")

    def cleanup_items(self, t: Tray, *, dry: bool) -> list[str] | None:
        kid = self.cy.fork(t, ["cleanup", "--json", *(["--dry-run"] if dry else [])], self.cy.admin_env(t))
        rc = kid.wait()
        self.exits.append(f"recovery {kid.label}{' --dry-run' if dry else ''}: {rc}")
        try:
            data = json.loads(kid.stdout())["data"]
        except (ValueError, KeyError, TypeError):
            self.problems.append(
                f"cleanup{' --dry-run' if dry else ''} on {t.name} exited {rc}: {kid.output()[-2000:]}"
            )
            return None
        if rc != 0:
            self.problems.append(f"cleanup on {t.name} exited {rc}: {data}")
        return items(data["actions"])


def items(actions: list[str]) -> list[str]:
    """Teardown's items without ``would`` and without the detail in parentheses."""
    return [m.group(1) for a in actions if (m := _ITEM.match(a))]


def _died_alone(before: dict[str, Any], after: dict[str, Any]) -> bool:
    """The only change is that the daemon died by itself (a ``crash_after`` fault), files and channel untouched."""
    return before["files"] == after["files"] and before["channel"] == after["channel"] and not after["daemons"]
