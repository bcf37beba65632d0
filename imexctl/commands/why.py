"""``imexctl why JOBID``: what happened to one job on this tray, told from imexctl's own log.

Day 2 starts from a job id ("job 18306 had no IMEX").  The hooks leave one
JSON line per event, keyed by ``job_id`` (docs/events.md); this command finds
that job's lines in ``[paths] log_file`` and the files logrotate made of it
(``imexctl.log.1``, ``imexctl.log.2.gz``, ...; pkg/logrotate), newest first,
and tells them as a story: skipped and why, set up, failed with its code and
reason, lost its daemon, torn down.  It also names the lines other runs wrote
about the job: another job's prolog that removed its leftovers, ``cleanup``.

The log can be large: a line is parsed only when its bytes hold the job id,
the files are read newest first and the reading stops at the first older file
without the job once the job was found, or after :data:`MAX_BYTES`.  Log lines
are data: every value printed is escaped (a reason may quote a user's text).

Only root's records are told (issue 41).  The log's directory may be one its
group may write (Ubuntu's ``/var/log`` is ``root:syslog 0775``, which the
hooks accept): a member can rename a file of their own over ``imexctl.log``
or a rotated copy.  So each file is opened without following a symlink and
without waiting (a FIFO), and judged on the open file (``fstat``): a regular
file owned by root that neither group nor others may write.  Anything else is
left out, unread, and named with its owner and mode (``read.skipped``); the
story is told from the rest, and a job found in none of root's files is
``job_not_in_log`` whose message names what was left out.  That is stricter
than the hooks' rule for appending (``log.open_log_file`` also takes a file
of this process's user, and one its group may write): a line in such a file
may be anybody's.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Final

from imexctl.platform import Record

if TYPE_CHECKING:
    import argparse
    from collections.abc import Iterator, Mapping

    from imexctl.gpu.fabric import Gpu
    from imexctl.platform.host import Host
    from imexctl.platform.output import JsonObject

    #: one log line as logged: a JSON object (data, never trusted)
    Line = Mapping[str, object]

__all__ = ["MAX_BYTES", "Entry", "NotRoots", "Read", "Story", "command", "log_files", "open_roots", "read_job", "story"]

#: at most this many bytes are read (decompressed) in one run: about two months of a busy tray's log
MAX_BYTES: Final = 512 << 20
#: a rotated copy of the log: ``imexctl.log.1``, ``imexctl.log.2.gz``, ``imexctl.log-20261202[.gz]``
_ROTATED: Final = re.compile(r"[.-](\d+)(\.gz)?$")


class Entry(Record):
    """One line of the job's story: when, which command, the event, a sentence, the line as logged."""

    timestamp: str
    hook: str
    event: str
    text: str
    fields: Line

    def data(self) -> JsonObject:
        """The event's object in ``why --json``'s ``events``, with the line as logged."""
        line = dict(self.fields)
        return {"timestamp": self.timestamp, "hook": self.hook, "event": self.event, "text": self.text, "line": line}  # type: ignore[dict-item]  # a JSON object as read


class Read(Record):
    """What :func:`read_job` read: the files, the bytes, the lines it could not parse, whether it stopped early.

    ``skipped``: ``(file, why)`` of each file left out unread because it is not
    root's record (:func:`open_roots`).
    """

    files: tuple[str, ...]
    bytes: int
    unreadable: int
    truncated: bool
    errors: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...] = ()

    def data(self) -> JsonObject:
        """The ``read`` object of ``why --json``."""
        skipped: list[JsonObject] = [{"file": f, "why": why} for f, why in self.skipped]
        return {**self._asdict(), "files": list(self.files), "errors": list(self.errors), "skipped": skipped}


def log_files(log_file: Path) -> list[Path]:
    """The log and its rotated copies beside it, newest first (the log itself, then by modification time)."""
    found = []
    try:
        names = os.listdir(log_file.parent)
    except OSError:
        names = []
    for name in names:
        if name.startswith(log_file.name) and _ROTATED.fullmatch(name[len(log_file.name) :]):
            path = log_file.parent / name
            try:
                found.append((os.lstat(path).st_mtime, path))
            except OSError:
                continue
    rotated = [p for _, p in sorted(found, key=lambda x: x[0], reverse=True)]
    return [log_file, *rotated] if os.path.lexists(log_file) else rotated


