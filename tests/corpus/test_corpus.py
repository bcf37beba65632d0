"""The hostile-input corpus as a whole: its size, its families, and that its ids are unique.

The cases themselves run in tests/test_corpus_<family>.py; tests/corpus/README.md
says how to add one.
"""

from __future__ import annotations

from collections.abc import Sequence

from tests.corpus import config, ctl_output, environment, nodelists, resolution, slurm_answers
from tests.corpus._tray import DOCUMENTED

FAMILIES: dict[str, Sequence[object]] = {
    "node lists": [*nodelists.VECTORS, *nodelists.MALFORMED, *nodelists.WRONG, *nodelists.ACCEPTED, *nodelists.HUGE],
    "environment": environment.CASES,
    "config": config.CASES,
    "command output": [*ctl_output.CASES, *ctl_output.ENDLESS],
    "name resolution": resolution.CASES,
    "slurmctld answers": [*slurm_answers.FIELD_CASES, *slurm_answers.FORMS, *slurm_answers.PROLOG_CASES],
}


def _ids() -> list[str]:
    return [case.id for cases in FAMILIES.values() for case in cases]  # type: ignore[attr-defined]


def test_the_corpus_holds_at_least_300_cases() -> None:
    """Issue 10 asks for at least 300 cases; every family has a fair share."""
    assert len(_ids()) >= 300
    assert all(len(cases) >= 30 for cases in FAMILIES.values()), {k: len(v) for k, v in FAMILIES.items()}


def test_case_ids_are_unique_across_families() -> None:
    """One case = one id, across the whole corpus."""
    ids = _ids()
    assert len(ids) == len(set(ids)), sorted({i for i in ids if ids.count(i) > 1})


def test_the_error_codes_the_corpus_expects_are_documented() -> None:
    """Every error_code a case expects is in docs/exit-codes.md with the exit code the case expects."""
    expected = {(c.code, c.exit_code) for cases in (environment.CASES, ctl_output.CASES, resolution.CASES)
                for c in cases if c.code}  # fmt: skip
    expected |= {("nodelist_invalid", 65), ("job_env_invalid", 65), ("config_invalid", 78)}
    expected |= {(h.code, h.exit_code) for h in nodelists.HUGE}
    assert {(code, DOCUMENTED.get(code)) for code, _ in expected} == expected
