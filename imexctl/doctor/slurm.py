"""``imexctl doctor``'s slurm.conf checks: the Slurm version, hooks, flags, timeouts, partitions, topology.

slurm.conf is judged by the Slurm release this tray runs (``scontrol version``):
DeferBatch implies Alloc from 26.05, PrologTimeout/EpilogTimeout exist from 25.05.

slurm.conf is read by :mod:`imexctl.slurm.conf` (Include, continuation lines,
case-insensitive keys), from ``--slurm-conf``, ``$SLURM_CONF``, or the first
of ``/etc/slurm/slurm.conf`` and ``/run/slurm/conf/slurm.conf`` (where slurmd
keeps the files it fetched in configless mode) under ``[paths] root``.  Every
absolute path slurm.conf names is taken under ``[paths] root`` too.
"""

from __future__ import annotations

import glob
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from imexctl import slurm as var
from imexctl.config.settings import Settings
from imexctl.doctor.framework import FAIL, OK, WARN, Check, Context, under_root
from imexctl.imex.daemon import FORGET_S
from imexctl.platform.errors import ConfigError, ImexctlError
from imexctl.platform.fsutil import read_text_nofollow
from imexctl.slurm import conf as slurmconf
from imexctl.slurm import nodelist

__all__ = ["CANDIDATES", "checks", "epilog_worst_case_s", "prolog_worst_case_s"]

#: where doctor looks for slurm.conf without --slurm-conf or $SLURM_CONF (under [paths] root);
#: the second is configless slurmd's copy (design.md source slurm-configless)
CANDIDATES: Final = ("/etc/slurm/slurm.conf", "/run/slurm/conf/slurm.conf")
#: flags that imply Alloc (design.md source slurm-prologflags)
_ALLOC_FLAGS: Final = frozenset({"alloc", "contain", "nohold", "runinjob", "x11"})
_HOOK_LINE: Final = re.compile(r"^\s*(?:exec\s+)?(/\S*/imexctl)\s+(prolog|epilog)\b", re.MULTILINE)
_MAX_LINKS: Final = 8
#: the partition keys that say whether its jobs get whole nodes, as a warning names them
_SHARING_KEYS: Final = ("OverSubscribe", "Exclusive", "ExclusiveUser", "ExclusiveTopo")
#: "slurm 24.11.5", "slurm-wlm 26.05.5" (Debian's build)
_VERSION: Final = re.compile(r"\b(\d+)\.(\d+)\.\d+")


def prolog_worst_case_s(s: Settings) -> float:
    """The longest a prolog can take with these settings (docs/install.md's sum): lock, start, probes, roll-back."""
    d, r = s.daemon, s.readiness
    wait = max(r.deadline_s, d.lock_timeout_s + 10 + d.start_timeout_s) + 2 * r.ctl_timeout_s
    return wait + _teardown_worst_case_s(s)


def epilog_worst_case_s(s: Settings) -> float:
    """The longest an epilog can take: the wait for the job's processes, the lock, then the teardown."""
    d = s.daemon
    return d.process_wait_s + d.lock_timeout_s + _teardown_worst_case_s(s)


def _teardown_worst_case_s(s: Settings) -> float:
    """A teardown (the epilog's, a prolog's roll-back): ``systemctl stop`` and ``reset-failed``, SIGTERM, SIGKILL.

    After imexctl's own SIGKILL, the reset of the unit systemd then marks failed (``daemon.FORGET_S``).
    """
    d = s.daemon
    return d.stop_timeout_s + 5 + 10 + d.kill_grace_s + 2 + FORGET_S


def checks(ctx: Context) -> list[Check]:
    """Read slurm.conf and check what imexctl needs from it."""
    path = _find(ctx)
    if path is None:
        where = ", ".join(str(under_root(ctx, c)) for c in CANDIDATES)
        fix = "run doctor with --slurm-conf FILE or SLURM_CONF=FILE"
        return [Check("slurm.conf", WARN, f"no slurm.conf found (looked at {where}); not checked", fix)]
    try:
        conf = slurmconf.read(path, root=ctx.rt.settings.paths.root)
    except ConfigError as exc:
        return [Check("slurm.conf", FAIL, str(exc), "correct slurm.conf: slurmd would not read it either")]
    version_check, version = _version(ctx)
    out = [Check("slurm.conf", OK, f"read {path}" + _included(conf)), version_check]
    out += [_hook(conf, "prolog", ctx), _hook(conf, "epilog", ctx), _flags(conf, version, ctx.rt.settings)]
    out += [_prolog_timeout(conf, ctx.rt.settings), _epilog_timeout(conf, ctx.rt.settings)]
    out += [_batch_start_timeout(conf, ctx.rt.settings)]
    out += [*_timeout_keys(conf, version), *_partitions(conf, ctx, version), _preemption(conf, ctx)]
    out += [_switch(conf, ctx.rt.settings), *_topology(conf, ctx)]
    return out


