"""``imexctl doctor``'s checks of the tray: IMEX binaries, units, driver and channels; ports; NVML.

systemd is asked through the ``Host`` seam (``[commands] systemctl``, with a
timeout), never by a shell.  Kernel facts come from files under ``[paths]
root``: ``/proc/devices``, ``/proc/driver/nvidia/params`` and ``version``,
``/proc/sys/net/ipv4/ip_local_port_range``, ``ip_local_reserved_ports`` and
``/proc/net/tcp``/``tcp6``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Final

from imexctl.channels import devices
from imexctl.doctor import dcgm
from imexctl.doctor.framework import FAIL, OK, WARN, Check, Context, under_root
from imexctl.hooks.state import job_ids, read_state
from imexctl.imex import daemon
from imexctl.platform.errors import CommandError, ConfigError, DeviceError
from imexctl.platform.fsutil import read_text_nofollow
from imexctl.platform.host import read_tcp_sockets

if TYPE_CHECKING:
    from imexctl.gpu.fabric import Gpu
    from imexctl.gpu.topology import GpuReport, TrayFabric

__all__ = [
    "driver_version",
    "imex_checks",
    "imex_version",
    "nvml_checks",
    "parse_listening",
    "parse_port_set",
    "port_checks",
]

#: ``nvidia-imex --version`` prints ``IMEX version is: 580.105.08`` (design.md source imex-version)
_IMEX_VERSION: Final = re.compile(r"IMEX version is:\s*(\S+)")
#: the driver's version in ``/proc/driver/nvidia/version`` ("NVRM version: ... Kernel Module  570.124.06  ...")
_DRIVER_VERSION: Final = re.compile(r"NVRM version:.*?\s(\d+\.\d+(?:\.\d+)*)\s")
_FIREWALL: Final = "both [ports] ranges must be open (TCP) between the trays of a rack, and only there"
_SYSTEMCTL_TIMEOUT_S: Final = 10.0


# ---------------------------------------------------------------- IMEX


def imex_checks(ctx: Context) -> list[Check]:
    """The binaries, their version against the driver, the systemd units, DCGM's view, the channel device."""
    out = [_binaries(ctx), _version(ctx), _held(ctx), *_units(ctx), _dcgm(ctx)]
    if ctx.rt.settings.policy.channels == "job":
        out += [_channel_device(ctx), _channel_count(ctx)]
    return out


def _binaries(ctx: Context) -> Check:
    c = ctx.rt.settings.commands
    missing = [path for path in (c.nvidia_imex, c.nvidia_imex_ctl) if not _executable(path)]
    if missing:
        fix = "install NVIDIA's nvidia-imex package of the driver's version, or set [commands] to where it is"
        return Check("imex.binaries", FAIL, f"missing or not executable: {', '.join(missing)}", fix)
    return Check("imex.binaries", OK, f"{c.nvidia_imex} and {c.nvidia_imex_ctl} are executable")


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _version(ctx: Context) -> Check:
    """``nvidia-imex --version`` must equal the loaded driver's version (the daemon aborts otherwise)."""
    imex = ctx.rt.settings.commands.nvidia_imex
    driver = driver_version(ctx.rt.settings.paths.nvidia_params.parent / "version")
    if not _executable(imex):
        return Check("imex.version", WARN, f"not checked: {imex} is missing", "see imex.binaries")
    try:
        done = ctx.rt.host.run((imex, "--version"), timeout_s=_SYSTEMCTL_TIMEOUT_S)
        found = imex_version(done.stdout + done.stderr)
    except CommandError as exc:
        return Check("imex.version", WARN, f"{imex} --version: {exc}", "run it by hand to see why")
    if found is None:
        return Check("imex.version", WARN, f"{imex} --version printed no 'IMEX version is:' line", "")
    if driver is None:
        why = f"nvidia-imex {found}; the driver's version is unknown (no NVIDIA driver loaded?)"
        return Check("imex.version", WARN, why, "load the NVIDIA driver (nvidia-smi shows its version)")
    if found != driver:
        why = f"nvidia-imex {found} but the driver is {driver}: the daemon refuses to start"
        return Check("imex.version", FAIL, why, f"install nvidia-imex {driver} (the same version as the driver)")
    return Check("imex.version", OK, f"nvidia-imex {driver} matches the driver")


