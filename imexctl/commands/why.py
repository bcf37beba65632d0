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

``--log FILE`` (several, ``-`` for standard input, gzip by its magic) reads a
log host's files instead, and needs no config: forwarded syslog with an RFC
3164 or RFC 5424 prefix, ``journalctl -o json`` (or ``-o cat``, or a short
form), imexctl.log itself, several trays' lines merged in one file (issue 42).
Each line is told under its tray: the host name its transport carries (the
syslog HOSTNAME, which the tray's own syslog daemon writes, or the journal's
trusted ``_HOSTNAME``) and the node the line names (``node``, its own text);
a line whose node is not its sender's is told apart, under both names, never
in that node's story.  In journal JSON only lines whose trusted ``_UID`` is 0
are told.  Lines that name the job but cannot be read are counted and named
(file and line) in the text as well as in ``--json``.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Final, cast

from imexctl.platform import Record

if TYPE_CHECKING:
    import argparse
    from collections.abc import Iterator, Mapping
    from typing import IO

    from imexctl.gpu.fabric import Gpu
    from imexctl.platform.host import Host
    from imexctl.platform.output import JsonObject

    #: one log line as logged: a JSON object (data, never trusted)
    Line = Mapping[str, object]

__all__ = [
    "MAX_BYTES",
    "Entry",
    "Found",
    "NotRoots",
    "NotRootsEntry",
    "Read",
    "Story",
    "Tray",
    "TrayStory",
    "Unread",
    "command",
    "log_files",
    "open_roots",
    "parse_line",
    "read_job",
    "read_logs",
    "story",
    "tell",
    "trays",
]

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
    """What :func:`read_job` or :func:`read_logs` read: files, bytes, lines it could not read, whether it stopped early.

    ``skipped``: ``(file, why)`` of each file left out unread because it is not
    root's record (:func:`open_roots`).  With ``--log`` (:func:`read_logs`):
    ``lines`` read; ``unread``: ``file:line: why`` of the first
    :data:`_SHOWN` lines that name the job but could not be read
    (``unreadable`` counts them all); ``others``: imexctl's journal entries
    left out because their ``_UID`` is not 0, the first of them in
    ``not_roots``; ``duplicates``: lines told once that came again.
    """

    files: tuple[str, ...]
    bytes: int
    unreadable: int
    truncated: bool
    errors: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...] = ()
    lines: int = 0
    unread: tuple[str, ...] = ()
    others: int = 0
    not_roots: tuple[str, ...] = ()
    duplicates: int = 0

    def data(self) -> JsonObject:
        """The ``read`` object of ``why --json``."""
        skipped: list[JsonObject] = [{"file": f, "why": why} for f, why in self.skipped]
        listed = {"files": list(self.files), "errors": list(self.errors), "skipped": skipped}
        return {**self._asdict(), **listed, "unread": list(self.unread), "not_roots": list(self.not_roots)}


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


# ---------------------------------------------------------------- a log host's files (--log)

