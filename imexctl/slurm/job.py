"""The job as slurmd describes it to Prolog/Epilog, read from the environment (pure).

Every variable is read through :mod:`imexctl.slurm` (the package's own module), the table of
Slurm's variables (which versions set each, and its fallback).  Light enough for
the hooks' fast path (:mod:`imexctl.hooks.entry`): at run time it imports only
``os`` and :mod:`imexctl.slurm`'s table; :mod:`imexctl.slurm.nodelist` only
to read a prolog's node list (an epilog never needs it), and
:mod:`imexctl.platform.errors` (which imports ``enum``) only to raise.
"""

from __future__ import annotations

import os

from imexctl import slurm as var

# typing is not imported at run time (start-up cost); mypy reads this block
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

    from imexctl.platform.errors import EnvironmentError_

__all__ = ["SHARING_UNKNOWN", "JobContext", "constraint_features", "node_name"]

# Who owns the job's nodes, as each Slurm release writes it (docs/configuration.md "Exclusive jobs";
# tests/slurm/test_job.py holds one table per release, read from SchedMD/slurm):
# - 26.05+: SLURM_JOB_EXCLUSIVE is NO, NODE, USER, MCS or TOPO, and only NODE and TOPO give the job
#   whole nodes; SLURM_JOB_OVERSUBSCRIBE is NO, YES or OK, and YES or OK lets other jobs in.
# - 23.02 to 25.11: SLURM_JOB_OVERSUBSCRIBE alone, NO (whole nodes), TOPO, USER, MCS, YES or OK.
# - 22.05: neither variable.
_OWNS_NODES = frozenset({"NODE", "TOPO"})
_OWNS_NODES_BEFORE_26 = frozenset({"NO", "TOPO"})
_LETS_OTHERS_IN = frozenset({"YES", "OK"})
#: ``sharing_from`` of a job whose sharing slurmctld was asked about (Slurm 22.05) and did not tell
SHARING_UNKNOWN = "nobody"


