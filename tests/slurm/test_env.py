"""One table of Slurm's variables, read in one module: what each release sets, and the fallbacks imexctl takes."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from imexctl import slurm as var
from imexctl.channels.job import candidate_job_ids
from imexctl.slurm.job import JobContext

PACKAGE = Path(__file__).resolve().parents[2] / "imexctl"
NAME = re.compile(r"SLURMD?_[A-Z0-9_]+")


def _bare_names(path: Path) -> list[str]:
    """String constants that are exactly a Slurm variable's name (how a read or a write names it)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        f"{path.relative_to(PACKAGE)}:{node.lineno}: {node.value}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.fullmatch(node.value)
    ]


def test_only_the_table_names_a_slurm_variable() -> None:
    """Every read of a Slurm variable goes through slurm/__init__.py: no other module names one to read or
    set it (the job, the job's side, netcheck, the config lookup, the log's context, health, doctor, the demo)."""
    found = [
        hit
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != PACKAGE / "slurm/__init__.py" and not path.is_relative_to(PACKAGE / "sim")
        for hit in _bare_names(path)
    ]
    assert found == []


def test_the_table_is_whole() -> None:
    """Every name the module exports is a row; every fallback is a row of its own; no fallback leads back."""
    rows = {name: fallback for name, _, _, fallback in var.VARIABLES}
    names = {getattr(var, n) for n in var.__all__ if n.isupper() and isinstance(getattr(var, n), str)}
    assert names - {var.TIME_FORMAT} <= set(rows)
    assert all(fallback in rows for fallback in rows.values() if fallback)
    for name in rows:
        seen = [name]
        while rows[seen[-1]]:
            seen.append(rows[seen[-1]])
            assert len(seen) == len(set(seen))
    assert all(set(who.split()) <= {"hook", "task", "health"} and who for _, who, _, _ in var.VARIABLES)


def test_a_blank_variable_falls_back_and_a_set_one_does_not() -> None:
    """The fallback is read when the variable is unset or blank, in a chain (a step's list, the job's, 22.05's)."""
    assert var.source({"SLURM_NODELIST": "gb01"}, var.JOB_NODELIST) == ("SLURM_NODELIST", "gb01")
    assert var.source({var.JOB_NODELIST: " ", "SLURM_NODELIST": "gb01"}, var.JOB_NODELIST)[0] == "SLURM_NODELIST"
    assert var.value({var.JOB_NODELIST: "gb[01-02]", "SLURM_NODELIST": "x"}, var.STEP_NODELIST) == "gb[01-02]"
    assert var.value({var.STEP_NODELIST: "gb01", var.JOB_NODELIST: "x"}, var.STEP_NODELIST) == "gb01"
    assert var.source({}, var.JOB_ID) == (var.JOB_ID, "") and var.value({"SLURM_JOBID": "7"}, var.JOB_ID) == "7"
    assert var.value({var.PROCID: "3"}, var.LOCALID) == ""


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


#: a value for every variable a hook may get
SAMPLE = {
    var.JOB_ID: "42",
    "SLURM_JOBID": "42",
    var.NODENAME: "gb01",
    var.CONF: "/etc/slurm/slurm.conf",
    var.JOB_NODELIST: "gb[01-02]",
    "SLURM_NODELIST": "gb[01-02]",
    var.JOB_UID: "1000",
    "SLURM_UID": "1000",
    var.JOB_GID: "1001",
    var.JOB_USER: "alice",
    var.JOB_PARTITION: "gpu",
    var.JOB_CONSTRAINTS: "",
    var.JOB_OVERSUBSCRIBE: "NO",
    var.JOB_EXCLUSIVE: "NODE",
    var.JOB_QOS: "normal",
    var.JOB_SLUID: "sabc",
    var.JOB_RESTART_COUNT: "0",
    var.JOB_START_TIME: "1796434523",
}


@pytest.mark.parametrize(("release", "shared"), [("22.05", None), ("24.11", False), ("25.11", False), ("26.05", False)])
def test_each_release_gives_a_prolog_all_it_needs(release: str, shared: bool | None) -> None:
    """A prolog's environment as the table says each release sets it reads as the same job; 22.05 names its
    trays only in SLURM_NODELIST and says nothing of sharing (slurmctld is asked then)."""
    env = {
        name: SAMPLE[name]
        for name, who, since, _ in var.VARIABLES
        if "hook" in who.split() and name in SAMPLE and (not since or _version(since) <= _version(release))
    }
    job = JobContext.from_env(env, need_nodes=True)
    assert (job.job_id, job.nodes, job.owner, job.user, job.is_shared) == (
        42,
        ("gb01", "gb02"),
        (1000, 1001),
        "alice",
        shared,
    )
    assert (var.JOB_NODELIST in env) == (release != "22.05")
    assert bool(job.sluid) == (_version(release) >= (25, 11)) and bool(job.exclusive) == (release == "26.05")


def test_a_tasks_job_ids_in_the_order_they_are_tried() -> None:
    """The job side tries the job id, the het job's, then each component's (HET_GROUP before PACK_GROUP)."""
    env = {
        var.JOB_ID: "100",
        "SLURM_JOB_ID_PACK_GROUP_1": "102",
        "SLURM_JOB_ID_HET_GROUP_1": "101",
        "SLURM_JOB_ID_HET_GROUP_0": "100",
        "SLURM_JOB_ID_HET_GROUP_x": "9",
    }
    assert var.task_job_ids(env) == ["100", "", "", "100", "101", "102"]
    assert candidate_job_ids({**env, "SLURM_JOB_ID_HET_GROUP_2": str(var.MAX_JOB_ID + 1)}) == (100, 101, 102)