#: how many unread lines, and lines of others, are named (all are counted)
_SHOWN: Final = 10
#: RFC 5424 section 6: PRI (optional in a file: a template may leave it out), VERSION, TIMESTAMP (FULL-DATE "T"
#: FULL-TIME, up to 6 digits of fraction, "Z" or +hh:mm) or NILVALUE, then HOSTNAME, APP-NAME, PROCID, MSGID of
#: PRINTUSASCII (1*255, 1*48, 1*128, 1*32) or NILVALUE, STRUCTURED-DATA (NILVALUE or SD-ELEMENTs, whose
#: PARAM-VALUE escapes '"', '\' and ']'), then SP and MSG, which may start with a BOM (design.md source syslog-rfc5424)
_RFC5424: Final = re.compile(
    r"(?:<(?P<pri>\d{1,3})>)?(?:[1-9]\d{0,2} )"
    r"(?:-|\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,6})?(?:Z|[+-]\d{2}:\d{2})) "
    r"(?P<host>[!-~]{1,255}) (?P<app>[!-~]{1,48}) (?P<procid>[!-~]{1,128}) (?:[!-~]{1,32}) "
    r'(?:-|(?:\[[!#-<>-\\^-~]{1,32}(?: [!#-<>-\\^-~]{1,32}="(?:[^"\\\]]|\\.)*")*\])+)'
    r"(?: (?P<msg>.*))?",
    re.DOTALL,
)
#: RFC 3164 section 4.1: PRI (optional in a file), TIMESTAMP ``Mmm dd hh:mm:ss`` (a day below 10 after a space;
#: journalctl's short forms pad it with 0 and may add a fraction) or, as rsyslog's RSYSLOG_FileFormat and
#: journalctl -o short-iso write it, an RFC 3339 time; HOSTNAME; the TAG (``imexctl[pid]:``; rsyslog writes a
#: line it got in RFC 5424 as ``APP-NAME[PROCID]`` with no colon), then the CONTENT (design.md source syslog-rfc3164)
_RFC3164: Final = re.compile(
    r"(?:<(?P<pri>\d{1,3})>)?"
    r"(?:[A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2}(?:\.\d{1,9})?"
    r"|\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?(?:Z|[+-]\d{2}:?\d{2})) "
    r"(?P<host>\S+) (?P<app>[^\s\[\]:]{1,48})(?:\[[^\]\s]*\])?:?(?: (?P<msg>.*))?",
    re.DOTALL,
)
#: a journal entry's MESSAGE that is no text: an array of bytes, or null (journalctl -o json)
_NOT_TEXT: Final = re.compile(rb'"MESSAGE"\s*:\s*[\[n]')
#: the ident of imexctl's syslog lines (docs/events.md)
_IDENT: Final = "imexctl"
#: the largest PRIVAL: facility 23, severity 7
_PRI_MAX: Final = 191


class Unread(Exception):
    """A line that names the job in no form :func:`parse_line` reads, or imexctl's line broken; the message says why."""


class NotRootsEntry(Exception):
    """A journal entry of imexctl's that another user than root sent (its ``_UID``); the message says whose."""


def parse_line(text: str) -> tuple[str | None, Line] | None:
    """The host that sent a line and imexctl's JSON object in it; None for a line of another program.

    The forms: journal JSON (``journalctl -o json``, also ``json-seq``), a
    line of imexctl as logged (``imexctl.log``, ``journalctl -o cat``), and a
    syslog line with an RFC 5424 or RFC 3164 prefix.

    Raises:
        Unread: a line in no form, or of imexctl's with no JSON object in it.
        NotRootsEntry: a journal entry of imexctl's that another user sent.
    """
    import json

    text = text.rstrip("\r\n").lstrip("\x1e")  # json-seq's record separator
    if text.startswith("{"):
        try:
            obj = json.loads(text)
        except ValueError:
            raise Unread("not a JSON object (cut short?)") from None
        if not isinstance(obj, dict):
            raise Unread("not a JSON object")
        if "event" in obj:
            return None, obj
        if "MESSAGE" in obj or "__CURSOR" in obj:
            return _journal_entry(obj)
        return None
    for form in (_RFC5424, _RFC3164):
        m = form.fullmatch(text)
        if m and int(m["pri"] or 0) <= _PRI_MAX:
            if m["app"] != _IDENT:
                return None
            host = None if m["host"] == "-" else m["host"]
            return host, _message((m["msg"] or "").lstrip(" ").removeprefix("\ufeff"))
    raise Unread("no form: neither RFC 5424, RFC 3164, journal JSON nor a line of imexctl")


def _message(text: str) -> Line:
    """The JSON object of imexctl's in a syslog message."""
    import json

    try:
        obj = json.loads(text)
    except ValueError:
        obj = None
    if not isinstance(obj, dict) or "event" not in obj:
        raise Unread("not a JSON object of imexctl's (cut short by a syslog's message size?)")
    return obj