# ---------------------------------------------------------------- the Slurm version, partitions


def _version(ctx: Context) -> tuple[Check, tuple[int, int] | None]:
    """This tray's Slurm release (``scontrol version``, local: no slurmctld asked), by which slurm.conf is judged."""
    argv = (ctx.rt.settings.commands.scontrol, "version")
    fix = f"install Slurm's client commands, or set [commands] scontrol to {argv[0]}'s real path"
    try:
        done = ctx.rt.host.run(argv, timeout_s=ctx.rt.settings.slurm.query_timeout_s)
    except ImexctlError as exc:
        return Check(
            "slurm.version", WARN, f"{' '.join(argv)}: {exc}; slurm.conf judged as the newest Slurm", fix
        ), None
    m = _VERSION.search(done.stdout)
    if done.returncode != 0 or m is None:
        said = (done.stdout or done.stderr).strip()[:200]
        return Check("slurm.version", WARN, f"{' '.join(argv)} said {said!r}; judged as the newest Slurm", fix), None
    return Check("slurm.version", OK, f"Slurm {m.group(0)} ({' '.join(argv)})"), (int(m.group(1)), int(m.group(2)))


def _timeout_keys(conf: slurmconf.SlurmConf, version: tuple[int, int] | None) -> list[Check]:
    """``PrologTimeout``/``EpilogTimeout`` came in Slurm 25.05: an older slurmd refuses the file."""
    keys = [k for k in ("PrologTimeout", "EpilogTimeout") if conf.get(k) is not None]
    if not keys:
        return [Check("slurm.timeout_keys", OK, "no PrologTimeout or EpilogTimeout (Slurm 25.05+ keys)")]
    if version is None or version >= (25, 5):
        return [Check("slurm.timeout_keys", OK, f"{' and '.join(keys)} (Slurm 25.05+) known to this Slurm")]
    why = (
        f"{' and '.join(keys)} need Slurm 25.05 or later; Slurm {version[0]}.{version[1]:02d} does not read slurm.conf"
    )
    return [Check("slurm.timeout_keys", FAIL, why, "use PrologEpilogTimeout until every daemon runs 25.05")]


def _imex_partitions(conf: slurmconf.SlurmConf, ctx: Context) -> list[tuple[str, dict[str, str]]]:
    """``(name, {key: value})`` of every partition holding this tray whose jobs may get IMEX (``DEFAULT`` applied)."""
    policy = ctx.rt.settings.policy
    default: dict[str, str] = {}
    out = []
    for kind, record in conf.records:
        if kind != "partitionname":
            continue
        values = {k.lower(): v for k, v in record.items()}
        name = next(iter(record.values()), "")
        if name.upper() == "DEFAULT":
            default.update(values)
            continue
        values = {**default, **values}
        if _holds(values.get("nodes", ""), ctx.node) and (policy.jobs != "partitions" or name in policy.partitions):
            out.append((name, values))
    return out


def _partitions(conf: slurmconf.SlurmConf, ctx: Context, version: tuple[int, int] | None) -> list[Check]:
    """WARN for each partition holding this tray whose jobs may share their trays (they run without IMEX)."""
    policy = ctx.rt.settings.policy
    shared = []
    for name, values in _imex_partitions(conf, ctx):
        if not _whole_nodes(values):
            said = " ".join(f"{k}={values[k.lower()]}" for k in _SHARING_KEYS if k.lower() in values)
            shared.append(f"{name} ({said or 'OverSubscribe=NO by default'})")
    if not shared:
        return [Check("slurm.partitions", OK, f"every partition holding {ctx.node} gives its jobs whole trays")]
    then = "fail their prologs and drain the tray" if policy.shared == "refuse" else "run without IMEX"
    why = f"partition {', '.join(shared)} holds {ctx.node}: its jobs without --exclusive {then}"
    key = (
        "Exclusive=NODE (Slurm 26.05+) or OverSubscribe=EXCLUSIVE"
        if version and version >= (26, 5)
        else ("OverSubscribe=EXCLUSIVE")
    )
    fix = f"set {key} on the partition (docs/install.md), or have users submit with --exclusive"
    return [Check("slurm.partitions", WARN, why, fix)]