#: NVIDIA's package of the daemon: ``nvidia-imex`` from driver 580 on, ``nvidia-imex-<branch>`` before (imex.md 1.1)
_IMEX_PACKAGE: Final = re.compile(r"nvidia-imex(?:-\d+)?")
#: a ``dnf versionlock`` line: ``nvidia-imex-0:580.105.08-1.el9.*`` or ``nvidia-imex-580-580.95.05-1.el9.*``
_VERSIONLOCK: Final = re.compile(r"^!?(nvidia-imex(?:-\d+)?)-(?:\d+:)?(\d+\.\d+(?:\.\d+)*)-", re.MULTILINE)


def _held(ctx: Context) -> Check:
    """``nvidia-imex`` held at the driver's version: an unattended upgrade of it alone stops every daemon.

    dpkg's status file says whether ``apt-mark hold`` holds the package (``Status: hold ...``); an RPM
    system's ``dnf versionlock`` list names the locked version.  Both are read under ``[paths] root``.
    """
    driver = driver_version(ctx.rt.settings.paths.nvidia_params.parent / "version")
    dpkg = _read_or_empty(under_root(ctx, "/var/lib/dpkg/status"))
    locks = _read_or_empty(under_root(ctx, "/etc/dnf/plugins/versionlock.list"))
    found = _dpkg_imex(dpkg)
    if found is not None:
        name, version, held = found
        fix = f"apt-mark hold {name} (and upgrade it with the driver, to the same version)"
        if not held:
            why = f"{name} {version} is not held: an unattended upgrade of it or of the driver alone stops every daemon"
            return Check("imex.held", WARN, why, fix)
        return _held_version(name, version, driver, "held (apt-mark)", fix)
    lock = _VERSIONLOCK.search(locks)
    if lock is not None:
        name, version = lock.group(1), lock.group(2)
        return _held_version(name, version, driver, "locked (dnf versionlock)", f"dnf versionlock add {name}")
    if _rpm_system(ctx):
        why = "nvidia-imex is not in dnf's versionlock list: an upgrade of it or of the driver alone stops every daemon"
        return Check(
            "imex.held", WARN, why, "dnf versionlock add nvidia-imex (dnf install python3-dnf-plugin-versionlock)"
        )
    return Check("imex.held", OK, "not checked: no dpkg status or dnf versionlock list names nvidia-imex here")


def _held_version(name: str, version: str, driver: str | None, how: str, fix: str) -> Check:
    if driver is not None and version.split("-", 1)[0] != driver:
        why = f"{name} is {how} at {version}, but the driver is {driver}: the daemon refuses to start"
        return Check("imex.held", FAIL, why, f"upgrade {name} to {driver}, then hold it again ({fix})")
    return Check(
        "imex.held", OK, f"{name} {version} is {how}" + (f" at the driver's version {driver}" if driver else "")
    )


def _dpkg_imex(status: str) -> tuple[str, str, bool] | None:
    """(package, version, held) of an installed ``nvidia-imex`` or ``nvidia-imex-<branch>`` in dpkg's status."""
    for stanza in status.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and not line[0].isspace())
        name, state = fields.get("Package", ""), fields.get("Status", "").split()
        if _IMEX_PACKAGE.fullmatch(name) and state[-1:] == ["installed"]:
            return name, fields.get("Version", "?"), state[0] == "hold"
    return None


def _rpm_system(ctx: Context) -> bool:
    return under_root(ctx, "/var/lib/rpm").is_dir() and not under_root(ctx, "/var/lib/dpkg/status").exists()


def imex_version(output: str) -> str | None:
    """The version ``nvidia-imex --version`` printed (None without its line)."""
    found = _IMEX_VERSION.search(output)
    return found.group(1) if found else None


def driver_version(path: Path) -> str | None:
    """The loaded driver's version from ``/proc/driver/nvidia/version`` (None when unreadable or unknown)."""
    try:
        found = _DRIVER_VERSION.search(read_text_nofollow(path))
    except OSError:
        return None
    return found.group(1) if found else None


def _units(ctx: Context) -> list[Check]:
    """The stock nvidia-imex.service off (any backend); with the systemd backend, our template unit right."""
    s = ctx.rt.settings
    stock, unit = s.daemon.stock_unit, f"{s.daemon.unit}@1.service"
    argv = (s.commands.systemctl, "show", "--property=Id,LoadState,UnitFileState,ActiveState,ExecStart", "--")
    try:
        done = ctx.rt.host.run((*argv, stock, unit), timeout_s=_SYSTEMCTL_TIMEOUT_S)
        problem = "" if done.returncode == 0 else f"exit {done.returncode}: {done.stderr.strip()}"
    except CommandError as exc:
        problem = str(exc)
    if problem:
        fix = "run doctor where systemd runs; without systemd use [daemon] backend = exec"
        return [Check("imex.stock_unit", WARN, f"cannot ask systemd: {problem}", fix)]
    shown = daemon.parse_systemctl_show(done.stdout)
    systemd = s.daemon.backend == "systemd"
    return [_stock(stock, shown.get(stock, {}), systemd=systemd), _template(ctx, unit, shown.get(unit, {}))]


