"""What the prolog, the epilog and ``cleanup`` return: small frozen records, rendered here for logs and JSON.

The summary lines (``prolog.done``, ``epilog.done``, ``cleanup.done``), the
JSON that ``cleanup --json`` prints and the metrics (``metrics.run_of``) all
read these records; the field order of the summary lines is
:mod:`imexctl.hooks.gate`'s, which the fast tier writes without them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from imexctl.hooks import gate
from imexctl.platform import Record

if TYPE_CHECKING:
    from imexctl.platform.output import JsonObject

__all__ = ["Action", "CleanupResult", "EpilogResult", "PrologResult", "Setup", "texts"]

#: what each kind of action reads as, ``{target}`` filled in; ``{detail}`` follows in parentheses when set
_PHRASES: Final = {
    "stop_daemon": "stop daemon of job {target}",
    "remove_channel": "remove channel {target}",
    "remove_job_dir": "remove {target}",
    "remove_stray_channel": "remove stray channel {target}",
    "remove_note": "remove note of job {target}",
}


class Action(Record):
    """One thing a teardown or ``cleanup`` did (or, in a dry run, would do) to one object.

    ``kind`` is one of ``stop_daemon``, ``remove_channel``, ``remove_job_dir``,
    ``remove_stray_channel``, ``remove_note`` or ``failed`` (a stray channel
    that could not be removed); ``target`` names the object (a job id or a
    path); ``detail`` says what had to be forced, or why it failed.
    """

    kind: str
    target: str
    detail: str = ""
    #: a stop that needed SIGKILL (from systemd after the stop timeout, or from imexctl)
    killed: bool = False

    @property
    def text(self) -> str:
        """The action as the summary lines and ``cleanup`` print it: ``stop daemon of job 7 (SIGKILL to pid 9)``."""
        if self.kind == "failed":
            return f"could not remove {self.target}: {self.detail}"
        what = _PHRASES[self.kind].format(target=self.target)
        return f"{what} ({self.detail})" if self.detail else what


def texts(actions: tuple[Action, ...], *, dry_run: bool = False) -> list[str]:
    """The actions' texts, each ``would <action>`` in a dry run."""
    return [f"would {a.text}" if dry_run else a.text for a in actions]


class Setup(Record):
    """This tray's part of a job's domain, as the prolog set it up.

    With a daemon (``daemon``): its ports, whether the domain got ready, and
    the peers blamed for it not getting ready; without one (``[policy]
    single_tray = channel``): only the job's channel.
    """

    trays: int
    channel: str
    daemon: bool = True
    port: int = 0
    cmd_port: int = 0
    ready: bool = False
    blamed: tuple[str, ...] = ()
    #: this tray's block (NVLink domain) as the metrics label it (members.block_label); '' unknown
    block: str = ""

    def fields(self) -> dict[str, object]:
        """Its fields of ``prolog.done``, in their order."""
        if not self.daemon:
            return {"trays": self.trays, "channel": self.channel, "daemon": False}
        return {
            "trays": self.trays,
            "port": self.port,
            "cmd_port": self.cmd_port,
            "channel": self.channel,
            "ready": self.ready,
            "blamed": list(self.blamed),
        }


class PrologResult(Record):
    """One prolog that ended well: the job skipped, the job ended meanwhile, or this tray's domain set up."""

    duration_s: float
    skipped: str = ""
    #: a skipped job's user was left a note (``gate.tell_user``)
    told_user: bool = False
    #: the job's state when slurmctld said it no longer wants to start (the prolog then exits 0)
    job_ended: str = ""
    #: the readiness deadline in effect (a set-up only)
    deadline_s: float | None = None
    setup: Setup | None = None
    ok: bool = True
    #: skipped because slurmctld did not say whether the job may share its trays (Slurm 22.05)
    sharing_unknown: bool = False

    def fields(self) -> dict[str, object]:
        """The fields of ``prolog.done``, in their order."""
        extra: dict[str, object] = {"job_ended": self.job_ended} if self.job_ended else {}
        if self.setup is not None:
            extra = {"deadline_s": self.deadline_s, **self.setup.fields()}
        return gate.prolog_fields(self.duration_s, skipped=self.skipped, told_user=self.told_user, **extra)

    def log(self, log: Any) -> None:
        """Write the summary: ``imex.skipped`` first for a skipped job, then ``prolog.done``."""
        lines = [("prolog.done", self.fields())]
        if self.skipped:
            lines = gate.skipped_lines(self.skipped, self.told_user, self.duration_s)
        for event, fields in lines:
            log.info(event, **fields)


class EpilogResult(Record):
    """One epilog that ended well: what its teardown did, and the domains whose daemon ended before the job."""

    duration_s: float
    actions: tuple[Action, ...] = ()
    lost_daemon: tuple[str, ...] = ()
    ok: bool = True
    #: domains whose daemon was stopped while processes of the job's user still held the NVIDIA driver
    busy_stop: tuple[str, ...] = ()

    def fields(self) -> dict[str, object]:
        """The fields of ``epilog.done``, in their order."""
        return gate.epilog_fields(texts(self.actions), self.duration_s, self.lost_daemon, self.busy_stop)


class CleanupResult(Record):
    """One ``imexctl cleanup``: what was done (or would be), what was left and why, failures.

    ``skipped`` names the jobs left because they may still run, and the stray
    channels left while a job's state cannot be read.
    """

    dry_run: bool
    actions: tuple[Action, ...] = ()
    skipped: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()

    def data(self) -> JsonObject:
        """``cleanup.done``'s fields and ``cleanup --json``'s ``data``."""
        return {
            "dry_run": self.dry_run,
            "actions": texts(self.actions, dry_run=self.dry_run),
            "skipped": list(self.skipped),
            "errors": list(self.errors),
        }

    def text(self) -> str:
        """What ``cleanup`` prints without ``--json``: one action per line, then the jobs it left."""
        lines = texts(self.actions, dry_run=self.dry_run) or ["nothing to clean up"]
        return "".join(f"{line}\n" for line in [*lines, *(f"skipped: {why}" for why in self.skipped)])