def _preemption(conf: slurmconf.SlurmConf, ctx: Context) -> Check:
    """WARN for each partition holding this tray whose jobs may be suspended with their trays given to another job.

    ``PreemptMode`` (slurm.conf(5)): a partition's value replaces the global one; ``GANG`` (the gang
    scheduler, which time-slices jobs by suspending them) is global and applies whatever the
    partition says; ``SUSPEND`` preempts only with a ``PreemptType`` other than ``preempt/none``.  A
    suspended job's slurmstepd and IMEX domain stay on its trays while the other job's prologs run
    there: they fail ``domain_busy`` (docs/operations.md "Preemption").
    """
    global_mode = _words(conf.get("PreemptMode"))
    preempts = (conf.get("PreemptType") or "preempt/none").strip().lower() != "preempt/none"
    found = []
    for name, values in _imex_partitions(conf, ctx):
        mode = _words(values["preemptmode"]) if "preemptmode" in values else global_mode
        mode |= global_mode & {"GANG"}
        if "GANG" in mode or (preempts and "SUSPEND" in mode):
            found.append(f"{name} (PreemptMode={','.join(sorted(mode))})")
    if not found:
        return Check("slurm.preempt", OK, f"no partition holding {ctx.node} suspends its jobs (PreemptMode)")
    why = (
        f"partition {', '.join(found)} holds {ctx.node}: a job suspended there keeps its IMEX domain while "
        "Slurm starts another job on its trays, whose prologs then fail domain_busy and drain them"
    )
    fix = "use PreemptMode=REQUEUE or CANCEL (or OFF) for partitions with IMEX trays (docs/operations.md#preemption)"
    return Check("slurm.preempt", WARN, why, fix)


def _words(value: str | None) -> set[str]:
    """A comma-separated slurm.conf value as upper-case words (``suspend,gang`` -> {SUSPEND, GANG})."""
    return {w.strip().upper() for w in (value or "").split(",") if w.strip()}


def _whole_nodes(values: Mapping[str, str]) -> bool:
    """Whether a partition gives every job whole nodes (slurm.conf(5); ``read_config.c``).

    ``Exclusive=NODE|TOPO`` (26.05, which wins when set), ``OverSubscribe=EXCLUSIVE``, or ``ExclusiveTopo=YES``.
    """
    exclusive = values.get("exclusive", "").upper()
    if exclusive:
        return exclusive in ("NODE", "TOPO")
    if values.get("oversubscribe", "NO").split(":", 1)[0].upper() == "EXCLUSIVE":
        return True
    return values.get("exclusivetopo", "NO").upper() in ("YES", "TRUE", "1")


def _holds(nodes: str, node: str) -> bool:
    """Whether a partition's ``Nodes=`` value names ``node`` (``ALL``, or a host list; node sets are not known)."""
    if nodes.strip().upper() == "ALL":
        return True
    try:
        return node in nodelist.expand(nodes)
    except ImexctlError:
        return False


def _find(ctx: Context) -> Path | None:
    if ctx.slurm_conf is not None:
        return ctx.slurm_conf
    if var.value(ctx.env, var.CONF):
        return Path(var.value(ctx.env, var.CONF))
    for candidate in CANDIDATES:
        path = under_root(ctx, candidate)
        if path.is_file():
            return path
    return None


def _included(conf: slurmconf.SlurmConf) -> str:
    more = len(conf.files) - 1
    return f" and {more} included file(s)" if more else ""


# ---------------------------------------------------------------- Prolog= and Epilog=