def _journal_entry(entry: dict[str, object]) -> tuple[str | None, Line] | None:
    """Host and line of one entry of ``journalctl -o json``; None for another program's entry.

    ``MESSAGE`` is a string, or an array of bytes (not printable, not UTF-8), or
    null (over 4096 bytes, unless ``journalctl --all``); ``_UID`` and
    ``_HOSTNAME`` are trusted fields, which journald adds itself (design.md
    source journal-json).
    """
    if entry.get("SYSLOG_IDENTIFIER") != _IDENT:
        return None
    if entry.get("_UID") != "0":
        raise NotRootsEntry(f"_UID {printable(str(entry.get('_UID', 'absent')))[:20]}")
    message = entry.get("MESSAGE")
    if message is None:
        raise Unread("MESSAGE null: journalctl leaves out a field over 4096 bytes (journalctl -o json --all)")
    if isinstance(message, list) and all(isinstance(b, int) and 0 <= b < 256 for b in message):
        try:
            message = bytes(message).decode()
        except UnicodeDecodeError:
            raise Unread("not UTF-8: a MESSAGE of bytes") from None
    if not isinstance(message, str):
        raise Unread("a MESSAGE that is no string")
    host = entry.get("_HOSTNAME")
    return (host if isinstance(host, str) and host else None), _message(message)


class Found(Record):
    """A line of the job's, with the host that sent it (None: a line with no transport, the tray's own log)."""

    host: str | None
    line: Line


class _Reading:
    """What :func:`read_logs` has read so far."""

    def __init__(self, job_id: int, max_bytes: int) -> None:
        self.token, self.mention = str(job_id).encode(), re.compile(rf"\bjob {job_id}\b")
        self.job_id, self.left = job_id, max_bytes
        self.found: list[Found] = []
        self.seen: set[tuple[str | None, str]] = set()
        self.files: list[str] = []
        self.errors: list[str] = []
        self.unread: list[str] = []
        self.not_roots: list[str] = []
        self.size = self.lines = self.unreadable = self.others = self.duplicates = 0
        self.truncated = False

    def read(self) -> Read:
        """The :class:`Read` of it all."""
        return Read(
            tuple(self.files), self.size, self.unreadable, self.truncated, tuple(self.errors),
            lines=self.lines, unread=tuple(self.unread), others=self.others, not_roots=tuple(self.not_roots),
            duplicates=self.duplicates,
        )  # fmt: skip

    def line(self, where: str, raw: bytes) -> None:
        """Take one line: the job's, another's, or one that cannot be read."""
        self.lines += 1
        # a journal entry whose MESSAGE is bytes or left out may be about any job: it counts when unread
        named = self.token in raw or (b'"MESSAGE"' in raw and _NOT_TEXT.search(raw) is not None)
        if not named:
            return
        try:
            parsed = parse_line(raw.decode(errors="replace"))
        except Unread as exc:
            self.unreadable += 1
            self.unread += [f"{where}: {exc}"] if len(self.unread) < _SHOWN else []
            return
        except NotRootsEntry as exc:
            self.others += 1
            self.not_roots += [f"{where}: {exc}"] if len(self.not_roots) < _SHOWN else []
            return
        if parsed is None or not _about(parsed[1], self.job_id, self.mention):
            return
        key = (parsed[0], _render_key(parsed[1]))
        if key in self.seen:
            self.duplicates += 1
            return
        self.seen.add(key)
        self.found.append(Found(*parsed))


def _render_key(line: Line) -> str:
    """A line's identity, to tell each once: its JSON, keys sorted."""
    import json

    return json.dumps(line, sort_keys=True, default=str)


