"""``imexctl drains``: the cluster's drained trays by code and block, and on each tray the command that says why.

Read-only, for an admin on a login node (any user may run ``sinfo``), and
sure to answer when the config file does not load (the fault that may have
drained the trays): the built-in settings hold then, and the view says so.  It
asks ``sinfo`` (beside ``[commands] scontrol``, bounded by ``[slurm]
query_timeout_s``) for every drained or draining node, twice: once without
the reasons (no free text: the records, one line each) and once with them.
A reason is an admin's, a hook's or a health checker's free text that may
hold a newline; when the second answer is not one line per record of the
first, the reasons are read from ``scontrol show node`` instead, field by
field (``slurm.node.parse_show_node``), never guessed from the lines.

Each reason of imexctl's (``slurm.drain.parse``: its prefix and shape, with
any tag another tool added before or after it) gives the code, the tray and
the job; every other reason is counted as it is.  The block is the tray's
block in the topology source the hooks read (``[topology] source``, ``[paths]
topology_file``: ``members.block_label``, the ``block`` label of the
metrics); ``-`` where there is none.  Trays that share a reason's code and a
block fold into one line; the command that says why is printed for the trays
that run it: ``imexctl why JOBID`` for a hook's failure with a job,
``imexctl doctor`` for a configuration that does not load (the config file,
whose hook had no log file to write to, or the topology or hosts file: doctor
names which) or a hook's failure without a job, ``imexctl health
--check-only`` for a health checker's drain.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Final

from imexctl import slurm as var
from imexctl.platform import Record

if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping, Sequence

    from imexctl.config.settings import Settings
    from imexctl.gpu.fabric import Gpu
    from imexctl.platform.host import Host
    from imexctl.platform.output import JsonObject
    from imexctl.slurm.drain import Ours

__all__ = ["FIELDS", "Drains", "Group", "Tray", "collect", "command", "parse_records", "render_text", "sinfo_argv"]

#: sinfo's fields without free text: node, every state flag, when the reason was set (``SLURM_TIME_FORMAT=%s``)
FIELDS: Final = "NodeList:0|,StateComplete:0|,TimeStamp:0|"
#: seconds since the epoch in ``TimeStamp``
TIME_ENV: Final = {var.TIME_FORMAT: "%s"}
#: how long a reason that is not imexctl's is shown in a group's label
_OTHER_CHARS: Final = 40


def sinfo_argv(sinfo: str, *, reasons: bool) -> tuple[str, ...]:
    """``sinfo`` for every drained or draining node, one line per node and partition; the reason last."""
    return (sinfo, "--noheader", "--Node", "--states=drain", f"--Format={FIELDS}{',Reason:0' if reasons else ''}")


class Tray(Record):
    """One drained tray: its state, since when, its reason, the reason of ours in it, its block."""

    node: str
    state: str
    since: int | None
    reason: str
    ours: Ours | None
    block: str

    @property
    def label(self) -> str:
        """``imex:not_ready`` for a reason of ours; ``other: <reason>`` (cut) for anyone else's."""
        if self.ours is not None:
            return self.ours.label
        first = self.reason.strip().split("\n", 1)[0]
        return f"other: {first[:_OTHER_CHARS]}{'...' if len(first) > _OTHER_CHARS else ''}" if first else "other"

    @property
    def why(self) -> str:
        """The command to run on the tray that says why it was drained; '' for a reason not ours."""
        ours = self.ours
        if ours is None:
            return ""
        if ours.owner != "hook":
            return "imexctl health --check-only"
        if ours.job is None or ours.code == "config_invalid":
            return "imexctl doctor"
        return f"imexctl why {ours.job}"

    def data(self) -> JsonObject:
        """One tray of ``--json``."""
        ours = self.ours
        return {
            "node": self.node,
            "state": self.state,
            "since": self.since,
            "reason": self.reason,
            "block": self.block,
            "ours": ours is not None,
            "owner": ours.owner if ours is not None else None,
            "code": ours.code if ours is not None else None,
            "job": ours.job if ours is not None else None,
            "why": self.why or None,
        }