def _hook(conf: slurmconf.SlurmConf, hook: str, ctx: Context) -> Check:
    """``Prolog=``/``Epilog=`` (globs, several lines) must run a script that execs ``imexctl <hook>``."""
    key, name = hook.capitalize(), f"slurm.{hook}"
    install = f"install {'hooks/' + hook} as /etc/slurm/{hook}.d/{'00' if hook == 'prolog' else '99'}-imexctl"
    fix = f"{install} and set {key}=/etc/slurm/{hook}.d/* (docs/install.md)"
    values = conf.get_all(key)
    if not values:
        return Check(name, FAIL, f"{key} is not set: imexctl's {hook} never runs", fix)
    scripts = [s for value in values for s in _expand(value, conf.path, ctx)]
    found = [(script, target) for script in scripts if (target := _imexctl_of(script, hook, ctx))]
    if not found:
        shown = ", ".join(values)
        return Check(name, FAIL, f"{key}={shown} runs no script that execs 'imexctl {hook}'", fix)
    script, target = found[0]
    problem = _hook_problem(script, target, ctx)
    if problem:
        return Check(name, FAIL, problem, f"make the hook an executable file of root's, and {target} exist")
    return _hook_order(name, hook, scripts, script, target)


def _hook_order(name: str, hook: str, scripts: list[Path], script: Path, target: str) -> Check:
    # slurmd runs a glob's matches in reverse alphabetical order and stops at the first failure
    # (slurm.conf(5) "Prolog"; docs/install.md explains the names)
    order = sorted(scripts, reverse=True)
    runs = order.index(script)
    late = hook == "prolog" and runs != len(order) - 1
    early = hook == "epilog" and runs != 0
    msg = f"{script} runs {target} {hook} (script {runs + 1} of {len(order)})"
    if late or early:
        when = "last (sort first)" if late else "first (sort last)"
        return Check(name, WARN, msg, f"rename it so that it runs {when}: docs/install.md explains the order")
    return Check(name, OK, msg)


def _expand(value: str, conf_path: Path, ctx: Context) -> list[Path]:
    """The scripts one ``Prolog=`` value names: relative to slurm.conf's directory, globs expanded."""
    base = conf_path.parent
    pattern = str(under_root(ctx, value)) if value.startswith("/") else str(base / value)
    if glob.has_magic(pattern):
        return [Path(p) for p in sorted(glob.glob(pattern))]
    return [Path(pattern)] if os.path.lexists(pattern) else []


def _imexctl_of(script: Path, hook: str, ctx: Context) -> str:
    """The imexctl a hook script execs for ``hook`` ('' when it does not)."""
    real = _resolve(script, ctx)
    try:
        text = read_text_nofollow(real) if real else ""
    except OSError:
        return ""
    for match in _HOOK_LINE.finditer(text):
        if match.group(2) == hook:
            return match.group(1)
    return ""


def _resolve(path: Path, ctx: Context) -> Path | None:
    """Follow symbolic links as slurmd would, absolute targets taken under ``[paths] root``."""
    for _ in range(_MAX_LINKS):
        try:
            target = os.readlink(path)
        except OSError:
            return path if os.path.lexists(path) else None
        path = under_root(ctx, target) if target.startswith("/") else path.parent / target
    return None


def _hook_problem(script: Path, target: str, ctx: Context) -> str:
    real = _resolve(script, ctx)
    st = os.stat(real) if real else None
    if st is None or not st.st_mode & 0o100:
        return f"{script} is not executable: slurmd cannot run it"
    if st.st_uid not in (0, os.geteuid()) or st.st_mode & 0o022:
        mode = stat.S_IMODE(st.st_mode)
        return f"{script} can be changed by others (uid {st.st_uid}, mode {mode:04o}); slurmd runs it as root"
    exe = _resolve(under_root(ctx, target), ctx)
    if exe is None or not os.access(exe, os.X_OK):
        return f"{script} execs {target}, which does not exist or is not executable"
    return ""


# ---------------------------------------------------------------- flags, timeouts, switch, topology