def read_logs(paths: list[str], job_id: int, *, max_bytes: int = MAX_BYTES) -> tuple[list[Found], Read]:
    """The job's lines in the files an admin named (``-``: standard input), in the order read, and what was read.

    A file is read whole (gzip by its first bytes), each line taken by
    :func:`parse_line`; a file that cannot be opened is named in
    :attr:`Read.errors` and the others are read.  Files an admin names are
    taken as they are: symlinks followed, a pipe read (``<(ssh tray ...)``).
    """
    reading = _Reading(job_id, max_bytes)
    for path in paths:
        if reading.truncated:
            break
        try:
            raw = sys.stdin.buffer if path == "-" else open(path, "rb")  # noqa: SIM115  # closed below
        except OSError as exc:
            reading.errors.append(f"{path}: {exc.strerror or exc}")
            continue
        reading.files.append(path)
        try:
            _read_one(reading, path, raw)
        except (OSError, EOFError) as exc:
            reading.errors.append(f"{path}: {getattr(exc, 'strerror', None) or exc}")
        finally:
            if path != "-":
                raw.close()
    return reading.found, reading.read()


def _read_one(reading: _Reading, path: str, raw: IO[bytes]) -> None:
    """Every line of one open file (gzip when it starts with gzip's magic), until the read limit."""
    import io

    buffered = raw if isinstance(raw, io.BufferedReader) else io.BufferedReader(cast("io.RawIOBase", raw))
    if buffered.peek(2)[:2] == b"\x1f\x8b":
        import gzip

        stream: IO[bytes] = gzip.GzipFile(fileobj=buffered)  # type: ignore[assignment]
    else:
        stream = buffered
    for number, line in enumerate(iter(lambda: stream.readline(_LINE_MAX), b""), 1):
        reading.size += len(line)
        if reading.size > reading.left:
            reading.truncated = True
            return
        reading.line(f"{path}:{number}", line)


# ---------------------------------------------------------------- per tray


class Tray(Record):
    """One tray's share of the job's lines: the host that sent them (None: no transport) and the node they name."""

    host: str | None
    node: str | None
    lines: tuple[Line, ...]

    @property
    def name(self) -> str:
        """How the tray is named in the text: its host, and the node its lines name when that is another."""
        node, host = self.node, self.host
        if host is None:
            return node or "?"
        if node is None or node in (host, host.split(".", 1)[0]):
            return host
        return f"{host} (its lines name node {node})"


def trays(found: list[Found]) -> list[Tray]:
    """The lines per tray: by the host that sent them and the node they name, each tray's lines by their time.

    The host (the syslog HOSTNAME, the journal's ``_HOSTNAME``) is what the
    sending machine's syslog daemon or journald wrote; the node is the line's
    own text (``node``, from ``SLURMD_NODENAME``).  So a line naming another
    node than its sender's is a tray of its own, shown under both names, and
    never joins that node's story.  Lines with no node (an admin's command)
    join the one tray of their host, if it has one.
    """
    groups: dict[tuple[str | None, str | None], list[Line]] = {}
    for f in found:
        node = f.line.get("node")
        groups.setdefault((f.host, str(node) if node not in (None, "?") else None), []).append(f.line)
    for host, node in [k for k in groups if k[1] is None]:
        named = [k for k in groups if k[0] == host and k[1] is not None]
        if len(named) == 1:
            groups[named[0]] += groups.pop((host, node))
    out = [Tray(host, node, tuple(sorted(lines, key=_when))) for (host, node), lines in groups.items()]
    return sorted(out, key=lambda t: (_natural(t.host or t.node or ""), _natural(t.node or "")))


def _when(line: Line) -> str:
    """A line's time as a sortable text: ``...:16Z`` is ``...:16.000000Z`` (utc_timestamp leaves out zeros)."""
    stamp = str(line.get("timestamp", ""))
    return stamp if "." in stamp else stamp.replace("Z", ".000000Z")


