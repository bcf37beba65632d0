"""The reasons imexctl gives a node it drains, and how it knows one of its own again (``scontrol update``, bounded).

slurmctld drains a node whose prolog failed with the reason ``Prolog error``,
and one whose epilog failed with ``Epilog error``, but only when the node is
not draining already, and it never replaces a reason the node has
(``validate_node_specs`` and ``_drain_node`` in src/slurmctld/node_mgr.c,
``job_epilog_complete`` in job_mgr.c, the same in 22.05, 24.11 and 26.05).
So a hook that drains its own node first, with its own reason, keeps that
reason in ``sinfo -R``, ``scontrol show node`` and slurmdbd (design.md source
slurm-drain-reason).  root may: ``scontrol update`` of a node needs
``validate_super_user``, which uid 0 passes in every release.

Every reason imexctl gives is ``<prefix><code> <tray>[ job <id>]: <detail>``:
the code first (``sinfo -R`` prints the first 20 characters by default), then
the tray by its node name (never an address) and the job where there is one,
``imex:not_ready gb03 job 4242: peers gb05,gb07 unreachable``.  It is one line
of printable ASCII (``slurm.node.clean_reason``), at most :data:`REASON_BYTES`
bytes (what slurmdbd keeps), cut in its detail only.  The prefix says who
drained the node, and so who may resume it (:data:`OWNERS`): ``imex:`` a
hook (an admin resumes), ``imexh:`` ``imexctl health`` (it resumes its own
once the fault is gone), ``imexn:`` the NHC check (NHC resumes; NHC writes
``NHC: `` before it).  One pattern classifies them all (:data:`PATTERN`), and
a reason is found again by its prefix alone (:func:`parse`), wherever a tag
that another tool added before or after it left it (design.md source
slurm-reason-tags).  Setting it is best effort: a failure is logged and
never changes the hook's exit code; Slurm's own reason stands then.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from imexctl.config.settings import Settings
from imexctl.platform import Record
from imexctl.platform.host import Host
from imexctl.slurm import node as slurmnode

if TYPE_CHECKING:
    from imexctl.platform.errors import ImexctlError

__all__ = [
    "HEALTH",
    "LEGACY_HEALTH",
    "NHC",
    "OWNERS",
    "PATTERN",
    "PREFIX",
    "REASON_BYTES",
    "Ours",
    "leave",
    "leave_unconfigured",
    "parse",
    "reason",
]

#: a failing prolog or epilog (an admin resumes the tray)
PREFIX: Final = "imex:"
#: ``imexctl health`` as slurmd's HealthCheckProgram or from cron (it resumes its own once the fault is gone)
HEALTH: Final = "imexh:"
#: the NHC check, pkg/nhc/imexctl.nhc (NHC writes ``NHC: `` before it, and resumes the node itself)
NHC: Final = "imexn:"
#: what ``imexctl health`` wrote before this version: still its own, so a tray drained then is resumed
LEGACY_HEALTH: Final = "imex-health:"
#: each prefix, and who drained the node with it
OWNERS: Final = {PREFIX: "hook", HEALTH: "health", NHC: "nhc", LEGACY_HEALTH: "health"}
#: a reason of ours anywhere in a node's reason: not inside a word, whatever was added before or after it
PATTERN: Final = re.compile(
    r"(?<![A-Za-z0-9_-])(?P<prefix>imex-health:|imex[hn]?:)(?P<code>[a-z][a-z0-9_]*) "
    r"(?P<node>[^\s:]+)(?: job (?P<job>[1-9][0-9]{0,9}))?: ?(?P<detail>.*)",
    re.DOTALL,
)
#: where a reason of ours may start (:data:`PATTERN` then says whether one does)
_STARTS: Final = re.compile(r"(?<![A-Za-z0-9_-])imex")
#: slurmdbd keeps this many bytes of a node's reason
REASON_BYTES: Final = 255


class Ours(Record):
    """A reason of ours found in a node's reason: who drained it, the code, the tray, the job, what is left."""

    prefix: str
    code: str
    node: str
    job: int | None
    detail: str

    @property
    def owner(self) -> str:
        """``hook``, ``health`` or ``nhc`` (:data:`OWNERS`)."""
        return OWNERS[self.prefix]

    @property
    def label(self) -> str:
        """``imex:not_ready``: the prefix and the code, as ``sinfo -R`` shows them."""
        return f"{self.prefix}{self.code}"