class Group(Record):
    """The trays of one reason's label in one block."""

    label: str
    block: str
    nodes: tuple[str, ...]
    ours: bool

    def data(self) -> JsonObject:
        """One line of the rack view, in ``--json``."""
        from imexctl.slurm.nodefold import fold

        return {"label": self.label, "block": self.block, "trays": len(self.nodes), "nodes": fold(self.nodes),
                "ours": self.ours}  # fmt: skip


class Drains(Record):
    """What ``imexctl drains`` found: every drained tray, and where the blocks and the reasons came from."""

    trays: tuple[Tray, ...]
    topology: str
    notes: tuple[str, ...] = ()

    def groups(self) -> list[Group]:
        """Trays by reason label and block: imexctl's first, then by block and label."""
        found: dict[tuple[str, str], list[str]] = {}
        mine: dict[tuple[str, str], bool] = {}
        for tray in self.trays:
            key = (tray.label, tray.block)
            found.setdefault(key, []).append(tray.node)
            mine[key] = tray.ours is not None
        order = sorted(found, key=lambda k: (not mine[k], k[1], k[0]))
        return [Group(label, block, tuple(found[(label, block)]), mine[(label, block)]) for label, block in order]

    def commands(self) -> list[tuple[tuple[str, ...], str]]:
        """Each command that says why, with the trays that run it."""
        found: dict[str, list[str]] = {}
        for tray in self.trays:
            if tray.why:
                found.setdefault(tray.why, []).append(tray.node)
        return sorted(((tuple(nodes), why) for why, nodes in found.items()), key=lambda c: (c[0][0], c[1]))

    def data(self) -> JsonObject:
        """``drains --json``'s ``data``."""
        from imexctl.slurm.nodefold import fold

        return {
            "topology": self.topology or None,
            "groups": [g.data() for g in self.groups()],
            "trays": [t.data() for t in self.trays],
            "commands": [{"nodes": fold(nodes), "command": why} for nodes, why in self.commands()],
            "notes": list(self.notes),
        }


# ---------------------------------------------------------------- reading sinfo


def parse_records(text: str) -> list[tuple[str, str, str]]:
    """``(node, state, time)`` of each line of the answer without reasons (:func:`sinfo_argv`), in order.

    Raises:
        SlurmQueryError: a line that is not ``NODE|STATE|TIME|``.
    """
    from imexctl.platform.errors import SlurmQueryError

    out = []
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) != 4 or fields[3] or not fields[0] or " " in fields[0] or not fields[1]:
            raise SlurmQueryError(f"sinfo printed {line[:80]!r}, not NODE|STATE|TIME|")
        out.append((fields[0], fields[1], fields[2]))
    return out


def _reasons(records: Sequence[tuple[str, str, str]], text: str) -> list[str] | None:
    """The reason of each record, from the answer with reasons; None when it is not one line per record.

    Each line must start with its own record's fields: a reason with a
    newline adds a line, and then no line is trusted to be a record.
    """
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) != len(records):
        return None
    heads = ["|".join(record) + "|" for record in records]
    if not all(line.startswith(head) for head, line in zip(heads, lines)):
        return None
    return [line[len(head) :] for head, line in zip(heads, lines)]


def _run(argv: Sequence[str], host: Host, settings: Settings, env: Mapping[str, str]) -> str:
    """The standard output of sinfo; its failure as ``slurm_query_failed``."""
    from imexctl.platform.errors import CommandError, SlurmQueryError

    try:
        done = host.run(argv, timeout_s=settings.slurm.query_timeout_s, env=env)
    except CommandError as exc:
        raise SlurmQueryError(f"sinfo: {exc}") from exc
    if done.returncode != 0:
        raise SlurmQueryError(f"sinfo: exit {done.returncode}: {(done.stderr or done.stdout).strip()[-300:]}")
    return done.stdout