class JobContext:
    """One job on one node.  ``nodes`` keeps Slurm's order; empty when not needed.

    A frozen record (what ``dataclasses.dataclass(frozen=True)`` would make, without its import cost).
    """

    __slots__ = _FIELDS = (
        "job_id",
        "node",
        "nodes",
        "uid",
        "gid",
        "user",
        "partition",
        "constraints",
        "oversubscribe",
        "het_job_id",
        "slurm_conf",
        "exclusive",
        "qos",
        "sluid",
        "sharing_from",
        "restarts",
        "start_time",
    )

    job_id: int
    node: str
    nodes: tuple[str, ...]
    uid: int | None
    gid: int | None
    user: str
    partition: str
    constraints: str
    oversubscribe: str
    #: the het job's leader id (SLURM_HET_JOB_ID, or the old SLURM_PACK_JOB_ID); None for other jobs
    het_job_id: int | None
    #: the slurm.conf slurmd uses (SLURM_CONF), for the hook timeout and slurmctld queries
    slurm_conf: str
    #: SLURM_JOB_EXCLUSIVE (Slurm 26.05+), upper case; '' when slurmd does not set it
    exclusive: str
    #: SLURM_JOB_QOS (26.05+) and SLURM_JOB_SLUID (25.11+), for the log only; '' when unset
    qos: str
    sluid: str
    #: where ``oversubscribe`` came from when not from the environment: "slurmctld" (asked under Slurm 22.05),
    #: or :data:`SHARING_UNKNOWN` when slurmctld was asked and did not answer (the job then may share)
    sharing_from: str
    #: which run of the job this is: ``SLURM_JOB_RESTART_COUNT`` (how often it was requeued; 22.05+) and
    #: ``SLURM_JOB_START_TIME`` (23.02+), both from the job's credential; None where slurmd does not say
    restarts: int | None
    start_time: int | None

    def __init__(
        self,
        job_id: int,
        node: str,
        nodes: tuple[str, ...] = (),
        uid: int | None = None,
        gid: int | None = None,
        user: str = "",
        partition: str = "",
        constraints: str = "",
        oversubscribe: str = "",
        het_job_id: int | None = None,
        slurm_conf: str = "",
        exclusive: str = "",
        qos: str = "",
        sluid: str = "",
        sharing_from: str = "",
        restarts: int | None = None,
        start_time: int | None = None,
    ) -> None:
        values = (
            *(job_id, node, nodes, uid, gid, user, partition, constraints, oversubscribe, het_job_id, slurm_conf),
            *(exclusive, qos, sluid, sharing_from, restarts, start_time),
        )
        for name, value in zip(self._FIELDS, values):
            object.__setattr__(self, name, value)

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self._FIELDS)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"JobContext is frozen: cannot set {name}")

    def __eq__(self, other: object) -> bool:
        return other.__class__ is self.__class__ and self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        return f"JobContext({', '.join(f'{n}={getattr(self, n)!r}' for n in self._FIELDS)})"

    def replace(self, **changes: Any) -> JobContext:
        """A copy with some fields changed."""
        return JobContext(**{**{name: getattr(self, name) for name in self._FIELDS}, **changes})

    @classmethod
    def from_env(cls, env: Mapping[str, str], *, need_nodes: bool) -> JobContext:
        """Build the context from slurmd's environment.

        Args:
            env: the process environment (a plain mapping).
            need_nodes: the prolog needs the node list and the job owner; the epilog does not.

        Raises:
            EnvironmentError_: a variable is missing or malformed (named in the message).
        """
        job_id = _int(env, var.JOB_ID, required=True, minimum=1, maximum=var.MAX_JOB_ID)
        node = node_name(env)
        if not node:
            raise _env_error("SLURMD_NODENAME is not set: imexctl must run as slurmd's Prolog/Epilog")
        nodes: tuple[str, ...] = ()
        if need_nodes:
            nodes = _nodes(env, node)
        uid = _int(env, var.JOB_UID, required=need_nodes, minimum=0, maximum=var.MAX_OWNER_ID)
        gid = _int(env, var.JOB_GID, required=False, minimum=0, maximum=var.MAX_OWNER_ID)
        user = var.value(env, var.JOB_USER)
        if need_nodes and not user.isprintable():  # the epilog never uses it
            raise _env_error(f"SLURM_JOB_USER={shorten(user)} holds a non-printing character")
        assert job_id is not None
        return cls(
            job_id=job_id,
            node=node,
            nodes=nodes,
            uid=uid,
            gid=gid,
            user=user,
            partition=var.value(env, var.JOB_PARTITION),
            constraints=var.value(env, var.JOB_CONSTRAINTS),
            oversubscribe=var.value(env, var.JOB_OVERSUBSCRIBE).strip().upper(),
            het_job_id=_int(env, var.HET_JOB_ID, required=False, minimum=1, maximum=var.MAX_JOB_ID),
            slurm_conf=var.value(env, var.CONF).strip(),
            exclusive=var.value(env, var.JOB_EXCLUSIVE).strip().upper(),
            qos=_printable(var.value(env, var.JOB_QOS)),
            sluid=_printable(var.value(env, var.JOB_SLUID)),
            restarts=_count(env, var.JOB_RESTART_COUNT),
            start_time=_count(env, var.JOB_START_TIME),
        )

    @property
    def owner(self) -> tuple[int, int]:
        """``(uid, gid)`` that own the job's channel and socket (root for what slurmd did not say)."""
        return (self.uid or 0, self.gid if self.gid is not None else 0)

    @property
    def is_shared(self) -> bool | None:
        """True if other jobs may run on the job's nodes; None when Slurm (22.05) does not say.

        Slurm 26.05 and later say it with ``SLURM_JOB_EXCLUSIVE`` (whole nodes: ``NODE`` or ``TOPO``)
        and ``SLURM_JOB_OVERSUBSCRIBE`` (``YES``/``OK`` let others in); 23.02 to 25.11 with
        ``SLURM_JOB_OVERSUBSCRIBE`` alone (whole nodes: ``NO`` or ``TOPO``).  A job whose sharing
        slurmctld did not tell when asked (:data:`SHARING_UNKNOWN`) may share.
        """
        if self.sharing_from == SHARING_UNKNOWN:
            return True
        if self.exclusive:
            return self.exclusive not in _OWNS_NODES or self.oversubscribe in _LETS_OTHERS_IN
        if not self.oversubscribe:
            return None
        return self.oversubscribe not in _OWNS_NODES_BEFORE_26

    @property
    def sharing(self) -> str:
        """The variables :attr:`is_shared` was decided from, as ``NAME=value`` words (for reasons and logs)."""
        if self.sharing_from == SHARING_UNKNOWN:
            return (
                "slurmctld did not say whether it may: Slurm 22.05 tells the prolog nothing, and squeue got no answer"
            )
        if self.sharing_from:
            return f"OverSubscribe={self.oversubscribe} from {self.sharing_from}"
        found = ((var.JOB_EXCLUSIVE, self.exclusive), (var.JOB_OVERSUBSCRIBE, self.oversubscribe))
        said = " ".join(f"{name}={value}" for name, value in found if value)
        return said or "neither SLURM_JOB_EXCLUSIVE nor SLURM_JOB_OVERSUBSCRIBE set"