def _stock(stock: str, props: dict[str, str], *, systemd: bool) -> Check:
    """The stock unit: never running nor enabled; with the systemd backend, masked.

    The job units say ``Conflicts=<stock>``: whatever starts the stock unit (a
    package script, site automation, an admin) stops every job's daemon on
    the tray.  Only a masked unit cannot be started (issue 22).
    """
    active, enabled = props.get("ActiveState", "?"), props.get("UnitFileState", "")
    fix = f"systemctl disable --now {stock} && systemctl mask {stock}"
    if props.get("LoadState") == "not-found":
        return Check("imex.stock_unit", OK, f"{stock} is not installed")
    if active in ("active", "activating", "reloading"):
        why = "it runs one domain-wide daemon, and every prolog refuses to start a job's daemon beside it"
        return Check("imex.stock_unit", FAIL, f"{stock} is {active}: {why}", fix)
    if enabled.startswith("enabled") or enabled in ("linked", "alias"):
        return Check("imex.stock_unit", FAIL, f"{stock} is {enabled}: it starts at the next boot", fix)
    masked = props.get("LoadState") == "masked" or enabled.startswith("masked")
    if systemd and not masked:
        why = f"starting it (a package script, site automation) stops every job's daemon here (Conflicts={stock})"
        return Check("imex.stock_unit", FAIL, f"{stock} is {enabled or 'installed'} but not masked: {why}", fix)
    return Check("imex.stock_unit", OK, f"{stock} is {enabled or props.get('LoadState', '?')} and {active}")


def _template(ctx: Context, unit: str, props: dict[str, str]) -> Check:
    s = ctx.rt.settings
    if s.daemon.backend != "systemd":
        return Check("imex.unit", OK, "not used: [daemon] backend = exec")
    want = f"{s.commands.nvidia_imex} -c {s.paths.job(1).config} "
    if props.get("LoadState") != "loaded":
        fix = f"install systemd/{s.daemon.unit}@.service into /etc/systemd/system and systemctl daemon-reload"
        return Check("imex.unit", FAIL, f"{unit}: {props.get('LoadState', 'not loaded')}", fix)
    if f"argv[]={want}" not in props.get("ExecStart", "") + " ":
        fix = "make ExecStart match [paths] run_dir and [commands] nvidia_imex (a drop-in; docs/install.md)"
        return Check("imex.unit", FAIL, f"{unit} does not run '{want.strip()}'", fix)
    return Check("imex.unit", OK, f"{unit} runs '{want.strip()}'")


#: what NVIDIA's tools read without ``-c``: nvidia-imex-ctl's default config, the shipped file's nodes file
DEFAULT_CONFIG: Final = "/etc/nvidia-imex/config.cfg"
DEFAULT_NODES: Final = "/etc/nvidia-imex/nodes_config.cfg"


def _dcgm(ctx: Context) -> Check:
    """What DCGM makes of IMEX here: its IMEX fields (``_dcgm_imex``), and the settings of its version.

    The DCGM part (:mod:`imexctl.doctor.dcgm`) names the installed version and the shipped settings of its
    range; it WARNs only when several versions leave it unknown which one runs.  The IMEX part's fix comes first.
    """
    imex = _dcgm_imex(ctx)
    status, said, fix = dcgm.judge(dcgm.find(ctx.rt.settings.paths.root))
    worst = FAIL if FAIL in (imex.status, status) else WARN if WARN in (imex.status, status) else OK
    return Check("imex.dcgm", worst, f"{imex.message}; {said}", imex.fix or fix)