def _flags(conf: slurmconf.SlurmConf, version: tuple[int, int] | None, s: Settings) -> Check:
    """PrologFlags, and what a tray does when a peer's prolog fails under them (``hooks/requeue.py``)."""
    text = conf.get("PrologFlags") or ""
    flags = set(slurmconf.prolog_flags(conf))
    shown = f"PrologFlags={text}" if text else "PrologFlags is not set"
    if "deferbatch" in flags and (version is None or version >= (26, 5)):
        flags.add("alloc")  # Slurm 26.05: DeferBatch implies Alloc (read_config.c)
    if not flags & _ALLOC_FLAGS:
        why = "the prolog runs on a tray only when a step starts there, so other trays' prologs wait in vain"
        return Check("slurm.prolog_flags", FAIL, f"{shown}: {why}", "set PrologFlags=Alloc,DeferBatch")
    once = (
        "a tray whose peer's prolog fails asks slurmctld once whether the job went back to the queue, "
        "so healthy trays are often drained with the broken one"
    )
    if "deferbatch" not in flags:
        why = f"the batch script may start before every tray's prolog has finished; {once}"
        return Check("slurm.prolog_flags", WARN, f"{shown}: {why}", "add DeferBatch: PrologFlags=Alloc,DeferBatch")
    if "nohold" in flags:
        why = f"with NoHold slurmctld waits for no prolog, so DeferBatch holds nothing back; {once}"
        return Check("slurm.prolog_flags", WARN, f"{shown}: {why}", "drop NoHold: PrologFlags=Alloc,DeferBatch")
    wait = (
        f"the batch script waits for every tray's prolog; a tray whose peer's prolog fails waits up to "
        f"{s.slurm.timeout_margin_s:g} s for slurmctld to take the job back, then exits 0: one broken tray "
        "drains one tray"
    )
    if s.readiness.blame_peers == "yes":
        wait += " ([readiness] blame_peers = yes exits earlier: the batch script may then start before the requeue)"
    elif s.slurm.check_cancelled != "yes":
        wait = "the batch script waits for every tray's prolog; [slurm] check_cancelled = no: every tray fails"
    return Check("slurm.prolog_flags", OK, f"{shown}: every tray runs the prolog at allocation; {wait}")


def _prolog_timeout(conf: slurmconf.SlurmConf, s: Settings) -> Check:
    worst = prolog_worst_case_s(s)
    fix = f"set PrologEpilogTimeout={_round_up(worst)} (docs/install.md adds up the prolog's worst case)"
    return _hook_timeout(conf, "prolog", worst, fix, "a slow roll-back may be killed", s)


def _epilog_timeout(conf: slurmconf.SlurmConf, s: Settings) -> Check:
    worst = epilog_worst_case_s(s)
    fix = f"set PrologEpilogTimeout (or EpilogTimeout) to at least {_round_up(worst)}"
    return _hook_timeout(conf, "epilog", worst, fix, "slurmd may kill it mid-teardown")


def _hook_timeout(
    conf: slurmconf.SlurmConf, hook: str, worst: float, fix: str, too_short: str, s: Settings | None = None
) -> Check:
    """Slurmd's timeout for the hook against its worst case; with ``s`` (the prolog), against the deadline too."""
    name = f"slurm.{hook}_timeout"
    found = slurmconf.hook_timeout(conf, hook)
    if found is None:
        return Check(name, WARN, f"no {hook} timeout: slurmd waits for a hung {hook} forever", fix)
    seconds, key = found
    if s is not None and seconds <= (need := s.readiness.deadline_s + s.slurm.timeout_margin_s):
        why = f"{key}={seconds} is not above [readiness] deadline_s + [slurm] timeout_margin_s = {need:g} s"
        if s.slurm.cap_deadline != "yes":
            return Check(name, FAIL, f"{why}: slurmd kills a prolog still waiting", fix)
        cap = max(seconds / 2, seconds - s.slurm.timeout_margin_s)
        return Check(name, WARN, f"{why}: the prolog cuts its deadline to {cap:g} s", fix)
    if seconds < worst:
        return Check(name, WARN, f"{key}={seconds} is below the {hook}'s worst case {worst:g} s: {too_short}", fix)
    return Check(name, OK, f"{key}={seconds} covers the {hook}'s worst case {worst:g} s")


#: slurm.conf(5): BatchStartTimeout's default
_BATCH_START_DEFAULT_S: Final = 10


def _batch_start_timeout(conf: slurmconf.SlurmConf, s: Settings) -> Check:
    """``BatchStartTimeout`` not below the prolog's timeout (or, without one, the prolog's worst case).

    Else a batch job whose prolog runs longer may be taken for lost and
    requeued (slurm.conf(5); Slurm 26.11 warns, SchedMD/slurm 81ac96b985).
    """
    seconds = conf.seconds("BatchStartTimeout")
    key = "BatchStartTimeout=" + (f"{seconds}" if seconds is not None else f"{_BATCH_START_DEFAULT_S} (its default)")
    seconds = _BATCH_START_DEFAULT_S if seconds is None else seconds
    found = slurmconf.hook_timeout(conf, "prolog")
    need, what = (found[0], f"{found[1]}={found[0]}") if found else (prolog_worst_case_s(s), "the prolog's worst case")
    if seconds < need:
        why = (f"{key} is below {what}: a batch job whose prolog runs longer may be taken for lost "
               "and requeued (Slurm 26.11 warns about it)")  # fmt: skip
        return Check("slurm.batch_start_timeout", WARN, why, f"set BatchStartTimeout={_round_up(need)}")
    return Check("slurm.batch_start_timeout", OK, f"{key} is not below {what}")