def _natural(name: str) -> tuple[object, ...]:
    """``tray2`` before ``tray10``."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


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


class TrayStory(Record):
    """One tray's share of the answer: its host and node (:class:`Tray`), its outcomes in order, its events."""

    host: str | None
    node: str | None
    name: str
    outcomes: tuple[str, ...]
    entries: tuple[Entry, ...]

    def data(self) -> JsonObject:
        """One object of ``why --json``'s ``trays``."""
        events: list[JsonObject] = [e.data() for e in self.entries]
        return {"node": self.node, "host": self.host, "outcomes": list(self.outcomes), "events": events}


def tell(tray: Tray) -> TrayStory:
    """A tray's story: :func:`story` of its lines."""
    outcomes, entries = story(list(tray.lines))
    return TrayStory(tray.host, tray.node, tray.name, tuple(outcomes), tuple(entries))


class Story(Record):
    """``imexctl why``'s answer: the job, per tray its outcomes in order and its events, and what was read.

    This tray's log (no ``--log``): ``node``, ``outcomes`` and ``entries`` are
    this tray's story, as they always were.  A log host's files (``fleet``):
    only ``trays``.
    """

    job_id: int
    node: str
    outcomes: tuple[str, ...]
    entries: tuple[Entry, ...]
    read: Read
    trays: tuple[TrayStory, ...] = ()
    fleet: bool = False

    def data(self) -> JsonObject:
        """``why --json``'s ``data``: each event with the line as logged."""
        trays: list[JsonObject] = [t.data() for t in self.trays]
        if self.fleet:
            return {"job_id": self.job_id, "trays": trays, "read": self.read.data()}
        return {
            "job_id": self.job_id,
            "node": self.node,
            "outcomes": list(self.outcomes),
            "events": [e.data() for e in self.entries],
            "trays": trays,
            "read": self.read.data(),
        }


#: what a file left out means, and where to look next
_SKIPPED_HINT: Final = (
    "a file root does not own, or that group or others may write, may hold anybody's lines "
    "(imexctl doctor: imexctl.log_dir says who may write the log's directory)"
)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def render_text(found: Story) -> str:
    """Per tray the verdict line, one line per event and the codes' sections; then what was read."""
    lines: list[str] = []
    for tray in found.trays:
        lines.append(f"job {found.job_id} on {tray.name}: {', '.join(tray.outcomes) or 'no outcome logged'}")
        lines += [f"  {e.timestamp}  {e.hook or '-':<7} {e.text}" for e in tray.entries]
        codes = sorted({str(e.fields["error_code"]) for e in tray.entries if e.fields.get("error_code")})
        lines += [f"  see docs/troubleshooting.md#{code}" for code in codes]
    read = found.read
    lines += [f"skipped {path}: {why}, left out" for path, why in read.skipped]
    if read.skipped:
        lines.append(f"  only root's records are told: {_SKIPPED_HINT}")
    size, told = f"{read.bytes / (1 << 20):.1f} MiB", ""
    if found.fleet:
        size += f", {_plural(read.lines, 'line')}"
        told = f"; {_plural(len(found.trays), 'tray')}"
    if read.truncated:
        size += "; stopped at the read limit, " + ("the rest not read" if found.fleet else "older files not read")
    lines.append(f"read: {', '.join(read.files) or 'nothing'} ({size}){told}")
    lines += _not_told(read)
    lines += [f"not read: {err}" for err in read.errors]
    return "\n".join(printable(line) for line in lines) + "\n"


def _not_told(read: Read) -> list[str]:
    """The lines about what was not told: lines that could not be read, others' lines, duplicates."""
    out = []
    if read.unreadable:
        shown = f": {'; '.join(read.unread)}{'; ...' if read.unreadable > len(read.unread) else ''}"
        out.append(f"could not read {_plural(read.unreadable, 'line')}{shown if read.unread else ''}")
    if read.others:
        shown = "; ".join(read.not_roots) + ("; ..." if read.others > len(read.not_roots) else "")
        out.append(f"left out {_plural(read.others, 'line')} of imexctl's that root did not send: {shown}")
    if read.duplicates:
        out.append(f"told once: {_plural(read.duplicates, 'line')} read again")
    return out