def _dcgm_imex(ctx: Context) -> Check:
    """What DCGM's IMEX fields read on this tray: it runs ``nvidia-imex-ctl -N -j`` and ``-q`` without ``-c``.

    Against the default config, with no nodes file it can read, the ctl exits
    255 saying "Failed to read node configuration file": DCGM takes the exit
    for a command error, so the domain field reads UNAVAILABLE (which passes)
    and the daemon field -3 (incident 122, on every tray without the stock
    daemon, idle or in a job).  A readable default nodes file makes ``-N``
    ask those trays' command ports, where nothing answers: the domain reads
    DOWN or DEGRADED, incident 122 for the domain too (design.md source dcgm-imex).
    """
    config = under_root(ctx, DEFAULT_CONFIG)
    try:
        with open(config, encoding="utf-8", errors="replace") as f:  # the ctl follows a link: so does this
            text = f.read()
    except FileNotFoundError:
        why = f"no {DEFAULT_CONFIG}: nvidia-imex-ctl without -c cannot read one"
        return Check("imex.dcgm", OK, f"{why}; {_DCGM_IDLE}")
    except OSError as exc:
        return Check("imex.dcgm", WARN, f"cannot read {DEFAULT_CONFIG}: {exc.strerror}", "run doctor as root")
    named = [line.split("=", 1)[1].strip() for line in text.splitlines() if line.startswith("IMEX_NODE_CONFIG_FILE=")]
    nodes = (named[-1] if named else "") or DEFAULT_NODES
    found = under_root(ctx, nodes)
    if not os.path.exists(found):
        return Check("imex.dcgm", OK, f"{DEFAULT_CONFIG} names {nodes}, which is absent: {_DCGM_IDLE}")
    entries = _lines(found)
    why = (
        f"{nodes} ({entries}), named by {DEFAULT_CONFIG}, is readable: nvidia-imex-ctl -N -j without -c (DCGM's) "
        "asks those trays' command ports, where no stock daemon answers, so DCGM reads the IMEX domain DOWN or "
        "DEGRADED (field 1502, incident 122) on an idle tray"
    )
    fix = f"move it away (mv {nodes} {nodes}.unused): imexctl writes each job's nodes file under [paths] run_dir"
    return Check("imex.dcgm", WARN, why, fix)


_DCGM_IDLE = (
    "DCGM reads the IMEX domain UNAVAILABLE (field 1502, passes) and the daemon -3 (field 1503, incident 122 from "
    "DCGM 4.5 on, on every tray without the stock daemon: docs/metrics.md)"
)


def _lines(path: Path) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            count = sum(1 for line in f if line.strip())
    except OSError as exc:
        return f"unreadable: {exc.strerror}"
    return f"{count} entries" if count != 1 else "1 entry"


def _channel_device(ctx: Context) -> Check:
    path = ctx.rt.settings.paths.proc_devices
    try:
        major = devices.read_major(path)
    except DeviceError as exc:
        fix = "load the NVIDIA driver with NVreg_ImexChannelCount > 0, or set [policy] channels = none"
        return Check("imex.channel_device", FAIL, str(exc), fix)
    return Check("imex.channel_device", OK, f"{devices.DEVICE_NAME} has major {major} in {path}")


def _channel_count(ctx: Context) -> Check:
    """The driver's channel count against ``[policy] channel_count``, and the topology source's cliques against both.

    WARNs when a clique has as many trays as channels (its numbers wrap) and
    when a block has no NVLink domain key (the whole file is then one clique).
    """
    s = ctx.rt.settings
    try:
        count = devices.driver_channel_count(s.paths.nvidia_params)
    except DeviceError as exc:
        return Check("imex.channel_count", FAIL, str(exc), "check the NVIDIA driver")
    wanted = s.policy.channel_count
    if count is not None and count < wanted:
        why = (
            f"NVreg_ImexChannelCount={count} but [policy] channel_count = {wanted}: jobs whose minor is >= {count} fail"
        )
        return Check("imex.channel_count", FAIL, why, f"set [policy] channel_count = {count}")
    problems, fixes = [], []
    if count is None:
        problems.append(f"{s.paths.nvidia_params} gives no ImexChannelCount; channel minors up to {wanted - 1} are "
                        "not checked")  # fmt: skip
        fixes.append("load the NVIDIA driver")
    clique, keyless, where = _cliques(ctx)
    if clique >= wanted:
        problems.append(
            f"the topology source's largest NVLink clique has {clique} trays, [policy] channel_count = {wanted} gives "
            f"{wanted - 1} channels: two domains of one clique can get the same channel (design.md, the channel rule)"
        )
        fixes.append(f"raise NVreg_ImexChannelCount and channel_count above {clique}")
    if keyless:
        problems.append(
            f"{_few(keyless)} of {where} {'has' if len(keyless) == 1 else 'have'} no NVLink domain key (no "
            "imexctl-key comment, and [paths] topology_map does not name every tray of it): which blocks share an "
            f"NVLink clique is unknown, so all {clique} trays of the file count as one clique for the channel numbers"
        )
        fixes.append(
            "regenerate the file with its keys (imexctl topology blocks), or set [paths] topology_map "
            "(imexctl topology blocks --map)"
        )
    if problems:
        return Check("imex.channel_count", WARN, "; ".join(problems), "; ".join(fixes))
    return Check("imex.channel_count", OK, f"NVreg_ImexChannelCount={count} covers [policy] channel_count = {wanted}")


