r"""Whose fault a domain that never formed looks like, seen from this tray at the deadline.

The evidence (docs/design.md "Readiness and peer blame"):

- the ``-N`` answers: every daemon keeps one outgoing connection to each
  peer (its gRPC channels, which SIGUSR1 restarts: design.md source
  imex-signals), and a node's row in ``-N`` shows those outgoing links
  ("Nodes From\To"), so this tray's row says which peers it reaches, and an
  answering peer's row says whether that peer reaches this tray;
- one TCP connection to each silent peer's command port (``open``,
  ``refused``, ``timeout``);
- this tray's socket table: which peers have a connection open to this
  tray's ``SERVER_PORT`` (whose outgoing links arrive here, also when their
  command port cannot be reached from here to ask them), and to whose
  ``SERVER_PORT`` this tray has one (its own outgoing links).

Three verdicts, from the most certain (docs/design.md "Which tray Slurm drains"):

- **own**: the fault is this tray's.  It reaches answering peers, none of
  which reaches it, and no peer's connection arrives (its incoming job
  ports are blocked, or its daemon refuses them); with no ``-N`` answer at
  all (the ctl can wait on a peer whose command port drops it), its socket
  table shows it connected to peers and no peer connected to it; the others
  formed the domain without it; or it reached no peer at all and no peer
  reaches it (cut off).  Host firewalls filter incoming traffic far more
  often than outgoing, so a link that works one way only is counted against
  the tray it does not reach.  Peers that left because their job was
  cancelled (their epilogs stop their daemons) leave the same evidence, so
  the tray asks slurmctld once whether the job is over before it fails
  (``hooks/requeue.py``, issue 41): a job that is over lets it exit 0, and
  this text is then no finding; a job back in the queue does not (it fails,
  so it cannot exit 0 while a healthy peer is drained).
- **unsure**: it reached none of its peers, but their connections arrive:
  either its outgoing traffic is blocked, or theirs incoming (a half-done
  firewall change on most trays).  It asks slurmctld for half the window,
  so the trays sure of their own fault fail first and their requeue can
  still be seen (``hooks/requeue.py``).
- **peers**: everything else; a peer is at fault as far as this tray can
  tell.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from imexctl.imex import ctl as ctloutput
from imexctl.platform import Record
from imexctl.platform.host import Host

__all__ = ["REACH_TIMEOUT_S", "Verdict", "Views", "judge"]

#: how long the last look at the silent peers' command ports may take (all at once)
REACH_TIMEOUT_S = 1.0


class Verdict(Record):
    """What the timeout's message adds, whose fault it is, and the failure in a few words (trays by address)."""

    text: str = ""
    own: bool = False
    unsure: bool = False
    short: str = ""


class Views(Record):
    """The ``-N`` answers of the wait that the verdict reads."""

    #: the last answer (None: the ctl never answered ``-N``)
    last: ctloutput.DomainStatus | None
    #: the last answer in which this tray and a peer said READY
    peer: ctloutput.DomainStatus | None
    #: the last answer in which two or more peers answered: the whole domain as last seen
    full: ctloutput.DomainStatus | None
    #: every peer's last status while it answered
    seen: Mapping[str, str]
    #: the ctl answered ``-N`` at least once during the wait
    answered: bool = True


def judge(
    host: Host,
    me: str,
    addresses: Sequence[str],
    ports: tuple[int, int],
    views: Views,
    blamed: tuple[str, ...] = (),
) -> Verdict:
    """Judge the wait that ended without a domain; ``ports`` are the job's ``SERVER_PORT`` and ``IMEX_CMD_PORT``."""
    others = [a for a in addresses if a != me]
    incoming, outgoing = _links(host, me, ports[0], others)
    unreached = _unreached(views.peer, me, incoming)
    if unreached:
        return Verdict(
            f"; peers {', '.join(unreached)} answered and this tray reaches them, but no peer connects to it: "
            f"check this tray's firewall for incoming job ports (SERVER_PORT {ports[0]})",
            own=True,
            short=f"peers {','.join(unreached)} never connect to it though it reaches them: incoming ports blocked?",
        )
    if not views.answered and outgoing and incoming == frozenset():
        return _one_way(sorted(outgoing), ports[0])
    no_view = dict.fromkeys(others, "no answer to the ctl")
    silent = dict(views.last.silent_peers(me)) if views.last is not None else no_view
    if not silent:
        return Verdict()
    reach = host.tcp_reach(others, ports[1], REACH_TIMEOUT_S) if ports[1] else {}
    shown = [
        f"{a} ({what}" + (f"; TCP port {ports[1]}: {reach[a]}" if a in reach else "") + ")"
        for a, what in silent.items()
    ]
    more = f" and {len(shown) - 5} more" if len(shown) > 5 else ""
    text = f"; peers that never answered: {'; '.join(shown[:5])}{more}"
    unreachable = [a for a in silent if a not in blamed]
    short = f"peers {','.join(unreachable)} unreachable" if unreachable else ""
    if _cut_off(others, views.seen, reach):
        return _cut_off_verdict(text, others, sorted(incoming or ()), ports[1])
    if views.full is not None and _left_out(views.full, me):
        text += "; the other trays connected to each other but none of them to this tray: check this tray"
        return Verdict(text, own=True, short=f"peers {','.join(silent)} connected to each other, none to this tray")
    return Verdict(text, short=short)


