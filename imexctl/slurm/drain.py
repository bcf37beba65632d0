"""The reason a failing hook leaves on its node, so that ``sinfo -R`` says why (``scontrol update``, bounded).

slurmctld drains a node whose prolog failed with the reason ``Prolog error``,
and one whose epilog failed with ``Epilog error``, but only when the node is
not draining already, and it never replaces a reason the node has
(``validate_node_specs`` and ``_drain_node`` in src/slurmctld/node_mgr.c,
``job_epilog_complete`` in job_mgr.c, the same in 22.05, 24.11 and 26.05).
So a hook that drains its own node first, with its own reason, keeps that
reason in ``sinfo -R``, ``scontrol show node`` and slurmdbd (design.md source
slurm-drain-reason).  root may: ``scontrol update`` of a node needs
``validate_super_user``, which uid 0 passes in every release.

The reason starts with ``imex:<error code>`` (``sinfo -R`` prints the first
20 characters by default) and names trays by their node names, never by
address: ``imex:not_ready gb03: peers gb05,gb07 unreachable``.  It is one
line of printable ASCII (``slurm.node.clean_reason``), at most
:data:`REASON_BYTES` bytes (what slurmdbd keeps).  ``imexctl health`` uses
its own prefix, ``imex-health:``, and resumes only nodes that carry it.
Setting it is best effort: a failure is logged and never changes the hook's
exit code; Slurm's own reason stands then.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from imexctl.config.settings import Settings
from imexctl.platform.host import Host
from imexctl.slurm import node as slurmnode

__all__ = ["PREFIX", "REASON_BYTES", "leave", "reason"]

#: every reason imexctl leaves starts with it (an admin's or a health check's own reasons do not)
PREFIX: Final = "imex:"
#: slurmdbd keeps this many bytes of a node's reason
REASON_BYTES: Final = 255


def reason(code: str, node: str, detail: str, names: Mapping[str, str] | None = None) -> str:
    """``imex:<code> <node>: <detail>``, addresses in ``detail`` replaced by the trays' names, one line, cut.

    Args:
        code: the error code (``not_ready``, ``daemon_lost``, ...).
        node: this node's name.
        detail: what went wrong; may name trays by address.
        names: address -> node name of the job's trays (the domain's member list).
    """
    text = _named(detail, names or {})
    # one line of printable text; scontrol strips a leading and a trailing double quote from the value
    text = slurmnode.clean_reason(text.replace('"', "'"))
    return _cut(f"{PREFIX}{code} {node}: {text}", REASON_BYTES)


def _named(text: str, names: Mapping[str, str]) -> str:
    """``text`` with each address of ``names`` (a whole address, never a prefix of another) replaced by its name."""
    if not names:
        return text
    # longest first, and never inside a longer address: 10.0.0.1 must not eat 10.0.0.12
    ordered = sorted(names, key=len, reverse=True)
    pattern = re.compile(r"(?<![\w.:])(" + "|".join(re.escape(a) for a in ordered) + r")(?![\w]|\.\d)")
    return pattern.sub(lambda m: names[m.group(1)], text)


def _cut(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` UTF-8 bytes, on a character boundary, ``...`` marking the cut."""
    data = text.encode()
    if len(data) <= limit:
        return text
    return data[: limit - 3].decode(errors="ignore").rstrip() + "..."


def leave(host: Host, settings: Settings, log: Any, *, node: str, slurm_conf: str, text: str) -> bool:
    """Drain this node with ``text`` as its reason (``[slurm] drain_reason``); whether slurmctld took it.

    Only under slurmd (``slurm_conf`` set: the hook's ``SLURM_CONF``), so a
    prolog run by hand or by the simulator's rack never asks a slurmctld.
    ``slurm.node.drain`` runs ``scontrol update``, bounded by ``[slurm]
    query_timeout_s``; any failure is a warning (``slurm.drain_failed``),
    never the hook's.
    """
    if settings.slurm.drain_reason != "yes" or not slurm_conf or not node:
        return False
    problem = slurmnode.drain(node, text, host, settings, slurm_conf=slurm_conf)
    if problem:
        log.warning("slurm.drain_failed", drain_reason=text, problem=problem)
        return False
    log.info("slurm.drained", drain_reason=text)
    return True