def reason(
    code: str,
    node: str,
    detail: str,
    names: Mapping[str, str] | None = None,
    *,
    job: int | None = None,
    prefix: str = PREFIX,
    suffix: str = "",
) -> str:
    """``<prefix><code> <node>[ job <job>]: <detail><suffix>``: addresses named, one line, cut in ``detail``.

    Args:
        code: the error code (``not_ready``, ``daemon_lost``, ...) or health's finding code.
        node: this node's name.
        detail: what went wrong; may name trays by address.
        names: address -> node name of the job's trays (the domain's member list).
        job: the job whose hook failed; None where there is none (health, NHC, an environment without one).
        prefix: one of :data:`OWNERS` (not the legacy one).
        suffix: kept whole, after a blank, when ``detail`` is cut (health's ``(+N more)``).
    """
    text = _named(detail, names or {})
    head = f"{prefix}{code} {node}{'' if job is None else f' job {job}'}: "
    tail = f" {_clean(suffix)}" if suffix.strip() else ""
    return head + _cut(_clean(text), REASON_BYTES - len(head.encode()) - len(tail.encode())) + tail


def parse(text: str, prefixes: tuple[str, ...] = tuple(OWNERS)) -> Ours | None:
    """The first reason of ours in a node's reason ``text``, of one of ``prefixes``; None when it holds none.

    Found by its prefix and shape alone: a tag before it (``[ticket 7] imexh:...``,
    NHC's ``NHC: ``) or after it leaves it ours; the prefix inside a word
    (``noimex:...``), a prefix of another family (``imex-healthy?``) or a
    prefix without a code, a tray and ``: `` is not.
    """
    for start in _STARTS.finditer(text):
        match = PATTERN.match(text, start.start())
        if match is not None and match["prefix"] in prefixes:
            job = match["job"]
            return Ours(match["prefix"], match["code"], match["node"], int(job) if job else None, match["detail"])
    return None


def _clean(text: str) -> str:
    """One line of printable text; scontrol strips a leading and a trailing double quote from the value."""
    return slurmnode.clean_reason(text.replace('"', "'"))


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
    return data[: max(limit - 3, 0)].decode(errors="ignore").rstrip() + "..."


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


def leave_unconfigured(host: Host, defaults: Settings, env: Mapping[str, str], log: Any, exc: ImexctlError) -> bool:
    """A hook whose config file did not load: drain its node with ``exc``'s reason, by the built-in settings.

    What the file would have said is unknown, so ``defaults`` (the built-in
    settings, ``runtime.build`` with ``config = none``) hold: ``[commands]
    scontrol`` at its absolute default, ``drain_reason = yes`` (Slurm drains
    the tray for the failed hook anyway; this only replaces ``Prolog error``
    with the reason), ``query_timeout_s``.  The node and the job come from
    slurmd's environment, checked as the hooks check them; a node name that
    is not usable leaves Slurm's reason, a job id that is not one leaves the
    reason without it.  The file is named with its line
    (``ConfigError.where``): ``imex:config_invalid gb03 job 4242:
    /etc/imexctl/imexctl.conf:6: [readiness] soon: unknown key``.
    """
    from imexctl import slurm as var
    from imexctl.platform.errors import ImexctlError
    from imexctl.slurm.job import JobContext, node_name

    try:
        node = node_name(env)
    except ImexctlError:
        return False
    try:
        job: int | None = JobContext.from_env(env, need_nodes=False).job_id
    except ImexctlError:
        job = None
    text = reason(exc.code, node, _located(exc), job=job)
    conf = var.value(env, var.CONF).strip()
    return leave(host, defaults, log, node=node, slurm_conf=conf, text=text)


def _located(exc: ImexctlError) -> str:
    """``exc``'s message with the file it names as ``<file>:<line>`` (``ConfigError.where``), where it has a line."""
    text = str(exc)
    where = str(getattr(exc, "where", ""))
    path, _, line = where.rpartition(":")
    if not (path and line.isascii() and line.isdigit()):
        return text
    for head in (f"{path}: line {line}: ", f"{path}: "):
        if text.startswith(head):
            return f"{where}: {text[len(head) :]}"
    return text