#: a longer line is read in pieces (a log line is a few KiB; a file without newlines must not fill the memory)
_LINE_MAX: Final = 1 << 20


class NotRoots(Exception):
    """A file at the log's path or a rotated copy's that is not root's record; the message says why."""


def open_roots(path: Path) -> int:
    """A descriptor of ``path`` open for reading, when it is root's record: else :class:`NotRoots` says why.

    Root's record is a regular file (``fsutil.open_regular``: never through a
    symlink, never waiting on a FIFO) owned by uid 0 that neither group nor
    others may write, judged on the open file.

    Raises:
        NotRoots: a symlink, not a regular file, another owner, or writable by group or others.
        OSError: it could not be opened (absent, a permission).
    """
    from imexctl.platform.fsutil import open_regular

    try:
        fd = open_regular(path)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EINVAL):
            raise NotRoots(exc.strerror) from None
        raise
    st = os.fstat(fd)
    if st.st_uid != 0 or st.st_mode & 0o022:
        os.close(fd)
        raise NotRoots(f"not root's record (owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o})")
    return fd


def _lines(fd: int, gz: bool) -> Iterator[bytes]:
    """The lines of the open file ``fd`` as bytes (gzip when ``gz``), none longer than 1 MiB; ``fd`` is closed."""
    with os.fdopen(fd, "rb") as raw:
        if gz:
            import gzip

            with gzip.GzipFile(fileobj=raw) as unzipped:
                yield from iter(lambda: unzipped.readline(_LINE_MAX), b"")
        else:
            yield from iter(lambda: raw.readline(_LINE_MAX), b"")


def _about(line: Line, job_id: int, mention: re.Pattern[str]) -> bool:
    """Whether a log line is about the job: its own run's, or another run's that names it."""
    if str(line.get("job_id")) == str(job_id) or str(line.get("domain_job_id")) == str(job_id):
        return True
    if line.get("event") in ("state.removed", "cleanup.done"):
        return bool(mention.search(_render(line)))
    return False


class _FileRead(Record):
    """One file's share of :func:`read_job`: the job's lines, bytes, lines not parsed, budget spent, an error.

    ``skipped``: why the file was left out unread ('' when it was read).
    """

    lines: list[Line]
    size: int
    unreadable: int
    truncated: bool
    error: str
    skipped: str = ""


def _job_lines(path: Path, job_id: int, budget: int) -> _FileRead:
    """The job's lines in one file, read until its end, ``budget`` bytes, or an error (what came before it kept).

    A file that is not root's record (:func:`open_roots`) is not read at all.
    """
    import json

    token = str(job_id).encode()
    mention = re.compile(rf"\bjob {job_id}\b")
    found: list[Line] = []
    size = unreadable = 0
    try:
        fd = open_roots(path)
    except NotRoots as exc:
        return _FileRead([], 0, 0, False, "", str(exc))
    except OSError as exc:
        return _FileRead([], 0, 0, False, f"{path}: {exc.strerror or exc}")
    try:
        for raw in _lines(fd, path.name.endswith(".gz")):
            size += len(raw)
            if size > budget:
                return _FileRead(found, size, unreadable, True, "")
            if token not in raw:
                continue
            try:
                line = json.loads(raw)
            except ValueError:
                unreadable += 1
                continue
            if isinstance(line, dict) and _about(line, job_id, mention):
                found.append(line)
    except (OSError, EOFError) as exc:
        return _FileRead(found, size, unreadable, False, f"{path}: {getattr(exc, 'strerror', None) or exc}")
    return _FileRead(found, size, unreadable, False, "")


def read_job(files: list[Path], job_id: int, *, max_bytes: int = MAX_BYTES) -> tuple[list[Line], Read]:
    """The job's log lines in the order they were written, and what was read (files, bytes, lines skipped).

    Only root's records are read: the files that are not are left out and
    named in :attr:`Read.skipped`; they count for nothing else (neither as
    read nor as the older file where the reading stops).
    """
    per_file: list[list[Line]] = []
    read: list[str] = []
    errors: list[str] = []
    skipped: list[tuple[str, str]] = []
    size = unreadable = 0
    truncated = False
    for path in files:
        one = _job_lines(path, job_id, max_bytes - size)
        if one.skipped:
            skipped.append((str(path), one.skipped))
            continue
        size, unreadable, truncated = size + one.size, unreadable + one.unreadable, one.truncated
        errors += [one.error] if one.error else []
        read.append(str(path))
        per_file.append(one.lines)
        if truncated or (not one.lines and any(per_file[:-1])):  # older than the job's lines: stop
            break
    lines = [line for found in reversed(per_file) for line in found]
    return lines, Read(tuple(read), size, unreadable, truncated, tuple(errors), tuple(skipped))