def _cliques(ctx: Context) -> tuple[int, list[str], str]:
    """The trays of the topology source's largest clique, its blocks without a key, and its file.

    ``(0, [], '')`` without a source; a broken source or map is another check's (``slurm.topology``).
    """
    from imexctl.hooks import members

    try:
        source = members.load_source(ctx.rt.settings)
        key_map = members.load_map(ctx.rt.settings) if source is not None else None
    except ConfigError:
        return 0, [], ""
    if source is None:
        return 0, [], ""
    return members.largest_clique(source, key_map), members.keyless_blocks(source, key_map), source.source


def _few(blocks: list[str]) -> str:
    """``block r1``, ``blocks r1, r2``, ``blocks r1, r2, r3 and 4 others``."""
    shown = ", ".join(blocks[:3]) + (f" and {len(blocks) - 3} others" if len(blocks) > 3 else "")
    return f"block{'s' if len(blocks) > 1 else ''} {shown}"


# ---------------------------------------------------------------- ports


def port_checks(ctx: Context) -> list[Check]:
    """The port ranges against the kernel's ephemeral range, listeners in them now, and the port guard."""
    return [_ephemeral(ctx), _listening(ctx), _guard(ctx)]


def parse_port_set(text: str) -> list[tuple[int, int]]:
    """``ip_local_reserved_ports``: ``8080,61000-61999`` (empty: none) as ``(low, high)`` pairs."""
    out = []
    for part in text.strip().split(","):
        if part.strip():
            lo, _, hi = part.strip().partition("-")
            out.append((int(lo), int(hi or lo)))
    return out


def _ephemeral(ctx: Context) -> Check:
    base = under_root(ctx, "/proc/sys/net/ipv4")
    try:
        lo, hi = (int(v) for v in read_text_nofollow(base / "ip_local_port_range").split())
        reserved = parse_port_set(_read_or_empty(base / "ip_local_reserved_ports"))
    except (OSError, ValueError) as exc:
        return Check("ports.ephemeral", WARN, f"cannot read the kernel's port ranges: {exc}", _FIREWALL)
    p = ctx.rt.settings.ports
    clashes = []
    for key, (a, b) in (("server_port_range", p.server_port_range), ("cmd_port_range", p.cmd_port_range)):
        free = [n for n in range(max(a, lo), min(b, hi) + 1) if not any(r0 <= n <= r1 for r0, r1 in reserved)]
        if free:
            clashes.append(
                f"[ports] {key} {a}-{b} overlaps the ephemeral range {lo}-{hi} ({len(free)} ports unreserved)"
            )
    if clashes:
        fix = f"move the ranges out of {lo}-{hi} or add them to net.ipv4.ip_local_reserved_ports; {_FIREWALL}"
        return Check(
            "ports.ephemeral", FAIL, "; ".join(clashes) + ": an outgoing connection can take a job's port", fix
        )
    return Check("ports.ephemeral", OK, f"no [ports] range meets the ephemeral range {lo}-{hi}; {_FIREWALL}")


def _read_or_empty(path: Path) -> str:
    try:
        return read_text_nofollow(path)
    except FileNotFoundError:
        return ""