def collect(host: Host, settings: Settings, env: Mapping[str, str], config_problem: str = "") -> Drains:
    """Every drained tray, its reason read as a field, its block from the topology source.

    ``config_problem``: why the config file did not load (the built-in
    settings hold then, and no block is known); it is one of the notes.

    Raises:
        SlurmQueryError: sinfo failed, timed out or printed what is not its records.
        ConfigError: the topology source cannot be read or parsed.
    """
    import os

    from imexctl.hooks import members
    from imexctl.slurm import drain

    sinfo = os.path.join(os.path.dirname(settings.commands.scontrol), "sinfo")
    conf = var.value(env, var.CONF).strip()
    extra = {**TIME_ENV, **({var.CONF: conf} if conf else {})}
    records = parse_records(_run(sinfo_argv(sinfo, reasons=False), host, settings, extra))
    reasons = _reasons(records, _run(sinfo_argv(sinfo, reasons=True), host, settings, extra)) if records else []
    notes = []
    if reasons is None:
        notes.append("a reason holds a newline: reasons read with scontrol show node")
        reasons = _shown(records, host, settings, conf)
    source = members.load_source(settings)
    trays, seen = [], set()
    for (node, state, time), text in zip(records, reasons):
        if node in seen:  # one line per partition the node is in
            continue
        seen.add(node)
        block = members.block_label(node, source, None) or "-"
        since = int(time) if time.isascii() and time.isdigit() else None
        trays.append(Tray(node, state, since, text, drain.parse(text), block))
    topology = str(settings.paths.topology_file or "") if source is not None else ""
    if config_problem:
        notes.append(f"the config file does not load, built-in settings used, blocks unknown: {config_problem}")
    elif source is None:
        notes.append("no topology source ([topology] source, [paths] topology_file): blocks unknown")
    return Drains(tuple(trays), topology, tuple(notes))


def _shown(records: Sequence[tuple[str, str, str]], host: Host, settings: Settings, conf: str) -> list[str]:
    """Each record's reason as ``scontrol show node`` gives it (its first line), asked once per node."""
    from imexctl.slurm.node import show_node

    known: dict[str, str] = {}
    for node, _, _ in records:
        if node not in known:
            view = show_node(node, host, settings, conf)
            known[node] = view.reason if view is not None else ""
    return [known[node] for node, _, _ in records]


# ---------------------------------------------------------------- the command


def render_text(found: Drains) -> str:
    """One line per reason and block (imexctl's first), then each command with the trays that run it."""
    if not found.trays:
        return "".join(f"{line}\n" for line in ["no drained trays", *(f"note: {n}" for n in found.notes)])
    from imexctl.slurm.nodefold import fold

    groups = found.groups()
    rows = [("TRAYS", "BLOCK", "REASON", "NODES")]
    rows += [(str(len(g.nodes)), g.block, g.label, fold(g.nodes)) for g in groups]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"{r[0]:>{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}".rstrip() for r in rows]
    commands = found.commands()
    if commands:
        lines += ["", "why, on each tray as root:"]
        lines += [f"  {fold(nodes)}: {why}" for nodes, why in commands]
    lines += [f"note: {n}" for n in found.notes]
    return "\n".join(_printable(line) for line in lines) + "\n"


def _printable(text: str) -> str:
    """``text`` with every non-printing character escaped: a reason is someone's free text."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def command(args: argparse.Namespace, env: Mapping[str, str], host: Host | None, _gpu: Gpu | None) -> int:
    """``imexctl drains [--json]``: exit 0 with the view (none drained included); 69 when sinfo cannot answer.

    A config file that does not load is no reason to fail: it may be the very
    fault that drained the trays.  The built-in settings hold then, and the
    view says so.
    """
    from imexctl.hooks.runtime import Needs, build

    needs = Needs(logs="none", gpu="none", config="lenient")
    built = build("drains", env, needs, config=args.config, host=host)
    found = collect(built.rt.host, built.rt.settings, env, built.problem)
    if args.json:
        from imexctl.platform.output import print_json

        print_json(found)
    else:
        sys.stdout.write(render_text(found))
    return 0