def _round_up(seconds: float) -> int:
    return int(-(-seconds // 10) * 10)


def _switch(conf: slurmconf.SlurmConf, s: Settings) -> Check:
    switch = (conf.get("SwitchType") or "").strip()
    plugin = switch == "switch/nvidia_imex"
    channels = s.policy.channels
    if plugin and channels == "job":
        why = "Slurm's switch/nvidia_imex gives each step its channel; the prolog detects it and makes none"
        fix = "set [policy] channels = none to say so (events: imex.channels.slurm)"
        return Check("slurm.switch", WARN, f"SwitchType={switch} and [policy] channels = job: {why}", fix)
    if not plugin and channels == "none":
        why = "neither Slurm nor imexctl creates a channel: jobs can use only a channel0 the driver made"
        fix = "set [policy] channels = job, or SwitchType=switch/nvidia_imex (Slurm 24.05+)"
        return Check("slurm.switch", WARN, f"SwitchType={switch or '(unset)'} and [policy] channels = none: {why}", fix)
    who = "Slurm's switch/nvidia_imex" if plugin else "imexctl ([policy] channels = job)"
    return Check("slurm.switch", OK, f"SwitchType={switch or '(unset)'}: the job's channel comes from {who}")


def _unplaced(conf: slurmconf.SlurmConf, ctx: Context) -> str:
    """Why this node's IMEX channel has no place without a topology source ('' when it has one, or needs none).

    Without a topology source the channel's clique is slurm.conf's nodes; a
    node it does not list (a dynamic node) has no place, and its prologs
    refuse IMEX (design.md "The channel rule").
    """
    from imexctl.slurm import nodeaddr

    if ctx.rt.settings.policy.channels != "job" or (conf.get("SwitchType") or "").strip() == "switch/nvidia_imex":
        return ""
    try:
        names = nodeaddr.node_names(conf)
    except ConfigError as exc:
        return f"no topology source, and slurm.conf's node lines cannot be read ({exc}): its prologs refuse IMEX"
    if ctx.node in names:
        return ""
    return (
        f"no topology source, and slurm.conf does not list this node {ctx.node} (a dynamic node?): with [policy] "
        "channels = job its IMEX channel has no place in its NVLink clique, and its prologs refuse IMEX"
    )


def _topology(conf: slurmconf.SlurmConf, ctx: Context) -> list[Check]:
    from imexctl.slurm import topofile

    s = ctx.rt.settings
    if s.topology.source == "none":
        plugin = (conf.get("TopologyPlugin") or "").strip()
        unplaced = _unplaced(conf, ctx)
        if unplaced:
            fix = "set [topology] source and [paths] topology_file to a file that names every tray (docs/topology.md)"
            return [Check("slurm.topology", FAIL, unplaced, fix)]
        if plugin == "topology/block":
            why = "Slurm places jobs by blocks, but imexctl makes one domain of all a job's trays"
            fix = "set [paths] topology_file to the blocks' topology.conf (docs/topology.md)"
            return [Check("slurm.topology", WARN, f"TopologyPlugin={plugin} and no [paths] topology_file: {why}", fix)]
        return [Check("slurm.topology", OK, "no topology source: all trays of a job form one domain")]
    out = []
    for kind, path in ((s.topology.source, s.paths.topology_file), ("map", s.paths.topology_map)):
        if path is None:
            continue
        try:
            blocks = topofile.load(kind, path, s.topology.yaml_topology)
        except ConfigError as exc:
            out.append(Check("slurm.topology", FAIL, str(exc), "regenerate it: imexctl topology blocks"))
            continue
        if ctx.node not in blocks.block_of:
            why = f"{path}: this node {ctx.node} is in no {blocks.unit}; its prologs exit 78"
            out.append(Check("slurm.topology", FAIL, why, "add the node (imexctl topology blocks) or fix its name"))
        else:
            where = f"{blocks.unit} {blocks.block_of[ctx.node]}"
            out.append(Check("slurm.topology", OK, f"{path} ({kind}) parses; {ctx.node} is in {where}"))
    return out