def parse_listening(text: str) -> set[int]:
    """Local ports in state LISTEN (``0A``) of a ``/proc/net/tcp`` or ``tcp6`` table."""
    ports = set()
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 3 and fields[3] == "0A":
            ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _listening(ctx: Context) -> Check:
    """Listeners in the ``[ports]`` ranges that are no job's daemon, each named as the prolog names it.

    root's (a service, a stale daemon) FAIL: every job mapped to the port
    fails.  A local user's WARN: it is no fault of the tray, and the port
    guard (``ports.guard``) is what keeps users off the ranges.  Loopback
    listeners are left out: the prolog binds the tray's own address, which
    is never loopback.
    """
    from imexctl.hooks import portholder

    s = ctx.rt.settings
    ranges = (s.ports.server_port_range, s.ports.cmd_port_range)
    ports = {n for a, b in ranges for n in range(a, b + 1)}
    root = str(under_root(ctx, "/"))
    found = read_tcp_sockets(ports, proc=str(under_root(ctx, "/proc")), passwd=str(under_root(ctx, "/etc/passwd")))
    if found is None:
        why = f"cannot read {root.rstrip('/')}/proc/net/tcp or tcp6"
        return Check("ports.listening", WARN, why, "run doctor as root")
    ours = {
        port for j in job_ids(s.paths.jobs_dir) if (st := read_state(s.paths.job(j))) for port in (st.port, st.cmd_port)
    }
    roots: list[str] = []
    users: list[str] = []
    for sock in found:
        if sock.state != "LISTEN" or _loopback(sock.address):
            continue
        holder = portholder.judge(sock, s, ctx.rt.host.euid())
        if sock.port in ours and holder.kind in (portholder.DAEMON, portholder.UNKNOWN):
            continue  # a running job's own daemon (unknown: its process unreadable to a doctor that is not root)
        line = f"{sock.address}:{sock.port} held by {holder.text}"
        (roots if holder.uid == 0 or holder.kind == portholder.DAEMON else users).append(line)
    if roots:
        why = f"listeners in the [ports] ranges that are no job's daemon: {_listed(roots)}; jobs mapped there fail"
        return Check("ports.listening", FAIL, why, "stop them (a stale daemon: imexctl cleanup), or move the ranges")
    if users:
        why = (
            f"local users listen in the [ports] ranges: {_listed(users)}; a job mapped there fails its prolog "
            "(port_held) and drains the tray"
        )
        return Check("ports.listening", WARN, why, f"end them, and keep users off the ranges with {portholder.GUARD}")
    return Check("ports.listening", OK, "nothing but the jobs' own daemons listens in the [ports] ranges")


def _loopback(address: str) -> bool:
    return address.startswith("127.") or address == "::1"


def _listed(lines: list[str], most: int = 5) -> str:
    return "; ".join(lines[:most]) + (f"; and {len(lines) - most} more" if len(lines) > most else "")


#: the unit whose processes the port guard must keep off the [ports] ranges: every login
GUARDED: Final = "user.slice"
#: the unit it may guard too: cgroup/v2 Slurm's job steps (its plugin's scope: SchedMD/slurm
#: src/plugins/cgroup/v2/cgroup_v2.c; design.md source slurm-stepd-scope). Not required: imexctl netcheck binds
#: the ranges from a job step, and proctrack/cgroup ends a job's processes with the job
JOBS_SCOPE: Final = "slurmstepd.scope"
#: where systemd reads a unit's drop-ins (``<dir>/<unit>.d/*.conf``); a file name in an earlier one hides it later
_DROPIN_DIRS: Final = (
    "/etc/systemd/system.control",
    "/run/systemd/system.control",
    "/etc/systemd/system",
    "/run/systemd/system",
    "/usr/local/lib/systemd/system",
    "/usr/lib/systemd/system",
    "/lib/systemd/system",
)
#: a SocketBindAllow=/SocketBindDeny= rule as written in a unit file or as ``systemctl show`` prints it
#: (``tcp61000-62999``, ``ipv4:tcp:61000-61999``, ``ipv6``, ``any``): systemd.resource-control(5)
_BIND_RULE: Final = re.compile(r"(?:(ipv4|ipv6):?)?(?:(tcp|udp):?)?(?:(\d+)(?:-(\d+))?)?", re.IGNORECASE)


