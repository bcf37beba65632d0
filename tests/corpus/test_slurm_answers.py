"""Corpus family 6: forged fields in what a job's user writes change nothing imexctl reads (slurm_answers.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from imexctl.config.settings import Settings
from imexctl.platform.errors import SlurmQueryError
from imexctl.slurm import slurmctld
from tests.corpus import slurm_answers
from tests.corpus._fakes import FakeHost, domain_json, job_env
from tests.corpus._tray import Tray, ids
from tests.corpus.slurm_answers import FieldCase, PrologCase
from tests.support.slurmjobs import SlurmJob


def jobs(text: str, *, state: str = "CONFIGURING", share: str = "NO") -> dict[int, SlurmJob]:
    """Job 42 on gb[01-02] and het job 100 (gb[01-02] + gb[03-04]), every user-set field holding ``text``."""
    user = dict.fromkeys(slurm_answers.USER_FIELDS, text)
    return {
        42: SlurmJob(42, state, "gb[01-02]", share, 1796434531, **user),
        100: SlurmJob(100, "CONFIGURING", "gb[01-02]", "NO", 1796434533, het_job_id=100, het_job_offset=0, **user),
        101: SlurmJob(101, "CONFIGURING", "gb[03-04]", "NO", 1796434533, het_job_id=100, het_job_offset=1, **user),
    }


def read(held: dict[int, SlurmJob], settings: Settings) -> tuple[Any, ...]:
    """What imexctl reads of those jobs: job 42's and 101's records, het job 100's trays ('cannot tell' as such)."""
    host = FakeHost(slurm_jobs=held)
    out: list[Any] = []
    for ask in (lambda: slurmctld.ask_job(42, host, settings, ""), lambda: slurmctld.het_nodes(100, host, settings, ""),
                lambda: slurmctld.ask_job(101, host, settings, "")):  # fmt: skip
        try:
            out.append(ask())
        except SlurmQueryError as exc:
            out.append(f"cannot tell: {exc}")
    return tuple(out)


@pytest.mark.parametrize("case", slurm_answers.FIELD_CASES + slurm_answers.FORMS,
                         ids=ids(slurm_answers.FIELD_CASES + slurm_answers.FORMS))  # fmt: skip
def test_a_forged_field_reads_as_the_honest_job(case: FieldCase, make_settings: Callable[..., Settings]) -> None:
    """Whatever the job's user wrote, imexctl reads slurmctld's own fields: the honest job's records."""
    settings = make_settings()
    honest = read(jobs(""), settings)
    assert not any(isinstance(r, str) for r in honest), honest
    assert read(jobs(case.text), settings) == honest


def test_the_corpus_sees_a_question_that_would_print_a_user_field(monkeypatch: pytest.MonkeyPatch,
                                                                  make_settings: Callable[..., Settings]) -> None:  # fmt: skip
    """The cases can fail: asked for the job's name in place of OverSubscribe, most forged jobs read differently."""
    fields = tuple("Name" if f == "OverSubscribe" else f for f in slurmctld.FIELDS)
    monkeypatch.setattr(slurmctld, "FIELDS", fields)
    settings = make_settings()
    honest = read({k: dataclasses.replace(j, name="OK") for k, j in jobs("").items()}, settings)
    assert not any(isinstance(r, str) for r in honest), honest
    cases = slurm_answers.FIELD_CASES + slurm_answers.FORMS
    differ = [c.id for c in cases if read(jobs(c.text), settings) != honest]
    assert len(differ) >= len(cases) - 2, sorted(set(ids(cases)) - set(differ))


# -- the whole prolog ---------------------------------------------------------------------------------------


@pytest.fixture
def tray(root: Path) -> Tray:
    return Tray(root)


def _env(tray: Tray, case: PrologCase) -> dict[str, str]:
    """What slurmd of ``case.version`` gives the prolog (tests/lab/test_hooks_env.py records it)."""
    # the trays listed: a domain slurm.conf does not place is refused (design.md "The channel rule")
    conf = tray.write("etc/slurm/slurm.conf", "ClusterName=x\nNodeName=gb[01-04] CPUs=1\n")
    het = {"job_id": 101, "nodelist": "gb[03-04]", "node": "gb03", "SLURM_HET_JOB_ID": "100"}
    env = job_env(**(het if case.scenario == "het" else {}), SLURM_CONF=str(conf))  # type: ignore[arg-type]
    if case.version == "22.05":
        del env["SLURM_JOB_NODELIST"], env["SLURM_JOB_OVERSUBSCRIBE"]
    if case.version == "26.05":
        env["SLURM_JOB_EXCLUSIVE"] = "NODE"
    return env


def _slurmctld(tray: Tray, case: PrologCase) -> None:
    """The jobs slurmctld holds, the forged text in the one user field of the case."""
    held = jobs("", state="CANCELLED" if case.scenario == "cancelled" else "CONFIGURING",
                share="OK" if case.scenario == "shared" else "NO")  # fmt: skip
    tray.host.slurm_jobs = {k: dataclasses.replace(j, **{case.field: case.text}) for k, j in held.items()}
    if case.scenario in ("deadline", "cancelled"):  # this tray READY, its peer gone: the domain never comes up
        tray.host.domain = lambda hosts: (0, domain_json(hosts, status="DEGRADED", node_status={1: "UNAVAILABLE"},
                                                         conn_status="INVALID"))  # fmt: skip


@pytest.mark.parametrize("case", slurm_answers.PROLOG_CASES, ids=ids(slurm_answers.PROLOG_CASES))
def test_a_forged_field_changes_no_decision(case: PrologCase, tray: Tray) -> None:
    """The prolog decides as for the honest job: shared stays skipped, exclusive gets its domain, a het job's
    nodes file lists its components' trays, a running job's tray still fails at the deadline, a cancelled one's
    exits 0."""
    tray.configure(readiness={"deadline_s": 3})
    env = _env(tray, case)
    _slurmctld(tray, case)
    out = tray.prolog(env)
    asked = [c for c in tray.host.calls if c[0].endswith("squeue")]
    assert asked, "slurmctld was not asked"
    if case.scenario == "deadline":
        out.assert_failed("not_ready", 75, "not ready")
        assert not out.events("prolog.job_ended")
        tray.assert_clean()
        return
    done = out.assert_ok()
    if case.scenario == "cancelled":
        assert done.get("job_ended") == "CANCELLED", done
    elif case.scenario == "shared":
        assert "OverSubscribe=OK from slurmctld" in done.get("skipped", "") and done.get("told_user") is True, done
    else:
        trays = 4 if case.scenario == "het" else 2
        assert done.get("trays") == trays and not done.get("skipped"), done
        job = 100 if case.scenario == "het" else 42
        nodes = (tray.root / f"run/imexctl/jobs/{job}/nodes_config.cfg").read_text().split()
        assert nodes == [f"10.0.0.{i}" for i in range(1, trays + 1)], nodes
    tray.epilog(env).assert_ok()
    tray.assert_clean()
