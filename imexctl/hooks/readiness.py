"""Readiness of the job's IMEX domain, polled under a deadline.

Local: ``nvidia-imex-ctl -c <cfg> -q`` prints ``READY`` and exits 0.  Domain:
``-N -j`` reports status ``UP``, the node map equals the job's nodes file, this
tray is ``READY`` and every one of its connections to a peer is ``CONNECTED``
(docs/design.md "Readiness and peer blame").  One probe never raises; it
returns a :class:`Readiness` whose :class:`Outcome` says what happened, and
:func:`wait_ready` turns the last one into a result or an error.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Any, Callable

from imexctl.config.settings import Settings
from imexctl.hooks import verdict
from imexctl.imex import ctl as ctloutput
from imexctl.platform import Record
from imexctl.platform.errors import CommandError, DaemonError, HealthTimeout, OutputError
from imexctl.platform.host import Host

__all__ = ["Outcome", "Probe", "Readiness", "probe", "wait_ready"]


class Outcome(enum.Enum):
    """What one probe found."""

    READY = "ready"
    NOT_YET = "not yet"  # the daemons answered; the domain is not ready yet
    NO_ANSWER = "no answer"  # nvidia-imex-ctl gave no usable answer (timeout, garbage)
    FATAL = "fatal"  # waiting cannot fix it: node map or version mismatch, unreadable config
    DAEMON_GONE = "daemon gone"  # the job's daemon exited

    @property
    def final(self) -> bool:
        """Whether polling stops here."""
        return self in (Outcome.READY, Outcome.FATAL, Outcome.DAEMON_GONE)


class Readiness(Record):
    """Outcome of one probe: ``status`` is short, ``reason`` explains a final failure."""

    outcome: Outcome
    status: str
    domain: ctloutput.DomainStatus | None = None
    blamed: tuple[str, ...] = ()
    reason: str = ""
    #: this tray's own daemon answered READY to ``-q`` in this probe
    local_ready: bool = False

    @property
    def ready(self) -> bool:
        """Whether the probe found the domain ready."""
        return self.outcome is Outcome.READY


class Probe(Record):
    """What to ask and what to expect."""

    config: Path
    own_address: str
    addresses: tuple[str, ...]
    level: str
    daemon_alive: Callable[[], bool]
    cmd_port: int = 0
    server_port: int = 0


# ---------------------------------------------------------------- one probe


def probe(
    host: Host, settings: Settings, p: Probe, deadline: float = float("inf"), *, local_seen: bool = False
) -> Readiness:
    """One readiness check: local state, then (level ``domain``) the whole domain.

    With ``local_seen`` (an earlier probe found the local daemon ``READY``) the
    domain probe alone is run: ``-N`` reports this node's own status too, and
    :func:`_domain` requires it ``READY``, so ``-q`` would only double the
    probe's cost.  No ``nvidia-imex-ctl`` call runs past ``deadline``
    (``host.monotonic()`` time).
    """
    if not p.daemon_alive():
        return Readiness(Outcome.DAEMON_GONE, "daemon exited", reason="the IMEX daemon exited during start-up")
    if local_seen and p.level != "local":
        return _domain(host, settings, p, deadline)._replace(local_ready=True)
    local = _local(host, settings, p, deadline)
    if local.outcome is not Outcome.READY or p.level == "local":
        return local
    return _domain(host, settings, p, deadline)._replace(local_ready=True)


def _local(host: Host, settings: Settings, p: Probe, deadline: float) -> Readiness:
    rc, out = _ctl(host, settings, _endpoint(settings, p), deadline, "-q")
    if rc == 255 or ctloutput.is_not_configured(out):
        return Readiness(
            Outcome.FATAL, "ctl: config", reason=f"nvidia-imex-ctl cannot read the node config: {out.strip()}"
        )
    if rc is None:
        return Readiness(Outcome.NO_ANSWER, f"ctl -q: {out}")
    try:
        state = ctloutput.parse_query(out)
    except OutputError as exc:
        return Readiness(Outcome.NO_ANSWER, f"ctl -q: {exc}")
    if state != "READY" or rc != 0:
        return Readiness(Outcome.NOT_YET, f"local {state}" + (f" (exit {rc})" if rc else ""))
    return Readiness(Outcome.READY, "local READY")


def _domain(host: Host, settings: Settings, p: Probe, deadline: float) -> Readiness:
    rc, out = _ctl(host, settings, ("-c", str(p.config)), deadline, "-N", "-j")
    try:
        dom = ctloutput.parse_domain_json(out) if rc is not None else None
    except OutputError as exc:
        return Readiness(Outcome.NO_ANSWER, f"ctl -N -j: {exc}")
    if dom is None:
        return Readiness(Outcome.NO_ANSWER, f"ctl -N -j: {out}")
    if dom.node_map() != p.addresses:
        return Readiness(
            Outcome.FATAL,
            "node map",
            dom,
            reason=f"daemon reports nodes {list(dom.node_map())}, but the job's nodes file is {list(p.addresses)}",
        )
    for a, b, st in dom.mismatches()[:1]:
        return Readiness(
            Outcome.FATAL, st, dom, reason=f"node {a} -> node {b}: {st} (nodes files or driver versions differ)"
        )
    me = dom.node_by_host(p.own_address)
    if me is None or not me.is_ready:
        return Readiness(Outcome.NOT_YET, f"own node {me.status if me else 'missing'}", dom)
    if dom.is_up and all(c.is_connected for c in me.peer_connections()):
        return Readiness(Outcome.READY, "domain UP", dom)
    return Readiness(Outcome.NOT_YET, _not_up_status(dom, p.cmd_port), dom, blamed=dom.not_ready_peers())


def _not_up_status(dom: ctloutput.DomainStatus, cmd_port: int) -> str:
    """``domain DEGRADED: UNAVAILABLE x; 0->1 NEVER_CONNECTED, ...`` plus a blocked command port, if seen.

    The rows of UNAVAILABLE nodes are left out: the ctl could not ask them, so
    their links are INVALID by construction; they are named instead.
    """
    gone = {n.node_id for n in dom.nodes if n.status == "UNAVAILABLE"}
    bad = [(a, b, st) for a, b, st in dom.not_connected() if a not in gone]
    parts = [f"UNAVAILABLE {', '.join(n.host for n in dom.nodes if n.node_id in gone)}"] if gone else []
    if bad:
        shown = ", ".join(f"{a}->{b} {st}" for a, b, st in bad[:3])
        parts.append(shown + (f" and {len(bad) - 3} more" if len(bad) > 3 else ""))
    status = f"domain {dom.status}" + (f": {'; '.join(parts)}" if parts else "")
    blocked = dom.unreachable_but_connected()
    if blocked:
        status += (
            f"; command port {cmd_port} unreachable on {', '.join(blocked)} although their daemons "
            "are connected (blocked between the trays?)"
        )
    return status


def _endpoint(settings: Settings, p: Probe) -> tuple[str, ...]:
    """How ``-q`` reaches the local daemon: through the config (``-c``), or ``-i <address> <port>``.

    ``-N`` always gets ``-c``: it needs the nodes file and the command port from the config.
    """
    if settings.readiness.ctl_address == "ip":
        return ("-i", p.own_address, str(p.cmd_port))
    return ("-c", str(p.config))


def _ctl(host: Host, settings: Settings, how: tuple[str, ...], deadline: float, *args: str) -> tuple[int | None, str]:
    """Run ``nvidia-imex-ctl``; ``(None, why)`` when it gives no answer in time."""
    argv = (settings.commands.nvidia_imex_ctl, *how, *args)
    timeout_s = max(0.05, min(settings.readiness.ctl_timeout_s, deadline - host.monotonic()))
    try:
        done = host.run(argv, timeout_s=timeout_s)
    except CommandError as exc:
        return None, exc.reason
    # the state word is on stdout; stderr only explains a failure
    return done.returncode, done.stdout if not done.returncode or done.stdout.strip() else done.stderr


# ---------------------------------------------------------------- the wait


class _Watch:
    """Runs the probes and remembers across them what a single probe cannot know.

    - each peer's last status while it was reachable: the culprit's own prolog
      fails at its deadline and takes its daemon down, and a tray polling a
      moment later sees it UNAVAILABLE, but its last word stands;
    - the last result the daemons answered, for the report when the final
      probe gets no answer.
    """

    def __init__(self, host: Host, settings: Settings, p: Probe, deadline: float, log: Any) -> None:
        self.host, self.settings, self.p, self.deadline, self.log = host, settings, p, deadline, log
        self.attempts = 0
        self.local_ready = False
        self.seen: dict[str, str] = {}
        self.answered: Readiness | None = None
        #: the last -N answer in which two or more peers answered: the whole domain as last seen
        self.full_view: ctloutput.DomainStatus | None = None
        #: the last -N answer in which this tray and a peer said READY: who links to whom, while they ran
        self.peer_view: ctloutput.DomainStatus | None = None
        #: the ctl answered -N at least once
        self.any_domain = False

    def __call__(self) -> Readiness:
        self.attempts += 1
        r = self._sticky_blame(probe(self.host, self.settings, self.p, self.deadline, local_seen=self.local_ready))
        self.log.debug("imex.health.poll", attempt=self.attempts, status=r.status)
        self.local_ready = self.local_ready or r.local_ready
        if r.outcome is not Outcome.NO_ANSWER:
            self.answered = r
        if r.domain is not None and sum(n.status != "UNAVAILABLE" for n in r.domain.nodes) >= 3:
            self.full_view = r.domain
        if r.domain is not None and sum(n.is_ready for n in r.domain.nodes) >= 2 and r.local_ready:
            self.peer_view = r.domain
        self.any_domain = self.any_domain or r.domain is not None
        return r

    def _sticky_blame(self, r: Readiness) -> Readiness:
        if r.domain is None:
            return r
        for n in r.domain.nodes:
            if n.status != "UNAVAILABLE":
                self.seen[n.host] = n.status
        if r.ready or r.status.startswith("own node"):
            return r
        blamed = tuple(
            n.host
            for n in r.domain.nodes
            if n.status != "READY" and self.seen.get(n.host) in ctloutput.NOT_READY_STATES
        )
        return r._replace(blamed=blamed)

    def last_word(self, r: Readiness) -> Readiness:
        """``r``, or when it got no answer, what the daemons last said (with ``r`` noted)."""
        if r.outcome is not Outcome.NO_ANSWER or self.answered is None:
            return r
        return self.answered._replace(status=f"{self.answered.status} (then {r.status})")


#: each pause between probes is this share of the time waited so far (then bounded by [readiness] poll_*_s)
WAIT_SHARE = 0.05


def _poll(host: Host, settings: Settings, watch: _Watch, deadline: float) -> Readiness:
    """Probe until a final outcome or the deadline; each pause is a twentieth of the time waited so far.

    The pause is at least ``poll_initial_s`` and at most ``poll_max_s``.  A
    domain that forms in t seconds is seen about t/40 on average (t/20 at
    most) plus one probe later, whatever t is; a domain that takes long is
    asked less often (from 20 s on, once every ``poll_max_s``), so a domain
    that never forms costs few probes: about 100 in the default 60 s with
    probes of 40 ms (docs/performance.md).  The last probe still gets ``min_probe`` seconds:
    with less left there is no point in one.  With ``blame_peers = yes`` a tray
    that can name a peer at fault decides a little before the deadline, while
    the culprit (which waits until its full deadline) can still be seen.  A
    plain loop: tenacity, which drove it before, brought ``dataclasses``,
    ``inspect``, ``logging`` and ``concurrent.futures`` into every prolog.
    """
    initial, cap = settings.readiness.poll_initial_s, settings.readiness.poll_max_s
    start = host.monotonic()
    min_probe = min(0.2, settings.readiness.ctl_timeout_s)
    early = deadline - min(2.0, 0.1 * (deadline - start))
    blame = settings.readiness.blame_peers == "yes"
    while True:
        r = watch()
        now = host.monotonic()
        if r.outcome.final or now >= deadline - min_probe or (blame and now >= early and r.blamed):
            return r
        host.sleep(max(0.0, min(cap, max(initial, WAIT_SHARE * (now - start)), deadline - min_probe - now)))


def wait_ready(host: Host, settings: Settings, p: Probe, *, deadline: float, log: Any) -> Readiness:
    """Poll until ready, fatal, or ``deadline`` (``host.monotonic()`` time).

    Returns:
        The ready result, or (``blame_peers = yes``) a not-ready one that blames peers.

    Raises:
        DaemonError: a fatal condition (daemon died, node map or version mismatch).
        HealthTimeout: the deadline passed and no peer is to blame.
    """
    start = host.monotonic()
    watch = _Watch(host, settings, p, deadline, log)
    result = watch.last_word(_poll(host, settings, watch, deadline))
    waited = round(host.monotonic() - start, 3)
    if result.ready:
        log.info("imex.ready", attempts=watch.attempts, waited_s=waited, status=result.status)
        return result
    if result.outcome.final:
        raise DaemonError(f"IMEX not ready: {result.reason}")
    table = ctloutput.format_domain_table(result.domain) if result.domain else ""
    log.warning("imex.not_ready", attempts=watch.attempts, waited_s=waited, status=result.status, table=table)
    if result.blamed and settings.readiness.blame_peers == "yes":
        return result
    culprits = f"; not ready: {', '.join(result.blamed)}" if result.blamed else ""
    views = verdict.Views(result.domain, watch.peer_view, watch.full_view, watch.seen, watch.any_domain)
    found = verdict.judge(host, p.own_address, p.addresses, (p.server_port, p.cmd_port), views, result.blamed)
    raise HealthTimeout(
        f"IMEX not ready after {waited:.1f}s ({watch.attempts} probes): {result.status}{culprits}{found.text}",
        last_status=result.status,
        attempts=watch.attempts,
        waited_s=waited,
        local_ready=watch.local_ready,
        isolated=found.own,
        summary=_summary(result, watch.local_ready, found.short),
        unsure=found.unsure,
    )


def _summary(result: Readiness, local_ready: bool, silent: str) -> str:
    """The failure in a few words for the node's drain reason: whose fault it looks like, trays by address."""
    if not local_ready:  # "local WAITING_FOR_PEERS (then ctl -q: no answer ...)": the state word says enough
        words = result.status.split()
        return "own daemon not ready" + (f" ({words[1]})" if words[:1] == ["local"] and len(words) > 1 else "")
    parts = [f"peers {','.join(result.blamed)} not ready"] if result.blamed else []
    if silent:
        parts.append(silent)
    return "; ".join(parts) or result.status
