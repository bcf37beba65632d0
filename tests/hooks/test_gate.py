"""The hooks' gates (imexctl.hooks.gate): each decision once, for the fast path and the full commands."""

from __future__ import annotations

from pathlib import Path

import pytest

from imexctl.config import settings
from imexctl.config.schema import NodePaths
from imexctl.hooks import gate
from imexctl.slurm.job import JobContext
from tests.support.fakes import job_env

# the typed record every tier hands the gates: the defaults, but for these keys
POLICY = settings.load(None, node="gb01").policy._replace(
    jobs="partitions", partitions=("gpu",), feature="", shared="skip"
)


def _paths(run_dir: object, proc_devices: object) -> NodePaths:
    return NodePaths(run_dir=str(run_dir), proc_devices=str(proc_devices))


def _job(**extra: str) -> JobContext:
    return JobContext.from_env(job_env(job_id=7, **extra), need_nodes=True)


def test_a_job_the_policy_takes_is_not_skipped(tmp_path: Path) -> None:
    """A job in a listed partition: None, and no note is left."""
    assert gate.skipped_prolog(_job(SLURM_JOB_PARTITION="gpu"), POLICY, _paths(tmp_path, "/nonexistent")) is None
    assert list(tmp_path.iterdir()) == []


def test_a_skipped_job_says_why(tmp_path: Path) -> None:
    """A job outside the partitions: the reason; a job the site leaves out is not told."""
    skip = gate.skipped_prolog(_job(SLURM_JOB_PARTITION="cpu"), POLICY, _paths(tmp_path, "/nonexistent"))
    assert skip == gate.Skip("partition cpu is not in [policy] partitions")
    with pytest.raises(AttributeError):
        skip.reason = ""  # type: ignore[misc,union-attr]


def test_a_note_that_cannot_be_left_is_a_problem_not_an_error(tmp_path: Path) -> None:
    """A shared job on a tray with channels whose run_dir is a file: skipped, told False, the problem named."""
    devices = tmp_path / "devices"
    devices.write_text("Character devices:\n234 nvidia-caps-imex-channels\n")
    run_dir = tmp_path / "run"
    run_dir.write_text("not a directory")
    skip = gate.skipped_prolog(
        _job(SLURM_JOB_PARTITION="gpu", SLURM_JOB_OVERSUBSCRIBE="YES"), POLICY, _paths(run_dir, devices)
    )
    assert skip is not None and skip.reason.startswith("the job may share its trays") and not skip.told
    assert skip.problem.startswith(str(run_dir))


def test_a_note_left_under_slurmds_umask_can_be_read_by_the_job_user(tmp_path: Path) -> None:
    """The note and the directories made for it get 0755/0644 under umask 027 (issue 33: they came out 0750)."""
    import os
    import stat

    from imexctl.channels import notes

    devices = tmp_path / "devices"
    devices.write_text("Character devices:\n234 nvidia-caps-imex-channels\n")
    run_dir = tmp_path / "run" / "imexctl"
    old = os.umask(0o027)
    try:
        assert notes.leave(str(run_dir), str(devices), 7, "IMEX was not set up for job 7: shared")
    finally:
        os.umask(old)
    made = [tmp_path / "run", run_dir, run_dir / "notes", run_dir / "notes" / "7"]
    assert [stat.S_IMODE(os.stat(p).st_mode) for p in made] == [0o755, 0o755, 0o755, 0o644]


@pytest.mark.parametrize(("left", "want"), [("nothing", False), ("dir", True), ("process", True)])
def test_left_anything(tmp_path: Path, left: str, want: bool) -> None:
    """A directory, or a process naming the config: each is something left (a channel node alone is not)."""
    job_dir = tmp_path / "jobs" / "7"
    if left == "dir":
        job_dir.mkdir(parents=True)
    config = str(job_dir / "config.cfg")
    found = gate.left_anything(str(job_dir), config, has_process=lambda arg: left == "process" and arg == config)
    assert found is want


def test_nothing_left_forgets_the_note_and_asks_each_domain(tmp_path: Path) -> None:
    """The job's note is removed first; the job and its het job are each asked."""
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "7").write_text("note\n")
    asked: list[int] = []
    job = JobContext.from_env(job_env(job_id=7, SLURM_HET_JOB_ID="6"), need_nodes=False)
    assert gate.nothing_left(job, _paths(tmp_path, "/nonexistent"), lambda jid: asked.append(jid) or False)
    assert asked == [7, 6] and not (tmp_path / "notes" / "7").exists()


def test_summary_fields_keep_their_order() -> None:
    """prolog.done: ok, told_user, the summary, duration_s, skipped; epilog.done: ok, actions, duration_s, lost."""
    assert list(gate.prolog_fields(0.1, skipped="x", told_user=True)) == ["ok", "told_user", "duration_s", "skipped"]
    assert list(gate.prolog_fields(0.1, job_ended="CANCELLED")) == ["ok", "job_ended", "duration_s"]
    assert list(gate.epilog_fields(["a"], 0.1, ["lost"])) == ["ok", "actions", "duration_s", "lost_daemon"]
    assert [e for e, _ in gate.skipped_lines("x", False, 0.1)] == ["imex.skipped", "prolog.done"]


def test_every_tier_hands_the_gates_the_same_records() -> None:
    """No tier hands a gate its settings as a dict (the ``_asdict()`` bridges of the typed tiers are gone), and the
    gates read the policy and the paths only as the records' fields."""
    import ast

    hooks = Path(__file__).resolve().parents[2] / "imexctl/hooks"
    for name in ("entry.py", "gate.py", "prolog.py", "teardown.py"):
        assert "_asdict()" not in (hooks / name).read_text(encoding="utf-8"), name
    tree = ast.parse((hooks / "gate.py").read_text(encoding="utf-8"))
    by_key = [n for n in ast.walk(tree) if isinstance(n, ast.Subscript) and getattr(n.value, "id", "") == "policy"]
    assert by_key == []
