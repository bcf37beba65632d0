"""Corpus family 6: jobs whose user-set fields forge the fields slurmctld prints (issue 32).

A job's user writes its name, comment, working directory, output and error paths and command
(``sbatch -J``, ``--comment``, ``-D``, ``-o``, ``-e``, the script's path). ``scontrol show job -o``
prints them among slurmctld's own fields; imexctl asks ``squeue`` for slurmctld's fields alone
(slurm/slurmctld.py), so whatever a user writes there, the answer must be the honest job's.

- :data:`FIELD_CASES`: for each Slurm version and each field that version's ``scontrol show job``
  prints (the layout recorded from the real one, tests/data/slurm/<version>.json), ``Key=value`` in
  every user-set field at once; plus :data:`FORMS`: forged records after a newline, forged squeue
  lines, the separator, long and odd text. Run through FakeHost's slurmctld (tests/support/
  slurmjobs.py), which prints any user field a question asks for.
- :data:`PROLOG_CASES`: the decisions that read slurmctld's answer (may the job share its trays, on
  22.05; a het job's trays; was the job cancelled, at the deadline), each with the forged text in one
  user field, through the whole prolog as slurmd runs it, with each version's environment.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

__all__ = ["FIELD_CASES", "FORGED", "FORMS", "PROLOG_CASES", "USER_FIELDS", "VERSIONS", "FieldCase", "PrologCase",
           "layout"]  # fmt: skip

VERSIONS = ("22.05", "24.11", "26.05")
DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"
#: the SlurmJob fields (tests/support/slurmjobs.py) a job's user sets
USER_FIELDS = ("name", "comment", "work_dir", "command", "std_out", "std_err")
#: the value a forged field says: the opposite of the honest job where imexctl ever read it
FORGED = {
    "JobId": "999", "JobState": "CANCELLED", "NodeList": "gb[01-18]", "OverSubscribe": "NO", "Exclusive": "NODE",
    "Restarts": "9", "StartTime": "2000-01-01T00:00:00", "HetJobId": "100", "HetJobOffset": "7",
    "ReqNodeList": "gb[01-18]", "BatchHost": "gb18", "Reason": "None", "Partition": "gpu",
}  # fmt: skip
_ALL_FORGED = " ".join(f"{k}={v}" for k, v in FORGED.items())


def layout(version: str) -> list[str]:
    """The field names ``scontrol show job -o`` printed for the honest job on that version, in order."""
    data = json.loads((DATA / f"{version}.json").read_text())
    plain = next(a for a in data["answers"] if a["what"] == "plain running" and a["argv"][:2] == ["scontrol", "show"])
    return list(dict.fromkeys(re.findall(r"(?:^| )([A-Za-z][\w/:]*)=", plain["stdout"])))


@dataclasses.dataclass(frozen=True)
class FieldCase:
    """Every user-set field of job 42 (and of het job 100's components) holds ``text``."""

    id: str
    text: str


def _squeue_line(job: int, state: str, nodes: str) -> str:
    return f"{job}|{state}|{nodes}|NO|946684800|9|N/A|N/A|"


FIELD_CASES = [
    FieldCase(f"slurm-{version}-{key.lower().replace('/', '-').replace(':', '-')}", f"x {key}={FORGED.get(key, '999')}")
    for version in VERSIONS
    for key in layout(version)
]
FORMS = [
    FieldCase("slurm-every-field", f"x {_ALL_FORGED}"),
    FieldCase("slurm-newline-record", f"x\nJobId=42 {_ALL_FORGED}"),
    FieldCase("slurm-newline-two-records", f"x\nJobId=42 {_ALL_FORGED}\nJobId=101 HetJobId=100 NodeList=gb[01-18]"),
    FieldCase("slurm-crlf-record", f"x\r\nJobId=42 {_ALL_FORGED}"),
    FieldCase("slurm-squeue-line", _squeue_line(42, "CANCELLED", "gb[01-18]")),
    FieldCase("slurm-squeue-line-after-newline", "x\n" + _squeue_line(42, "CANCELLED", "gb[01-18]")),
    FieldCase(
        "slurm-squeue-het-lines", "x\n" + "\n".join(f"{100 + i}|RUNNING|gb[01-18]|NO|1|0|100|{i}|" for i in range(3))
    ),
    FieldCase("slurm-separator-only", "|||||||||"),
    FieldCase("slurm-separator-fields", "|CANCELLED|gb[01-18]|NO|"),
    FieldCase("slurm-na-and-null", "N/A (null) Unknown None"),
    FieldCase("slurm-tabs", f"x\t{_ALL_FORGED}".replace(" ", "\t")),
    FieldCase("slurm-quoted", f"'\"{_ALL_FORGED}\"'"),
    FieldCase("slurm-shell", f"$(scancel 42); {_ALL_FORGED} `reboot`"),
    FieldCase(
        "slurm-json", json.dumps({"job_state": ["CANCELLED"], "nodes": "gb[01-18]", "shared": ["oversubscribe"]})
    ),
    FieldCase("slurm-unicode", f"\u2028{_ALL_FORGED}\u2029\u00a0|\uff5c"),
    FieldCase("slurm-long", f"x {_ALL_FORGED} " * 200),
    FieldCase("slurm-empty", ""),
]


@dataclasses.dataclass(frozen=True)
class PrologCase:
    """One decision, with ``FORGED`` (as one line) in one user-set field of the job (``field``)."""

    id: str
    version: str
    #: shared / exclusive (22.05 asks), het (joint domain), deadline (still running) / cancelled (ended)
    scenario: str
    field: str
    text: str


_PROLOG_TEXTS = {
    **dict.fromkeys(USER_FIELDS, f"x {_ALL_FORGED}"),
    "comment-newline": f"x\nJobId=42 {_ALL_FORGED}",
    "comment-squeue-line": "x\n" + _squeue_line(42, "CANCELLED", "gb[01-18]"),
}
_SCENARIOS = {"22.05": ("shared", "exclusive", "het", "deadline", "cancelled"), "24.11": ("het", "deadline", "cancelled"),
              "26.05": ("het", "deadline", "cancelled")}  # fmt: skip

PROLOG_CASES = [
    PrologCase(
        f"slurm-prolog-{version}-{scenario}-{name}",
        version,
        scenario,
        name.split("-", 1)[0] if name.startswith("comment") else name,
        text,
    )
    for version, scenarios in _SCENARIOS.items()
    for scenario in scenarios
    for name, text in _PROLOG_TEXTS.items()
]