def command(args: argparse.Namespace, env: Mapping[str, str], _host: Host | None, _gpu: Gpu | None) -> int:
    """``imexctl why JOBID [--json] [--log FILE ...]``: exit 0 when a log has the job, 1 (``job_not_in_log``) if not.

    Without ``--log``, this tray's log by its config: a file left out
    because it is not root's record does not change the exit code by itself
    (as one that cannot be read): the story is told from root's files with
    the file named; when they hold no line about the job, the
    ``job_not_in_log`` message names what was left out.  With ``--log``, the
    files named, and no config read (a log host has none).
    """
    from imexctl.platform.errors import JobNotInLog

    if args.log:
        found_lines, read = read_logs(list(args.log), args.job)
        told = tuple(tell(t) for t in trays(found_lines))
        found = Story(args.job, "", (), (), read, told, fleet=True)
        missing = None if any(t.entries for t in told) else JobNotInLog(_not_in_logs(args.job, read))
    else:
        found, log_file = _this_tray(args, env)
        told_here = any(t.entries for t in found.trays)
        missing = None if told_here else JobNotInLog(_not_in_log(args.job, found.read, log_file))
    if args.json:
        from imexctl.platform.output import print_json

        print_json(found, errors=[missing] if missing else [])
        return int(missing.exit_code) if missing else 0
    if missing is not None:
        raise missing
    sys.stdout.write(render_text(found))
    return 0


def _this_tray(args: argparse.Namespace, env: Mapping[str, str]) -> tuple[Story, Path]:
    """The job's story from this tray's log (``[paths] log_file`` and its rotated copies), and the log's path."""
    from imexctl.hooks.runtime import Needs, build
    from imexctl.platform.errors import JobNotInLog

    # the file the hooks read under slurmd (issue 23): their log
    built = build("why", env, Needs(logs="none", gpu="none"), config=args.config)
    cfg, node = built.rt.settings, built.node
    if cfg.paths.log_file is None:
        raise JobNotInLog(
            "[paths] log_file is empty: imexctl keeps no log on this tray; with [log] syslog = yes its journal has"
            f" the lines: journalctl -t imexctl -o json --all | imexctl why {args.job} --log -"
        )
    lines, read = read_job(log_files(cfg.paths.log_file), args.job)
    grouped = [Tray(None, t.node or node, t.lines) for t in trays([Found(None, line) for line in lines])]
    told = tuple(tell(t) for t in grouped)
    mine = [t for t in told if t.node == node] or (list(told) if len(told) == 1 else [])
    if mine:
        here = mine[0]
        return Story(args.job, here.name, here.outcomes, here.entries, read, told), cfg.paths.log_file
    return Story(args.job, node, (), (), read, told), cfg.paths.log_file


def _not_in_log(job_id: int, read: Read, log_file: Path) -> str:
    """``job_not_in_log``'s message: the files read, and those left out as not root's record."""
    if not read.skipped:
        return f"job {job_id}: no line in {', '.join(read.files) or log_file}"
    left_out = "; ".join(f"skipped {path}: {why}" for path, why in read.skipped)
    return f"job {job_id}: no line in root's records; {left_out}; read: {', '.join(read.files) or 'nothing'}"


def _not_in_logs(job_id: int, read: Read) -> str:
    """``job_not_in_log``'s message with ``--log``: the files read, lines that named the job but were not told."""
    text = f"job {job_id}: no line in {', '.join(read.files) or 'nothing'} ({_plural(read.lines, 'line')})"
    if read.unreadable:
        shown = f": {'; '.join(read.unread)}" if read.unread else ""
        text += f"; {_plural(read.unreadable, 'line')} naming it could not be read{shown}"
    if read.others:
        shown = "; ".join(read.not_roots)
        text += f"; left out {_plural(read.others, 'line')} of imexctl's that root did not send: {shown}"
    if read.truncated:
        text += "; stopped at the read limit"
    return text + "".join(f"; not read: {err}" for err in read.errors)