def node_name(env: Mapping[str, str], *, or_host: bool = False) -> str:
    """This node's name: ``SLURMD_NODENAME``, checked to be usable in a path (``[paths] root`` ``%n``).

    The one place imexctl reads it: the hooks, the admin commands, the job's
    own user (:mod:`imexctl.channels.job`).

    Args:
        env: the process environment.
        or_host: without ``SLURMD_NODENAME``, this host's short name (an admin's
            shell, a TaskProlog that lacks it); else ''.

    Raises:
        EnvironmentError_: the name holds a path separator, a blank, a host-list
            character or a non-printing character, or is ``.`` or ``..`` (or,
            with ``or_host``, is empty).
    """
    name = var.value(env, var.NODENAME).strip()
    if name or not or_host:
        if name and not _usable(name):
            raise _env_error(f"SLURMD_NODENAME={shorten(name)} is not a node name")
        return name
    host = os.uname().nodename
    if not _usable(host.split(".", 1)[0]):
        raise _env_error(f"the host name {shorten(host)} is not a node name")
    return host.split(".", 1)[0]


def _usable(name: str) -> bool:
    """Whether ``name`` may stand in a path: not '', '.' or '..', no '/', blank, host-list or non-printing character."""
    return name not in ("", ".", "..") and name.isprintable() and not any(c in name for c in "/ ,[]")


def constraint_features(constraints: str) -> frozenset[str]:
    """Feature names in a ``--constraint`` expression (operators and counts dropped)."""
    text = constraints
    for op in "&|,[]()":
        text = text.replace(op, " ")
    return frozenset(tok.split("*", 1)[0] for tok in text.split() if tok.split("*", 1)[0])


def _nodes(env: Mapping[str, str], node: str) -> tuple[str, ...]:
    from imexctl.slurm import nodelist  # here: the epilog, and its fast path, never read the list

    # slurmd sets SLURM_JOB_NODELIST from 23.02 on; 22.05 only SLURM_NODELIST (its fallback in the table)
    key, text = var.source(env, var.JOB_NODELIST)
    if not text.strip():
        raise _env_error("neither SLURM_JOB_NODELIST nor SLURM_NODELIST is set")
    nodes = tuple(nodelist.expand(text))
    if not nodes:
        raise _env_error(f"{key}={shorten(text)} names no node")
    seen: set[str] = set()
    repeated: set[str] = set()
    for n in nodes:
        (repeated if n in seen else seen).add(n)
    dupes = sorted(repeated)
    if dupes:
        raise _env_error(f"{key}={shorten(text)} names {_few(dupes)} more than once")
    if node not in nodes:
        raise _env_error(f"this node {node!r} (SLURMD_NODENAME) is not in {key}={shorten(text)}")
    return nodes


def _few(names: Sequence[str], shown: int = 5) -> str:
    more = f" and {len(names) - shown} others" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _int(env: Mapping[str, str], name: str, *, required: bool, minimum: int, maximum: int) -> int | None:
    """The number in ``name`` (or its fallback, :mod:`imexctl.slurm`); None when unset."""
    key, text = var.source(env, name)
    text = text.strip()
    if not text:
        if required:
            raise _env_error(f"{name} is not set")
        return None
    # the length check first: int() of thousands of digits is slow, and refused above 4300
    if not (text.isascii() and text.isdigit() and len(text) <= 20) or not minimum <= int(text) <= maximum:
        raise _env_error(f"{key}={shorten(text)} is not a valid number ({minimum} to {maximum})")
    return int(text)


def _count(env: Mapping[str, str], name: str) -> int | None:
    """A number slurmd sets from the job's credential, kept only to tell one run of the job from another.

    None when unset or not a plain number: no decision needs it (a leftover
    whose run cannot be told is judged as before), so it never fails a hook.
    """
    text = var.value(env, name).strip()
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 20 else None


def _printable(text: str, limit: int = 64) -> str:
    """A variable kept for the log only: stripped, cut, non-printing characters as '?'."""
    return "".join(c if c.isprintable() else "?" for c in text.strip()[:limit])


def _env_error(message: str) -> EnvironmentError_:
    from imexctl.platform.errors import EnvironmentError_

    return EnvironmentError_(message)


def shorten(text: str, limit: int = 200) -> str:
    """:func:`imexctl.platform.errors.shorten`, imported only when a message needs it."""
    from imexctl.platform import errors

    return errors.shorten(text, limit)