# ---------------------------------------------------------------- the story


def _render(value: object) -> str:
    """A value as one line of text; a string as it is."""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return "; ".join(_render(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}={_render(v)}" for k, v in value.items())
    return str(value)


def _prolog_done(line: Line) -> tuple[str, str]:
    if line.get("job_ended"):
        return "job ended", "the job ended while its prolog waited: rolled back, exit 0, no drain"
    if line.get("ok") is False:
        code = _render(line.get("error_code", "?"))
        return (
            "failed",
            f"failed: {code} (exit {_render(line.get('exit_code', '?'))}): {_render(line.get('reason', ''))}",
        )
    if line.get("skipped"):
        told = " (the job's output says why)" if line.get("told_user") else ""
        return "skipped", f"skipped: {_render(line['skipped'])}{told}"
    ready = "ready" if line.get("ready", True) else f"not ready, peers blamed: {_render(line.get('blamed', []))}"
    channel = f", channel {_render(line['channel'])}" if line.get("channel") else ""
    what = f"set up: {_render(line.get('trays', '?'))} trays, port {_render(line.get('port', '?'))}{channel}, {ready}"
    return "set up", f"{what}, in {_render(line.get('duration_s', '?'))} s"


def _epilog_done(line: Line) -> tuple[str, str]:
    if line.get("ok") is False:
        code = _render(line.get("error_code", "?"))
        return "teardown failed", f"teardown failed: {code}: {_render(line.get('reason', ''))}"
    actions = line.get("actions") or []
    if not actions:
        return "", "nothing to tear down here"
    return "torn down", f"torn down: {_render(actions)}"


def _tell(line: Line) -> tuple[str, str] | None:
    """The outcome a line adds ('' for none) and how it is told; None for a line the story leaves out."""
    event = line.get("event")
    get = line.get
    if event == "prolog.done":
        return _prolog_done(line)
    if event == "epilog.done":
        return _epilog_done(line)
    if event in ("imexctl.failed", "imexctl.crashed"):
        if event == "imexctl.crashed":
            return "crashed", "crashed: a bug, the line holds the traceback"
        code, rc = _render(get("error_code", "?")), _render(get("exit_code", "?"))
        return "failed", f"failed: {code} (exit {rc}): {_render(get('reason', ''))}"
    told = {
        "imex.skipped": ("", f"skipped: {_render(get('reason', ''))}"),
        "imex.daemon.started": (
            "",
            f"daemon started ({_render(get('backend', '?'))}, port {_render(get('port', '?'))})",
        ),
        "imex.ready": ("", f"domain ready: {_render(get('status', ''))} after {_render(get('waited_s', '?'))} s"),
        "imex.not_ready": ("", f"not ready at the deadline: {_render(get('status', ''))}"),
        "imex.peer_blamed": ("", f"peers blamed: {_render(get('peers', []))}"),
        "prolog.job_ended": ("job ended", f"the job ended while its prolog ran ({_render(get('job_state', ''))})"),
        "prolog.rolled_back": ("", f"rolled back: {_render(get('actions') or get('error', ''))}"),
        "imex.daemon.lost": ("lost its daemon", f"lost its daemon: {_render(get('how', ''))}"),
        "slurm.drained": ("", f"drained the node: {_render(get('drain_reason', ''))}"),
        "slurm.drain_failed": ("", f"could not drain the node with its reason: {_render(get('problem', ''))}"),
        "state.removed": ("", f"leftovers removed: {_render(get('reason', ''))}"),
        "cleanup.done": ("", f"imexctl cleanup: {_render(get('actions', []))}"),
    }
    return told.get(str(event))


def story(lines: list[Line]) -> tuple[list[str], list[Entry]]:
    """The outcomes in order (each once: set up, lost its daemon, torn down) and one entry per told line."""
    outcomes: list[str] = []
    entries = []
    for line in lines:
        told = _tell(line)
        if told is None:
            continue
        outcome, text = told
        if outcome and outcome not in outcomes:
            outcomes.append(outcome)
        hook = _render(line.get("hook", ""))
        entries.append(Entry(_render(line.get("timestamp", "?")), hook, str(line.get("event")), text, line))
    return outcomes, entries


# ---------------------------------------------------------------- the command


def printable(text: str) -> str:
    """``text`` with every non-printing character escaped as Python writes it: log lines are data."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class Story(Record):
    """``imexctl why``'s answer: the job on this tray, its outcomes in order, its events, and what was read."""

    job_id: int
    node: str
    outcomes: tuple[str, ...]
    entries: tuple[Entry, ...]
    read: Read

    def data(self) -> JsonObject:
        """``why --json``'s ``data``: each event with the line as logged."""
        return {
            "job_id": self.job_id,
            "node": self.node,
            "outcomes": list(self.outcomes),
            "events": [e.data() for e in self.entries],
            "read": self.read.data(),
        }


#: what a file left out means, and where to look next
_SKIPPED_HINT: Final = (
    "a file root does not own, or that group or others may write, may hold anybody's lines "
    "(imexctl doctor: imexctl.log_dir says who may write the log's directory)"
)


def render_text(found: Story) -> str:
    """The verdict line, one line per event, the codes' sections, and what was read."""
    lines = [f"job {found.job_id} on {found.node}: {', '.join(found.outcomes) or 'no outcome logged'}"]
    lines += [f"  {e.timestamp}  {e.hook or '-':<7} {e.text}" for e in found.entries]
    codes = sorted({str(e.fields["error_code"]) for e in found.entries if e.fields.get("error_code")})
    lines += [f"  see docs/troubleshooting.md#{code}" for code in codes]
    read = found.read
    more = "; stopped at the read limit, older files not read" if read.truncated else ""
    lines += [f"skipped {path}: {why}, left out" for path, why in read.skipped]
    if read.skipped:
        lines.append(f"  only root's records are told: {_SKIPPED_HINT}")
    lines.append(f"read: {', '.join(read.files) or 'nothing'} ({read.bytes / (1 << 20):.1f} MiB{more})")
    lines += [f"not read: {err}" for err in read.errors]
    return "\n".join(printable(line) for line in lines) + "\n"


def command(args: argparse.Namespace, env: Mapping[str, str], _host: Host | None, _gpu: Gpu | None) -> int:
    """``imexctl why JOBID [--json]``: exit 0 when root's log files have the job, 1 (``job_not_in_log``) when not.

    A file left out because it is not root's record does not change the exit
    code by itself (as one that cannot be read): the story is told from root's
    files with the file named; when they hold no line about the job, the
    ``job_not_in_log`` message names what was left out.
    """
    from imexctl.hooks.runtime import Needs, build
    from imexctl.platform.errors import JobNotInLog

    # the file the hooks read under slurmd (issue 23): their log
    built = build("why", env, Needs(logs="none", gpu="none"), config=args.config)
    cfg, node = built.rt.settings, built.node
    if cfg.paths.log_file is None:
        raise JobNotInLog("[paths] log_file is empty: imexctl keeps no log on this tray")
    lines, read = read_job(log_files(cfg.paths.log_file), args.job)
    outcomes, entries = story(lines)
    node = next((str(line["node"]) for line in reversed(lines) if line.get("node") not in (None, "?")), node)
    found = Story(args.job, node, tuple(outcomes), tuple(entries), read)
    missing = None if entries else JobNotInLog(_not_in_log(args.job, read, cfg.paths.log_file))
    if args.json:
        from imexctl.platform.output import print_json

        print_json(found, errors=[missing] if missing else [])
        return int(missing.exit_code) if missing else 0
    if missing is not None:
        raise missing
    sys.stdout.write(render_text(found))
    return 0


def _not_in_log(job_id: int, read: Read, log_file: Path) -> str:
    """``job_not_in_log``'s message: the files read, and those left out as not root's record."""
    if not read.skipped:
        return f"job {job_id}: no line in {', '.join(read.files) or log_file}"
    left_out = "; ".join(f"skipped {path}: {why}" for path, why in read.skipped)
    return f"job {job_id}: no line in root's records; {left_out}; read: {', '.join(read.files) or 'nothing'}"
