"""``imexctl why JOBID --log`` on the lab's real logs, in every forwarded form, with and without trays merged.

Two jobs under real slurmds: one set up and torn down on the four trays, and one whose prolog fails on node2
(its daemon never ready: the others wait for the requeue, roll back and exit 0). Then each node's
``/var/log/imexctl.log`` is sent as syslog to a real journald of its own (tests/lab/whylogs.py: a namespace
whose host name is the node's) and read back with ``journalctl -o json --all`` and ``-o cat``, and laid out as
a log host's rsyslog writes it (RFC 3164 with an RFC 3339 time, traditional RFC 3164, RFC 5424): one file
per tray, and all trays merged in one. ``why --log`` on each, with no config, must tell per tray what that
tray's own log tells.
"""

from __future__ import annotations

import contextlib
import io
import json
import time
from pathlib import Path
from typing import Any

import pytest

from imexctl import cli
from imexctl.commands import why
from tests.lab.cluster import SlurmLab
from tests.lab.conftest import NODES
from tests.lab.jobs import JOB_TIMEOUT, events, imexctl_settings, sbatch, wait_done
from tests.lab.whylogs import journal_available, journal_of, journalctl, rfc3164, rfc5424, runs
from tests.simhelpers import wait_for
from tests.support.ci import unavailable

pytestmark = pytest.mark.slurm

BAD = "node2"


def _lines(lab: SlurmLab, node: str, jobs: set[int]) -> list[str]:
    """The node's log lines of ``jobs``, as the hooks wrote them."""
    path = lab.node_root(node) / "var" / "log" / "imexctl.log"
    return [x for x in path.read_text().splitlines() if json.loads(x).get("job_id") in jobs]


def _stamp(line: str, traditional: bool) -> str:
    """The line's own time as the log host writes it: RFC 3339, or ``Mmm dd hh:mm:ss``."""
    stamp = json.loads(line)["timestamp"]
    if not traditional:
        return stamp.replace("Z", "+00:00")
    t = time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")
    return time.strftime("%b ", t) + f"{t.tm_mday:2d}" + time.strftime(" %H:%M:%S", t)


def _syslog(logs: dict[str, list[str]], form: str) -> dict[str, list[tuple[str, str]]]:
    """Per node, ``(time, line)`` as a log host's rsyslog writes its lines in ``form``."""
    out: dict[str, list[tuple[str, str]]] = {}
    for node, lines in logs.items():
        for pid, body in runs(lines):
            for line in body:
                if form == "rfc5424":
                    text = rfc5424(_stamp(line, False), node, pid, line)
                else:
                    text = rfc3164(_stamp(line, form == "traditional"), node, pid, line)
                out.setdefault(node, []).append((json.loads(line)["timestamp"], text))
    return out


def _why(job: int, files: list[Path]) -> dict[str, Any]:
    argv = ["why", str(job), "--json"]
    for f in files:
        argv += ["--log", str(f)]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli.main(argv, env={})
    result: dict[str, Any] = json.loads(out.getvalue())
    assert rc == 0, result
    return result["data"]


def _stories(data: dict[str, Any]) -> dict[str, tuple[list[str], list[tuple[str, str]]]]:
    told = {}
    for t in data["trays"]:
        assert t["host"] in (None, t["node"]), t
        told[t["node"]] = (t["outcomes"], [(e["timestamp"], e["event"]) for e in t["events"]])
    return told


def _expected(logs: dict[str, list[str]], job: int) -> dict[str, tuple[list[str], list[tuple[str, str]]]]:
    out = {}
    for node, lines in logs.items():
        outcomes, entries = why.story([json.loads(x) for x in lines if json.loads(x)["job_id"] == job])
        if entries:
            out[node] = (outcomes, [(e.timestamp, e.event) for e in entries])
    return out


def _jobs(lab: SlurmLab) -> tuple[int, int]:
    """A job set up and torn down on every tray; then one that fails on node2, cancelled once held."""
    good = sbatch(lab, "true", NODES)
    wait_done(lab, good)
    lab.faults.write_text(f"@{lab.addr(BAD)} never_ready\n")
    with imexctl_settings(lab, {"readiness": {"deadline_s": "10"}}):
        bad = sbatch(lab, "true", NODES)

        def held() -> bool:
            rec = lab.job(bad)
            return rec.get("JobState") == "PENDING" and rec.get("Reason") == "launch_failed_requeued_held"

        wait_for(held, JOB_TIMEOUT, 0.5, what=f"job {bad} to be requeued and held")
        wait_for(lambda: all(events(lab, n, bad, "epilog.done") for n in NODES), JOB_TIMEOUT, 0.5, what="the epilogs")
    lab.run(["scancel", str(bad)], check=False)
    lab.faults.write_text("")
    return good, bad


def test_why_log_answers_per_tray_in_every_forwarded_form(lab: SlurmLab, tmp_path: Path) -> None:
    if journal_available():
        unavailable(journal_available())
    good, bad = _jobs(lab)
    logs = {node: _lines(lab, node, {good, bad}) for node in NODES}
    files: dict[str, list[Path]] = {}
    for form in ("fileformat", "traditional", "rfc5424"):
        per_node = _syslog(logs, form)
        merged = tmp_path / f"{form}.log"
        merged.write_text("".join(t + "\n" for _, t in sorted(x for v in per_node.values() for x in v)))
        files[form] = [merged]
        files[f"{form} per tray"] = []
        for node, lines in per_node.items():
            f = tmp_path / f"{form}-{node}.log"
            f.write_text("".join(t + "\n" for _, t in lines))
            files[f"{form} per tray"].append(f)
    journals = [journal_of(node, lines, tmp_path / "journal") for node, lines in logs.items()]
    for form, args in (("json", ("-o", "json", "--all")), ("cat", ("-o", "cat"))):
        merged = tmp_path / f"journal-{form}.log"
        merged.write_text(journalctl(journals, "-t", "imexctl", *args))
        files[f"journal {form}"] = [merged]
        files[f"journal {form} per tray"] = []
        for node, journal in zip(logs, journals):
            f = tmp_path / f"journal-{form}-{node}.log"
            f.write_text(journalctl([journal], "-t", "imexctl", *args))
            files[f"journal {form} per tray"].append(f)
    for job in (good, bad):
        expected = _expected(logs, job)
        assert set(expected) == set(NODES), expected
        outcomes = {node: told[0] for node, told in expected.items()}
        if job == good:
            assert all(o == ["set up", "torn down"] for o in outcomes.values()), outcomes
        else:
            assert outcomes[BAD][0] == "failed", outcomes
            assert all(o[0] == "job ended" for n, o in outcomes.items() if n != BAD), outcomes
        for form, paths in files.items():
            data = _why(job, paths)
            assert _stories(data) == expected, f"job {job}, {form}"
            assert data["read"]["unreadable"] == 0, (form, data["read"])
            hosts = {t["host"] for t in data["trays"]}
            assert hosts == ({None} if form.startswith("journal cat") else set(NODES)), (form, hosts)