def _guard(ctx: Context) -> Check:
    """The port guard: does systemd refuse bind() in the ``[ports]`` ranges to every login (issue 41)?

    Read live: ``systemctl --version`` (SocketBindDeny= needs systemd built
    with BPF_FRAMEWORK), a unified cgroup hierarchy, and :data:`GUARDED` by
    ``systemctl show``, against the configured ranges, TCP over IPv4 and
    IPv6.  :data:`JOBS_SCOPE` is judged only when it has a rule (a scope that
    does not run now: by its drop-in files): one that leaves ports open WARNs,
    none is said in the OK line.
    """
    s = ctx.rt.settings
    ranges = (s.ports.server_port_range, s.ports.cmd_port_range)
    shown = f"{ranges[0][0]}-{ranges[0][1]} and {ranges[1][0]}-{ranges[1][1]}"
    fix = (
        "install the port guard with these ranges (/usr/share/imexctl/systemd/port-guard.slice.conf as "
        "/etc/systemd/system/user.slice.d/imexctl-port-guard.conf, docs/install.md, or the Ansible role's "
        "imexctl_port_guard) on a systemd built with BPF_FRAMEWORK"
    )
    props = "--property=Id,LoadState,SocketBindAllow,SocketBindDeny"
    try:
        version = ctx.rt.host.run((s.commands.systemctl, "--version"), timeout_s=_SYSTEMCTL_TIMEOUT_S)
        show = (s.commands.systemctl, "show", props, "--", GUARDED, JOBS_SCOPE)
        done = ctx.rt.host.run(show, timeout_s=_SYSTEMCTL_TIMEOUT_S)
        problem = "" if done.returncode == 0 else f"exit {done.returncode}: {done.stderr.strip()}"
    except CommandError as exc:
        problem = str(exc)
    if problem:
        why = f"cannot ask systemd ({problem}): no port guard known, and a local user can hold a job's port"
        return Check("ports.guard", WARN, why, fix)
    first = (version.stdout.splitlines() or ["systemd"])[0].strip()
    problems, jobs_open = _guard_problems(ctx, version.stdout, _shown_units(done.stdout), ranges)
    if problems:
        why = "; ".join(problems) + f": a local user can hold a job's port in {shown} and fail its prolog (port_held)"
        return Check("ports.guard", WARN, why, fix)
    scope = (
        f"{JOBS_SCOPE} too" if not jobs_open else f"{JOBS_SCOPE} does not (the jobs' steps; optional, docs/security.md)"
    )
    return Check("ports.guard", OK, f"{GUARDED} refuses bind() in {shown} ({first}, BPF_FRAMEWORK); {scope}")


def _guard_problems(
    ctx: Context, version: str, found: dict[str, dict[str, list[str]]], ranges: tuple[tuple[int, int], ...]
) -> tuple[list[str], str]:
    """What keeps the guard from holding (systemd's build, cgroups, the rules), and what the jobs' scope leaves open."""
    problems = []
    first = (version.splitlines() or ["systemd"])[0].strip()
    if "+BPF_FRAMEWORK" not in version.split():
        problems.append(f"{first} is built without BPF_FRAMEWORK: it takes SocketBindDeny= and enforces nothing")
    if not any(under_root(ctx, d).joinpath("cgroup.controllers").exists() for d in _UNIFIED):
        problems.append("no unified cgroup hierarchy: systemd enforces no SocketBindDeny=")
    rules = {}
    for unit in (GUARDED, JOBS_SCOPE):  # a unit that does not run now (a scope slurmd has not made): its drop-ins
        loaded = found.get(unit, {}).get("LoadState", [""])[0] == "loaded"
        rules[unit] = found[unit] if loaded else _dropin_rules(ctx, unit)
    open_to = _unguarded(rules[GUARDED].get("SocketBindDeny", []), rules[GUARDED].get("SocketBindAllow", []), ranges)
    if open_to:
        problems.append(f"{GUARDED} lets its processes bind {open_to}")
    jobs = rules[JOBS_SCOPE]
    jobs_open = _unguarded(jobs.get("SocketBindDeny", []), jobs.get("SocketBindAllow", []), ranges)
    if jobs.get("SocketBindDeny") and jobs_open:
        problems.append(f"{JOBS_SCOPE} has a rule that lets its processes bind {jobs_open}")
    return problems, jobs_open


#: where a unified (cgroup v2) hierarchy is mounted: alone, or beside v1 (hybrid)
_UNIFIED: Final = ("/sys/fs/cgroup", "/sys/fs/cgroup/unified")


def _shown_units(text: str) -> dict[str, dict[str, list[str]]]:
    """``systemctl show`` of several units: unit -> property -> every value (a list property: one line each)."""
    units: dict[str, dict[str, list[str]]] = {}
    for block in text.split("\n\n"):
        props: dict[str, list[str]] = {}
        for line in block.splitlines():
            key, sep, value = line.partition("=")
            if sep:
                props.setdefault(key, []).append(value)
        if props.get("Id"):
            units[props["Id"][0]] = props
    return units


