"""``imexctl status``: what this node's IMEX domain looks like, for an admin."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imexctl.channels import devices
from imexctl.hooks.jobs import known_jobs, still_runs
from imexctl.hooks.runtime import Runtime
from imexctl.hooks.state import JobState, read_state
from imexctl.imex import daemon
from imexctl.platform.errors import CommandError, ImexctlError
from imexctl.platform.fsutil import read_text_nofollow
from imexctl.platform.output import print_json

if TYPE_CHECKING:
    import argparse

    from imexctl.config.paths import JobDir

__all__ = ["collect", "command", "render_text"]


def collect(rt: Runtime, node: str, *, nvml: bool = True) -> dict[str, Any]:
    """Owner job, daemon, port, nodes, domain and peer states, channels, staleness.

    ``nvml=False``: the fabric is not read (``fabric`` is None), as with ``[policy] fabric = none``.
    """
    paths = rt.settings.paths
    jobs = [_job(jid, rt) for jid in known_jobs(rt)]
    claimed = {j["channel"]["minor"] for j in jobs if j.get("channel")}
    channels = [_channel(c, claimed) for c in devices.list_channels(paths.channel_dir)]
    stale = [f"job {j['job_id']}: {why}" for j in jobs for why in j["stale"]]
    stale += [f"channel {c['path']}: not owned by any job" for c in channels if c["stale"]]
    return {
        "node": node,
        # the config file this status read: the one the hooks read under slurmd (None: built-in defaults)
        "config": str(rt.settings.source) if rt.settings.source else None,
        "owner_job": jobs[0]["job_id"] if len(jobs) == 1 else None,
        "fabric": _fabric(rt, node) if nvml else None,
        "jobs": jobs,
        "channels": channels,
        "stale": stale,
    }


def _fabric(rt: Runtime, node: str) -> dict[str, Any] | None:
    """The tray's NVLink domain key and fabric health (one NVML read, no wait); None with ``fabric = none``."""
    if rt.settings.policy.fabric != "nvml":
        return None
    from imexctl.gpu.topology import read_tray

    tray = read_tray(rt.gpu, node)
    return {"fabric": tray.fabric, "key": tray.key, "health": tray.health, "reason": tray.reason, "error": tray.error}


def _job(job_id: int, rt: Runtime) -> dict[str, Any]:
    jd = rt.settings.paths.job(job_id)
    state = read_state(jd)
    out: dict[str, Any] = {"job_id": job_id, "job_dir": str(jd.path), "stale": []}
    out["daemon"], daemon_up = _daemon(jd, state, rt)
    if state is not None:
        out.update(
            user=state.user,
            uid=state.uid,
            port=state.port,
            cmd_port=state.cmd_port,
            trays=list(state.nodes),
            addresses=list(state.addresses),
        )
        if state.channel_minor is not None:
            out["channel"] = {"path": state.channel_path, "minor": state.channel_minor}
    out["nodes_config"] = _read(jd.nodes)
    out["domain"] = _domain(jd.config, rt) if daemon_up else None
    out["running"] = still_runs(job_id, rt).runs  # cleanup's rule: a set-up domain without a step counts
    out["lost"] = _lost(state, daemon_up, out["daemon"])
    if not out["running"]:
        out["stale"].append("job no longer runs on this node")
    if not daemon_up:
        # one entry per fact, each its own fixed text (the faults' soak and scripts match them whole)
        out["stale"].append("no daemon process")
    if out["lost"]:
        out["stale"].append("daemon lost: it ended before the job")
    if not jd.exists():
        out["stale"].append("daemon without job directory")
    return out


def _daemon(jd: JobDir, state: JobState | None, rt: Runtime) -> tuple[dict[str, Any], bool]:
    """What the backend says of the job's daemon, its pid and uptime from ``/proc``; and whether it runs.

    Whether it runs is the one rule (``daemon.daemon_runs``): a daemon that
    ``/proc`` no longer ties to the program (its executable moved under it)
    runs while its backend says so, and a backend that cannot be asked counts
    as running.
    """
    host, s = rt.host, rt.settings
    backend = daemon.make_backend(host, s, state.backend if state else None)
    try:
        said = backend.info(jd)._asdict()
    except ImexctlError as exc:
        said = {"error": str(exc)}
    # with systemd, the unit's main process is the daemon whatever it runs (a site's wrapper)
    main = (said.get("pid") or 0) if said.get("backend") == "systemd" else 0
    procs = daemon.job_processes(host, s, jd.config, main_pid=main)
    if procs:
        said["pid"] = procs[0].pid
        # both on the boot clock: a stepped wall clock changes neither; never negative
        said["uptime_s"] = round(max(0.0, host.since_boot() - procs[0].create_time), 1)
    return said, bool(procs) or said.get("running") is True or "error" in said


def _lost(state: Any, daemon_up: bool, info: dict[str, Any]) -> bool:
    """The epilog's rule (``imex.daemon.lost``), asked now: a set-up domain, not ended here, without its daemon.

    A prolog still at work (no ``set_up`` mark) or an epilog at work (``ended``) is no loss, and neither is a
    daemon the backend could not be asked about.
    """
    if state is None or not state.set_up or state.ended or state.backend == "none" or daemon_up:
        return False
    return not info.get("running", False) and "error" not in info


