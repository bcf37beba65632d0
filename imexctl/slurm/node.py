"""This node as slurmctld sees it (state and reason), and the two changes ``imexctl health`` makes to it.

``scontrol show node NAME`` (not ``-o``) prints one field group per line, each
line indented by three blanks (src/api/node_info.c ``slurm_sprint_node_table``,
the same from 22.05 to 26.05; design.md source slurm-healthcheck).  ``State=`` opens its line, before any text an
admin writes; ``Reason=`` opens the line of the reason, whose further lines (a
reason with newlines) are indented by ten blanks, and the reason's first line
ends with `` [user@time]``.  A reason is an admin's (or a hook's, or another
health checker's, or another tool's that tagged it) free text: it is read as
one field, searched only for a reason of ours (``slurm.drain.parse``), never
for other fields.

Every command is bounded by ``[slurm] query_timeout_s``; ``scontrol update``
is given its arguments as separate words, never through a shell.
"""

from __future__ import annotations

from typing import Final

from imexctl import slurm as var
from imexctl.config.settings import Settings
from imexctl.platform import Record
from imexctl.platform.errors import CommandError
from imexctl.platform.host import Host

__all__ = ["NodeView", "drain", "parse_show_node", "resume", "show_node", "unhealthy_state"]

#: words of ``State=`` for a node out of service by slurmctld's view, as SLURM_NODE_IS_HEALTHY=no says
#: (src/slurmctld/ping_nodes.c ``_node_unhealthy_for_hc``: down, drain, fail, maint); ``+DRAIN`` is both
#: drained and draining (``node_state_string_complete``)
_OUT: Final = frozenset({"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "MAINT"})
#: what a reason may hold when imexctl writes one: printable ASCII, no newline
_REASON_MAX: Final = 255  # slurmdbd keeps 255 bytes of a node's reason


class NodeView(Record):
    """A node's ``State=`` (``IDLE+DRAIN``) split into its words, and its reason without ``[user@time]``."""

    name: str
    state: tuple[str, ...]
    reason: str

    @property
    def drained(self) -> bool:
        """DRAIN among its flags (drained or draining), and not DOWN: what ``State=RESUME`` brings back."""
        return bool({"DRAIN", "DRAINED", "DRAINING"} & set(self.state)) and "DOWN" not in self.state


def unhealthy_state(state: tuple[str, ...]) -> bool:
    """Whether slurmctld keeps the node out of service (down, drained, draining, failing, maintenance)."""
    return any(word in _OUT for word in state)


def parse_show_node(text: str, name: str) -> NodeView | None:
    """The record of node ``name`` in ``scontrol show node`` output; None when it is not there.

    Only the line that starts with ``NodeName=<name> `` opens the record; its
    ``State=`` and ``Reason=`` lines are read by their place (three blanks,
    the key), so a reason or comment that holds ``State=...`` changes nothing.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(f"NodeName={name} ")), None)
    if start is None:
        return None
    state: tuple[str, ...] = ()
    reason = ""
    for line in lines[start + 1 :]:
        if not line.startswith("   "):  # a blank line or the next record
            break
        if line.startswith("   State=") and not state:
            word = line[len("   State=") :].split(" ", 1)[0]
            state = tuple(w for w in word.upper().split("+") if w)
        elif line.startswith("   Reason=") and not reason:
            reason = _without_stamp(line[len("   Reason=") :])
    return NodeView(name, state, reason)


def _without_stamp(first_line: str) -> str:
    """A reason's first line without the `` [user@time]`` slurmctld appends."""
    head, sep, tail = first_line.rpartition(" [")
    return head if sep and tail.endswith("]") and "@" in tail else first_line


def _env(slurm_conf: str) -> dict[str, str]:
    """The environment of scontrol: the caller's ``SLURM_CONF`` when it has one (else scontrol's own default)."""
    return {var.CONF: slurm_conf} if slurm_conf else {}


def show_node(name: str, host: Host, settings: Settings, slurm_conf: str = "") -> NodeView | None:
    """``scontrol show node NAME``, bounded; None when slurmctld cannot be asked or does not know the node."""
    argv = (settings.commands.scontrol, "show", "node", name)
    try:
        done = host.run(argv, timeout_s=settings.slurm.query_timeout_s, env=_env(slurm_conf))
    except CommandError:
        return None
    if done.returncode != 0:
        return None
    return parse_show_node(done.stdout, name)


def clean_reason(text: str) -> str:
    """``text`` as a node reason: printable ASCII with every other character a blank, at most 255 bytes."""
    cleaned = "".join(c if " " <= c <= "~" else " " for c in text)
    return " ".join(cleaned.split())[:_REASON_MAX]


def drain(name: str, reason: str, host: Host, settings: Settings, slurm_conf: str = "") -> str:
    """Drain the node with ``reason``; '' when slurmctld took it, else why not.

    ``slurm_conf``: the hook's ``SLURM_CONF``, handed to scontrol (the hooks run with it; configless).
    """
    return _update(name, host, settings, "State=DRAIN", f"Reason={clean_reason(reason)}", slurm_conf=slurm_conf)


def resume(name: str, host: Host, settings: Settings, slurm_conf: str = "") -> str:
    """Resume the node; '' when slurmctld took it, else why not (``slurm_conf`` as for :func:`drain`)."""
    return _update(name, host, settings, "State=RESUME", slurm_conf=slurm_conf)


def _update(name: str, host: Host, settings: Settings, *fields: str, slurm_conf: str = "") -> str:
    argv = (settings.commands.scontrol, "update", f"NodeName={name}", *fields)
    try:
        done = host.run(argv, timeout_s=settings.slurm.query_timeout_s, env=_env(slurm_conf))
    except CommandError as exc:
        return str(exc)
    if done.returncode != 0:
        return f"scontrol update: exit {done.returncode}: {(done.stderr or done.stdout).strip()[-300:]}"
    return ""