def _dropin_rules(ctx: Context, unit: str) -> dict[str, list[str]]:
    """SocketBindAllow=/SocketBindDeny= of ``unit``'s drop-in files (a unit not loaded now: a scope to come)."""
    files: dict[str, Path] = {}
    for base in _DROPIN_DIRS:
        try:
            for path in sorted(under_root(ctx, base).joinpath(f"{unit}.d").glob("*.conf")):
                files.setdefault(path.name, path)
        except OSError:
            continue
    rules: dict[str, list[str]] = {"SocketBindAllow": [], "SocketBindDeny": []}
    for name in sorted(files):
        try:
            text = read_text_nofollow(files[name])
        except (OSError, ValueError):
            continue
        for line in text.splitlines():
            key, sep, value = line.strip().partition("=")
            if sep and key.strip() in rules:
                values = rules[key.strip()]
                if value.strip():
                    values.append(value.strip())
                else:
                    values.clear()  # an empty assignment resets the list
    return rules


def _unguarded(deny: list[str], allow: list[str], ranges: tuple[tuple[int, int], ...]) -> str:
    """Which of the ranges' TCP ports a unit with these rules still lets bind, in words ('' for none)."""
    ports = {n for a, b in ranges for n in range(a, b + 1)}
    words = []
    for family in ("ipv4", "ipv6"):
        denied = _matched(deny, family)
        allowed = _matched(allow, family)
        left = {n for n in ports if n not in denied or n in allowed}
        if left:
            words.append(f"{len(left)} of their ports over {family.replace('ip', 'IP')}")
    return " and ".join(words)


def _matched(rules: list[str], family: str) -> set[int]:
    """The TCP ports of ``family`` that ``rules`` match (``any``: all); rules systemd would refuse match none."""
    out: set[int] = set()
    for rule in rules:
        if rule.strip().lower() == "any":
            return set(range(1, 65536))
        m = _BIND_RULE.fullmatch(rule.strip())
        if m is None or (m.group(1) and m.group(1).lower() != family) or (m.group(2) and m.group(2).lower() != "tcp"):
            continue
        lo = int(m.group(3)) if m.group(3) else 1
        hi = int(m.group(4)) if m.group(4) else (lo if m.group(3) else 65535)
        out |= set(range(lo, hi + 1))
    return out


# ---------------------------------------------------------------- NVML


def nvml_checks(ctx: Context) -> list[Check]:
    """The tray's NVLink fabric: its key, or why it has none; per GPU its state and health."""
    s = ctx.rt.settings
    if s.policy.fabric != "nvml":
        return [Check("nvml.fabric", OK, "not checked: [policy] fabric = none")]
    tray = read_fabric(ctx.rt.gpu, ctx.node)
    out = [_fabric(tray)]
    out += [_gpu(g, s.policy.fabric_limited) for g in tray.gpus if g.status is not None]
    return out


def read_fabric(gpu: Gpu, node: str) -> TrayFabric:
    """The tray's fabric as ``imexctl topology`` reports it: the one place doctor reads NVML."""
    from imexctl.gpu.topology import read_tray

    return read_tray(gpu, node)


def _fabric(tray: TrayFabric) -> Check:
    if tray.error:
        fix = "check the driver and the NVLink fabric (nvidia-smi -q); on trays without one, set [policy] fabric = none"
        return Check("nvml.fabric", FAIL, f"NVML: {tray.error}; every prolog here fails (exit 69)", fix)
    if not tray.key:
        fix = "install imexctl's hooks only on NVLink trays (docs/install.md)"
        return Check("nvml.fabric", WARN, f"no multi-node NVLink fabric ({tray.reason}): every job is skipped", fix)
    return Check("nvml.fabric", OK, f"NVLink domain {tray.key}, fabric health {tray.health}")


def _gpu(g: GpuReport, limited: str) -> Check:
    name = f"nvml.gpu{g.gpu}"
    what = f"state {g.state}, {str(g.status).split(' (')[0]}, health {g.health or '-'}"
    if g.state in ("NOT_STARTED", "IN_PROGRESS"):
        return Check(name, WARN, f"{what}: registration pending", "wait, then check nvidia-fabricmanager/NVLink")
    if g.state != "COMPLETED" or not str(g.status).startswith("NVML_SUCCESS") or g.health_summary == "UNHEALTHY":
        return Check(name, FAIL, what, "check the GPU's NVLink fabric (nvidia-smi -q -d FABRIC)")
    if g.health_summary == "LIMITED_CAPACITY":
        status = FAIL if limited == "refuse" else WARN
        return Check(name, status, f"{what} ([policy] fabric_limited = {limited})", "check the NVLink fabric")
    return Check(name, OK, what)