def _links(
    host: Host, me: str, server_port: int, others: Sequence[str]
) -> tuple[frozenset[str] | None, frozenset[str]]:
    """The peers connected to this tray's ``SERVER_PORT``, and those this tray's daemon is connected to.

    The first is None when the socket table cannot be read.
    """
    found = host.tcp_links(me, server_port) if server_port else None
    if found is None:
        return None, frozenset()
    return found[0] & frozenset(others), found[1] & frozenset(others)


def _one_way(reached: Sequence[str], server_port: int) -> Verdict:
    """This tray's daemon reaches these peers, no peer's connection arrives, and no ``-N`` answer says more.

    A peer's dropped command port can hold every ``-N`` up, so the socket
    table is all there is.  Live daemons that take this tray's connections
    and never connect back: its incoming job ports.  (A peer that had not
    started its links yet would have shown in a ``-N`` answer as not ready;
    with none, this rule is not used.)
    """
    return Verdict(
        f"; this tray's daemon reaches {', '.join(reached)}, but no peer connects to it (its socket table; no -N "
        f"answer said more): check this tray's firewall for incoming job ports (SERVER_PORT {server_port})",
        own=True,
        short=f"peers {','.join(reached)} never connect to it though it reaches them: incoming ports blocked?",
    )


def _unreached(view: ctloutput.DomainStatus | None, me: str, incoming: frozenset[str] | None) -> list[str]:
    """The READY peers this tray reaches, when none of them, nor any other peer, connects to it.

    Read from the last answer in which a peer said READY: near the deadline
    the peers' daemons may already be stopping.  A peer not READY may not
    have opened its links yet, so only READY ones count.  ``incoming`` None
    (no socket table): the rows alone decide.
    """
    mine = view.node_by_host(me) if view is not None else None
    if view is None or mine is None or not mine.is_ready or incoming:
        return []
    answered = [n for n in view.nodes if n.node_id != mine.node_id and n.is_ready]
    if any((c := n.connection_to(mine.node_id)) is not None and c.is_connected for n in answered):
        return []
    return [n.host for n in answered if (c := mine.connection_to(n.node_id)) is not None and c.is_connected]


def _cut_off(others: Sequence[str], seen: Mapping[str, str], reach: Mapping[str, str]) -> bool:
    """Two or more peers, none of which ever answered this tray's ctl, and none of which takes a connection now.

    ``refused`` means the path works (a peer whose daemon is gone, or a
    firewall that rejects); ``timeout`` that nothing came back.  With one peer
    nobody can tell which of the two is cut off.
    """
    return (
        len(others) >= 2
        and not any(a in seen for a in others)
        and (not reach or all(reach.get(a) not in ("open", "refused") for a in others))
    )


def _cut_off_verdict(text: str, others: Sequence[str], incoming: Sequence[str], cmd_port: int) -> Verdict:
    """Cut off, and sure of it when no peer's connection arrives either; unsure when theirs do."""
    port = f" (port {cmd_port})" if cmd_port else ""
    if incoming:
        text += (
            f"; this tray never reached the command service of any of its {len(others)} peers{port}, but "
            f"{', '.join(incoming)} connect to it: their incoming job ports are blocked, or this tray's outgoing"
        )
        short = f"reaches none of its {len(others)} peers {','.join(others)}, which connect to it"
        return Verdict(text, unsure=True, short=short)
    text += (
        f"; this tray never reached the command service of any of its {len(others)} peers{port}"
        ": check its firewall and interfaces"
    )
    short = f"reached none of its {len(others)} peers {','.join(others)}: firewall or interfaces?"
    return Verdict(text, own=True, short=short)


def _left_out(dom: ctloutput.DomainStatus, me: str) -> bool:
    """Whether two or more peers answered, linked up among themselves, and none of them to this tray.

    Their own rows say so (the ctl asked each of them): the domain formed
    without this tray, so the fault is most likely this tray's (it refuses
    or cannot reach them), not theirs.  ``dom`` may be an answer from before
    the peers left (the last one in which they answered): a slow tray whose
    job was cancelled sees the others linked to each other and not yet to it,
    then gone; only slurmctld can tell that apart (``requeue.job_over``).
    """
    mine = dom.node_by_host(me)
    if mine is None:
        return False
    answered = [n for n in dom.nodes if n.node_id != mine.node_id and n.status != "UNAVAILABLE"]
    if len(answered) < 2:
        return False
    to_me = [n.connection_to(mine.node_id) for n in answered]
    if any(c is not None and c.is_connected for c in to_me):
        return False
    return any(
        (c := a.connection_to(b.node_id)) is not None and c.is_connected
        for a in answered
        for b in answered
        if a.node_id != b.node_id
    )
