"""Readiness of the job's IMEX domain, polled under a deadline (imex.md §8.6).

Local: ``nvidia-imex-ctl -c <cfg> -q`` prints ``READY`` and exits 0.  Domain:
``-N -j`` reports status ``UP``, the node map equals the job's nodes file, this
tray is ``READY`` and every one of its connections to a peer is ``CONNECTED``.
A probe never raises for "not ready"; it returns a :class:`Readiness`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from imexctl import ctloutput
from imexctl.errors import CommandError, DaemonError, HealthTimeout, OutputError
from imexctl.host import Host
from imexctl.settings import Settings

__all__ = ["NOT_READY_STATES", "Probe", "Readiness", "wait_ready"]

# A peer daemon that answers with one of these is alive and says it is not ready
# (imex.md §8.2); UNAVAILABLE is not among them: it may be our own network's fault.
NOT_READY_STATES = frozenset(
    {"INITIALIZING", "STARTING_AUTH_SERVER", "WAITING_FOR_PEERS", "WAITING_FOR_RECOVERY", "INIT_GPU", "SHUTTING_DOWN"}
)


@dataclasses.dataclass(frozen=True)
class Readiness:
    """Outcome of one probe."""

    ready: bool
    status: str
    domain: Optional[ctloutput.DomainStatus] = None
    blamed: Tuple[str, ...] = ()
    fatal: str = ""
    #: peers whose daemon is connected to its peers but whose command service ``-N`` could not reach
    cmd_unreachable: Tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Probe:
    """What to ask and what to expect."""

    config: Path
    own_address: str
    addresses: Tuple[str, ...]
    level: str
    daemon_alive: Callable[[], bool]
    cmd_port: int = 0


def probe(host: Host, settings: Settings, p: Probe, deadline: float = float("inf")) -> Readiness:
    """One readiness check: local state, then (level ``domain``) the whole domain.

    No ``nvidia-imex-ctl`` call runs past ``deadline`` (``host.monotonic()`` time).
    """
    if not p.daemon_alive():
        return Readiness(False, "daemon exited", fatal="the IMEX daemon exited during start-up")
    rc, out = _ctl(host, settings, _endpoint(settings, p), deadline, "-q")
    if rc == 255 or "Failed to read node configuration file" in out:
        return Readiness(False, "ctl: config", fatal=f"nvidia-imex-ctl cannot read the node config: {out.strip()}")
    if rc is None:
        return Readiness(False, f"ctl -q: {out}")
    try:
        state = ctloutput.parse_query(out)
    except OutputError as exc:
        return Readiness(False, f"ctl -q: {exc}")
    if state != "READY" or rc != 0:
        return Readiness(False, f"local {state}" + (f" (exit {rc})" if rc else ""))
    if p.level == "local":
        return Readiness(True, "local READY")
    return _domain(host, settings, p, deadline)


def _domain(host: Host, settings: Settings, p: Probe, deadline: float) -> Readiness:
    rc, out = _ctl(host, settings, ("-c", str(p.config)), deadline, "-N", "-j")
    if rc is None:
        return Readiness(False, f"ctl -N -j: {out}")
    try:
        dom = ctloutput.parse_domain_json(out)
    except OutputError as exc:
        return Readiness(False, f"ctl -N -j: {exc}")
    hosts = tuple(n.host for n in sorted(dom.nodes, key=lambda n: n.node_id))
    if hosts != p.addresses:
        return Readiness(False, "node map", dom, fatal=f"daemon reports nodes {list(hosts)}, "
                                                      f"but the job's nodes file is {list(p.addresses)}")  # fmt: skip
    mismatch = [(a, b, s) for a, b, s in dom.not_connected() if "MISMATCH" in s]
    if mismatch:
        a, b, s = mismatch[0]
        return Readiness(False, s, dom, fatal=f"node {a} -> node {b}: {s} (nodes files or driver versions differ)")
    me = dom.node_by_host(p.own_address)
    if me is None or me.status != "READY":
        return Readiness(False, f"own node {me.status if me else 'missing'}", dom)
    own_bad = [c for c in me.connections if c.peer_id != me.node_id and c.status != "CONNECTED"]
    if dom.status == "UP" and not own_bad:
        return Readiness(True, "domain UP", dom)
    blamed = tuple(n.host for n in dom.nodes if n.status in NOT_READY_STATES)
    unreachable = cmd_unreachable(dom)
    status = f"domain {dom.status}{_missing_links(dom)}"
    if unreachable:
        status += (f"; command port {p.cmd_port} unreachable on {', '.join(unreachable)} although their daemons "
                   "are connected (blocked between the trays?)")
    return Readiness(False, status, dom, blamed=blamed, cmd_unreachable=unreachable)


def cmd_unreachable(dom: ctloutput.DomainStatus) -> Tuple[str, ...]:
    """Peers ``-N`` shows UNAVAILABLE although another node is CONNECTED to them.

    ``nvidia-imex-ctl -N`` asks every node's command service itself; a node it
    cannot reach is reported UNAVAILABLE with every link INVALID, while the
    other nodes' rows still show their own links to it.  A CONNECTED link to
    such a node means its daemon is up and only its command port is blocked
    between this tray and that one (a firewall, or a loopback-only bind).
    """
    out = []
    for n in dom.nodes:
        if n.status != "UNAVAILABLE":
            continue
        for other in dom.nodes:
            link = other.connection_to(n.node_id) if other.status != "UNAVAILABLE" else None
            if other is not n and link is not None and link.is_connected:
                out.append(n.host)
                break
    return tuple(out)


def _missing_links(dom: ctloutput.DomainStatus) -> str:
    """``: 0->1 NEVER_CONNECTED, ...`` (first three), so a timeout says which links are down.

    The rows of UNAVAILABLE nodes are left out: the ctl could not ask them, so
    their links are INVALID by construction; they are named instead.
    """
    gone = {n.node_id for n in dom.nodes if n.status == "UNAVAILABLE"}
    bad = [(a, b, st) for a, b, st in dom.not_connected() if a not in gone]
    shown = ", ".join(f"{a}->{b} {st}" for a, b, st in bad[:3])
    parts = [f"UNAVAILABLE {', '.join(n.host for n in dom.nodes if n.node_id in gone)}"] if gone else []
    if bad:
        parts.append(shown + (f" and {len(bad) - 3} more" if len(bad) > 3 else ""))
    return f": {'; '.join(parts)}" if parts else ""


def _endpoint(settings: Settings, p: Probe) -> Tuple[str, ...]:
    """How ``-q`` reaches the local daemon: through the config (``-c``), or ``-i <address> <port>``.

    ``-N`` always gets ``-c``: it needs the nodes file and the command port from the config.
    """
    if settings.readiness.ctl_address == "ip":
        return ("-i", p.own_address, str(p.cmd_port))
    return ("-c", str(p.config))


def _ctl(host: Host, settings: Settings, how: Tuple[str, ...], deadline: float, *args: str) -> Tuple[Optional[int], str]:
    argv = (settings.commands.nvidia_imex_ctl, *how, *args)
    timeout_s = max(0.05, min(settings.readiness.ctl_timeout_s, deadline - host.monotonic()))
    try:
        done = host.run(argv, timeout_s=timeout_s)
    except CommandError as exc:
        return None, exc.reason
    # the state word is on stdout; stderr only explains a failure
    return done.returncode, done.stdout if not done.returncode or done.stdout.strip() else done.stderr


def wait_ready(host: Host, settings: Settings, p: Probe, *, deadline: float, log: Any) -> Readiness:
    """Poll until ready, fatal, or ``deadline`` (``host.monotonic()`` time).

    Waits start at ``poll_initial_s`` and double up to ``poll_max_s``.

    Returns:
        The ready result, or (``blame_peers = yes``) a not-ready one that blames peers.

    Raises:
        DaemonError: a fatal condition (daemon died, node map or version mismatch).
        HealthTimeout: the deadline passed and no peer is to blame.
    """
    import tenacity

    start = host.monotonic()
    initial, cap = settings.readiness.poll_initial_s, settings.readiness.poll_max_s
    backoff = tenacity.wait_exponential(multiplier=initial, min=initial, max=cap)

    # the last probe still gets this long; with less left there is no point in one
    min_probe: float = min(0.2, settings.readiness.ctl_timeout_s)

    def wait(rs: tenacity.RetryCallState) -> float:
        return max(0.0, min(backoff(rs), deadline - min_probe - host.monotonic()))

    def before_sleep(rs: tenacity.RetryCallState) -> None:
        r = rs.outcome.result() if rs.outcome else None
        log.debug("imex.health.poll", attempt=rs.attempt_number, status=r.status if r else "?")

    # A tray that can blame a peer decides a little before the deadline, while the
    # culprit (which waits until the full deadline) still runs and can be seen.
    early = deadline - min(2.0, 0.1 * (deadline - start))
    blame = settings.readiness.blame_peers == "yes"

    def stop(rs: tenacity.RetryCallState) -> bool:
        now = host.monotonic()
        last = rs.outcome.result() if rs.outcome and not rs.outcome.failed else None
        return now >= deadline - min_probe or (blame and now >= early and last is not None and bool(last.blamed))

    retrying = tenacity.Retrying(
        stop=stop,
        wait=wait,
        retry=tenacity.retry_if_result(lambda r: not r.ready and not r.fatal),
        sleep=host.sleep,
        before_sleep=before_sleep,
        retry_error_callback=lambda rs: rs.outcome.result() if rs.outcome else None,
    )
    attempts = [0]
    seen: Dict[str, str] = {}  # peer -> last status it reported while reachable
    answered: List[Readiness] = []  # the last probe nvidia-imex-ctl answered

    def counted() -> Readiness:
        attempts[0] += 1
        r = _sticky_blame(probe(host, settings, p, deadline), seen)
        if not r.status.startswith("ctl"):
            answered[:] = [r]
        return r

    result: Readiness = retrying(counted)
    if not result.ready and not result.fatal and result.status.startswith("ctl") and answered:
        # report what the daemon last said, not only that the final probe got no answer
        last = answered[0]
        result = dataclasses.replace(last, status=f"{last.status} (then {result.status})")
    waited = round(host.monotonic() - start, 3)
    if result.ready:
        log.info("imex.ready", attempts=attempts[0], waited_s=waited, status=result.status)
        return result
    if result.fatal:
        raise DaemonError(f"IMEX not ready: {result.fatal}")
    table = ctloutput.format_domain_table(result.domain) if result.domain else ""
    log.warning("imex.not_ready", attempts=attempts[0], waited_s=waited, status=result.status, table=table)
    if result.blamed and blame:
        return result
    culprits = f"; not ready: {', '.join(result.blamed)}" if result.blamed else ""
    raise HealthTimeout(
        f"IMEX not ready after {waited:.1f}s ({attempts[0]} probes): {result.status}{culprits}",
        last_status=result.status, attempts=attempts[0], waited_s=waited,
    )  # fmt: skip



def _sticky_blame(r: Readiness, seen: Dict[str, str]) -> Readiness:
    """Blame peers whose last word, while reachable, was "not ready" and who are still not READY.

    The culprit's own prolog fails at its deadline and takes its daemon down;
    a tray polling a moment later sees it UNAVAILABLE, but its last word stands.
    """
    if r.domain is None:
        return r
    for n in r.domain.nodes:
        if n.status != "UNAVAILABLE":
            seen[n.host] = n.status
    if r.ready or r.status.startswith("own node"):
        return r
    blamed = tuple(n.host for n in r.domain.nodes if n.status != "READY" and seen.get(n.host) in NOT_READY_STATES)
    return dataclasses.replace(r, blamed=blamed)
