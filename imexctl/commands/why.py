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
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from imexctl.platform.record import Record

if TYPE_CHECKING:
    import argparse
    from collections.abc import Iterator, Mapping

    from imexctl.gpu.fabric import Gpu
    from imexctl.platform.host import Host

__all__ = ["MAX_BYTES", "Entry", "command", "log_files", "read_job", "story"]

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
    fields: dict[str, Any]


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


def _lines(path: Path) -> Iterator[bytes]:
    """The file's lines as bytes, never through a symlink (gzip for ``.gz``), none longer than 1 MiB."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as raw:
        if path.name.endswith(".gz"):
            import gzip

            with gzip.GzipFile(fileobj=raw) as unzipped:
                yield from iter(lambda: unzipped.readline(_LINE_MAX), b"")
        else:
            yield from iter(lambda: raw.readline(_LINE_MAX), b"")


def _about(line: dict[str, Any], job_id: int, mention: re.Pattern[str]) -> bool:
    """Whether a log line is about the job: its own run's, or another run's that names it."""
    if str(line.get("job_id")) == str(job_id) or str(line.get("domain_job_id")) == str(job_id):
        return True
    if line.get("event") in ("state.removed", "cleanup.done"):
        return bool(mention.search(_render(line)))
    return False


def read_job(
    files: list[Path], job_id: int, *, max_bytes: int = MAX_BYTES
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The job's log lines in the order they were written, and what was read (files, bytes, lines skipped)."""
    import json

    token = str(job_id).encode()
    mention = re.compile(rf"\bjob {job_id}\b")
    per_file: list[list[dict[str, Any]]] = []
    read: dict[str, Any] = {"files": [], "bytes": 0, "unreadable": 0, "truncated": False, "errors": []}
    for path in files:
        found: list[dict[str, Any]] = []
        try:
            for raw in _lines(path):
                read["bytes"] += len(raw)
                if read["bytes"] > max_bytes:
                    read["truncated"] = True
                    break
                if token not in raw:
                    continue
                try:
                    line = json.loads(raw)
                except ValueError:
                    read["unreadable"] += 1
                    continue
                if isinstance(line, dict) and _about(line, job_id, mention):
                    found.append(line)
        except (OSError, EOFError) as exc:
            read["errors"].append(f"{path}: {getattr(exc, 'strerror', None) or exc}")
        read["files"].append(str(path))
        per_file.append(found)
        if read["truncated"] or (not found and any(per_file[:-1])):  # older than the job's lines: stop
            break
    return [line for found in reversed(per_file) for line in found], read


# ---------------------------------------------------------------- the story


def _render(value: Any) -> str:
    """A value as one line of text; a string as it is."""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return "; ".join(_render(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}={_render(v)}" for k, v in value.items())
    return str(value)


def _prolog_done(line: dict[str, Any]) -> tuple[str, str]:
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


def _epilog_done(line: dict[str, Any]) -> tuple[str, str]:
    if line.get("ok") is False:
        code = _render(line.get("error_code", "?"))
        return "teardown failed", f"teardown failed: {code}: {_render(line.get('reason', ''))}"
    actions = line.get("actions") or []
    if not actions:
        return "", "nothing to tear down here"
    return "torn down", f"torn down: {_render(actions)}"


def _tell(line: dict[str, Any]) -> tuple[str, str] | None:
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


def story(lines: list[dict[str, Any]]) -> tuple[list[str], list[Entry]]:
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


def render_text(job_id: int, node: str, outcomes: list[str], entries: list[Entry], read: dict[str, Any]) -> str:
    """The verdict line, one line per event, the codes' sections, and what was read."""
    lines = [f"job {job_id} on {node}: {', '.join(outcomes) or 'no outcome logged'}"]
    lines += [f"  {e.timestamp}  {e.hook or '-':<7} {e.text}" for e in entries]
    codes = sorted({str(e.fields["error_code"]) for e in entries if e.fields.get("error_code")})
    lines += [f"  see docs/troubleshooting.md#{code}" for code in codes]
    size = read["bytes"] / (1 << 20)
    more = "; stopped at the read limit, older files not read" if read["truncated"] else ""
    lines.append(f"read: {', '.join(read['files'])} ({size:.1f} MiB{more})")
    lines += [f"not read: {err}" for err in read["errors"]]
    return "\n".join(printable(line) for line in lines) + "\n"


def command(args: argparse.Namespace, env: Mapping[str, str], _host: Host | None, _gpu: Gpu | None) -> int:
    """``imexctl why JOBID [--json]``: exit 0 when the log has the job, 1 (``job_not_in_log``) when not."""
    from imexctl.config import schema, settings
    from imexctl.platform.errors import JobNotInLog
    from imexctl.slurm import job as slurm

    node = slurm.node_name(env, or_host=True)
    path, required = schema.find_config(args.config, schema.as_under_slurmd(env))
    cfg = settings.load(path, node=node, required=required)
    if cfg.paths.log_file is None:
        raise JobNotInLog("[paths] log_file is empty: imexctl keeps no log on this tray")
    files = log_files(cfg.paths.log_file)
    lines, read = read_job(files, args.job)
    outcomes, entries = story(lines)
    node = next((str(line["node"]) for line in reversed(lines) if line.get("node") not in (None, "?")), node)
    missing = (
        None if entries else JobNotInLog(f"job {args.job}: no line in {', '.join(read['files']) or cfg.paths.log_file}")
    )
    if args.json:
        from imexctl.platform.output import print_json

        data = {
            "job_id": args.job,
            "node": node,
            "outcomes": outcomes,
            "events": [
                {"timestamp": e.timestamp, "hook": e.hook, "event": e.event, "text": e.text, "line": e.fields}
                for e in entries
            ],
            "read": read,
        }
        print_json(data, errors=[missing] if missing else [])
        return int(missing.exit_code) if missing else 0
    if missing is not None:
        raise missing
    sys.stdout.write(render_text(args.job, node, outcomes, entries, read))
    return 0