def _domain(config: Path, rt: Runtime) -> dict[str, Any]:
    from imexctl.imex import ctl as ctloutput

    argv = (rt.settings.commands.nvidia_imex_ctl, "-c", str(config), "-N", "-j")
    try:
        done = rt.host.run(argv, timeout_s=rt.settings.readiness.ctl_timeout_s)
        dom = ctloutput.parse_domain_json(done.stdout)
    except (CommandError, ImexctlError) as exc:
        return {"error": str(exc)}
    return {
        "status": dom.status,
        "nodes": [
            {
                "id": n.node_id,
                "host": n.host,
                "status": n.status,
                "version": n.version,
                "connections": {str(c.peer_id): c.status for c in n.connections},
            }
            for n in dom.nodes
        ],
    }


def _channel(c: devices.Channel, claimed: Any) -> dict[str, Any]:
    import pwd

    try:
        owner = pwd.getpwuid(c.uid).pw_name
    except KeyError:
        owner = str(c.uid)
    return {
        "path": str(c.path),
        "minor": c.minor,
        "owner": owner,
        "uid": c.uid,
        "mode": f"{c.mode:04o}",
        "stale": c.minor not in claimed and c.minor != 0,
    }


def _read(path: Path) -> list[str]:
    try:
        return read_text_nofollow(path).split()
    except OSError:
        return []


def _fabric_line(fabric: dict[str, Any] | None) -> str:
    if fabric is None:
        return "NVLink domain: not checked ([policy] fabric = none)"
    if fabric["key"]:
        return f"NVLink domain: {fabric['key']}, fabric health {fabric['health']}"
    if fabric["error"]:
        return f"NVLink domain: unknown ({fabric['error']})"
    return f"NVLink domain: none (no multi-node NVLink fabric: {fabric['reason']})"


def render_text(st: dict[str, Any]) -> str:
    """Human-readable status."""
    config = st.get("config") or "none (built-in defaults)"
    lines = [f"node: {st['node']}", f"config: {config}", _fabric_line(st["fabric"])]
    lines.append(f"owner job: {st['owner_job'] if st['owner_job'] is not None else '-'}")
    if not st["jobs"]:
        lines.append("no IMEX domain on this node")
    for j in st["jobs"]:
        d = j.get("daemon", {})
        lines.append(
            f"job {j['job_id']} (user {j.get('user', '?')}, port {j.get('port', '?')}, "
            f"command port {j.get('cmd_port', '?')}, "
            f"{'running' if j['running'] else 'not running'})"
        )
        what = " ".join(
            str(x) for x in (d.get("backend", "?"), d.get("unit"), d.get("state", d.get("error", "?"))) if x
        )
        lines.append(f"  daemon: {what}, pid {d.get('pid', '-')}, uptime {d.get('uptime_s', '-')}s")
        lines.append(f"  nodes_config: {' '.join(j['nodes_config']) or '-'}")
        dom = j.get("domain")
        if dom and "status" in dom:
            lines.append(f"  domain: {dom['status']}")
            for n in dom["nodes"]:
                conns = " ".join(f"{k}:{v}" for k, v in sorted(n["connections"].items()))
                lines.append(f"    node {n['id']} {n['host']} {n['status']} v{n['version']}  {conns}")
        elif dom:
            lines.append(f"  domain: unknown ({dom['error']})")
    lines += [
        f"channel {c['path']} minor {c['minor']} owner {c['owner']} mode {c['mode']}" + (" STALE" if c["stale"] else "")
        for c in st["channels"]
    ]
    lines += [f"stale: {s}" for s in st["stale"]] or ["stale: nothing"]
    return "\n".join(lines) + "\n"


def _live(rt: Runtime, node: str) -> str:
    """The live gauges' text (``--prometheus``, ``--textfile``): NVML is asked only when no topology names the block."""
    from imexctl.commands import live
    from imexctl.hooks import members

    try:
        source = members.load_source(rt.settings)
    except ImexctlError:
        source = None  # the prolog says what is wrong with it; the gauges still come
    block = members.block_label(node, source, None)
    data = collect(rt, node, nvml=not block)
    if not block and data["fabric"] is not None:
        block = members.block_label(node, None, data["fabric"]["key"])
    return live.render(live.live_of(data, block), rt.host.time())


def write_textfile(rt: Runtime, node: str) -> Path:
    """Replace ``<textfile_dir>/imexctl-live.prom`` atomically (``status --textfile``: the live-gauge timer).

    Raises:
        ConfigError: ``[metrics] textfile_dir`` is not set.
        FileError: the file cannot be written (a missing directory, a full disk).
    """
    from imexctl.commands import live
    from imexctl.platform.errors import ConfigError, FileError
    from imexctl.platform.fsutil import atomic_write

    target = live.textfile(rt.settings)
    if target is None:
        raise ConfigError("status --textfile: [metrics] textfile_dir is not set (docs/metrics.md)")
    text = _live(rt, node)
    try:
        from imexctl.hooks.metrics import check_textfile_dir

        check_textfile_dir(target.parent)
        atomic_write(target, text, mode=0o644)
    except OSError as exc:
        raise FileError(f"{target}: {exc.strerror or exc}") from exc
    return target


def command(args: argparse.Namespace, rt: Runtime, node: str) -> int:
    """``imexctl status``: text, ``--json`` (the result envelope), ``--prometheus`` or ``--textfile`` (live gauges)."""
    if getattr(args, "textfile", False):
        write_textfile(rt, node)
        return 0
    if args.prometheus:
        sys.stdout.write(_live(rt, node))
        return 0
    data = collect(rt, node)
    if args.json:
        print_json(data)
    else:
        sys.stdout.write(render_text(data))
    return 0
