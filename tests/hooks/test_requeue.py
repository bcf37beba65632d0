"""A healthy tray whose peer failed asks slurmctld again until the requeue lands (issue 32 §3, issue 34 §5).

All trays reach their deadline together; the broken tray's failure reaches slurmctld only after its
roll-back, so one question at the deadline races the requeue. Under ``PrologFlags=Alloc,DeferBatch``
(slurmctld holds the batch script until every prolog reported, and never launches a job that went back
to the queue) a healthy tray asks again over ``[slurm] timeout_margin_s``; without DeferBatch it asks once.
The fake slurmctld below answers RUNNING until its clock reaches the moment of the requeue.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Callable

import pytest
import structlog

from imexctl.config.settings import Settings
from imexctl.hooks.prolog import prolog
from imexctl.hooks.runtime import Runtime
from imexctl.platform.errors import HealthTimeout
from imexctl.platform.host import Completed
from tests.support.fakes import FakeGpu, FakeHost, domain_json, job_env
from tests.support.racks import rack_addresses
from tests.support.slurmjobs import SlurmJob

RUNNING = SlurmJob(42, "RUNNING", "gb[01-03]")
REQUEUED = SlurmJob(42, "PENDING", reason="launch_failed_requeued_held", restarts=1)
DEADLINE_S = 5


@dataclasses.dataclass
class Slurmctld(FakeHost):
    """slurmctld that takes job 42 back (requeued, held) when its clock reaches ``requeue_at``."""

    requeue_at: float = float("inf")

    def run(self, argv: Sequence[str], *, timeout_s: float, env: Mapping[str, str] | None = None) -> Completed:
        self.slurm_jobs[42] = REQUEUED if self.now >= self.requeue_at else RUNNING
        return super().run(argv, timeout_s=timeout_s, env=env)


@pytest.fixture
def ctld() -> Slurmctld:
    """Three trays; this one (gb01) READY, gb02 says WAITING_FOR_PEERS (its own prolog will fail)."""
    host = Slurmctld(addresses=rack_addresses())
    host.slurm_nodes["gb01"] = {"state": "ALLOCATED"}
    host.domain = lambda hosts: (0, domain_json(hosts, status="DEGRADED", node_status={1: "WAITING_FOR_PEERS"}))
    return host


def _prolog(host: Slurmctld, make_settings: Callable[..., Settings], root: Path, flags: str,
            timeout: str = "", **sections: dict[str, Any]) -> Any:  # fmt: skip
    """Run gb01's prolog under a slurm.conf with these PrologFlags; the result, or the HealthTimeout raised."""
    conf = root / "slurm.conf"
    conf.write_text(f"ClusterName=x\nPrologFlags={flags}\n{timeout}")
    rt = Runtime(host, FakeGpu(), make_settings(readiness={"deadline_s": DEADLINE_S}, **sections),
                 structlog.get_logger())  # fmt: skip
    env = job_env(job_id=42, nodelist="gb[01-03]", SLURM_CONF=str(conf), SLURM_JOB_OVERSUBSCRIBE="NO")
    try:
        return prolog(env, rt)
    except HealthTimeout as exc:
        return exc


def _drained(host: FakeHost) -> str | None:
    """gb01's reason if the prolog drained it."""
    node = host.slurm_nodes["gb01"]
    return node.get("reason") if "DRAIN" in node["state"].split("+") else None


def _asked(host: FakeHost) -> list[tuple[str, ...]]:
    """slurmctld's questions about the job (squeue)."""
    return [c for c in host.calls if c[0].endswith("squeue")]


def test_deferbatch_waits_for_the_requeue_and_drains_nothing(ctld: Slurmctld,
                                                              make_settings: Callable[..., Settings],
                                                              root: Path) -> None:  # fmt: skip
    """The requeue lands 3 s after the deadline: asked again until then, exit 0, no drain of this tray."""
    ctld.requeue_at = 1000.0 + DEADLINE_S + 3
    out = _prolog(ctld, make_settings, root, "Alloc,DeferBatch")
    assert not isinstance(out, HealthTimeout), str(out)
    assert out.job_ended == "PENDING" and _drained(ctld) is None
    assert len(_asked(ctld)) >= 3 and ctld.now >= ctld.requeue_at


def test_without_deferbatch_one_question_as_before(ctld: Slurmctld, make_settings: Callable[..., Settings],
                                                    root: Path) -> None:  # fmt: skip
    """The batch script starts on the first tray once its own prolog ends: no waiting; fails and is drained."""
    ctld.requeue_at = 1000.0 + DEADLINE_S + 3
    out = _prolog(ctld, make_settings, root, "Alloc")
    assert isinstance(out, HealthTimeout)
    assert len(_asked(ctld)) == 1 and _drained(ctld) == "imex:not_ready gb01: peers gb02 not ready"


@pytest.mark.parametrize(
    "flags",
    [
        pytest.param("Alloc,DeferBatch,NoHold", id="nohold"),  # no WAIT_PROLOG: DeferBatch holds nothing
        pytest.param("Contain", id="no-deferbatch"),
    ],
)
def test_flags_that_do_not_hold_the_batch_script_ask_once(ctld: Slurmctld, make_settings: Callable[..., Settings],
                                                          root: Path, flags: str) -> None:  # fmt: skip
    """Only DeferBatch without NoHold makes slurmctld hold the batch script, and so makes waiting safe."""
    ctld.requeue_at = 1000.0 + DEADLINE_S + 3
    assert isinstance(_prolog(ctld, make_settings, root, flags), HealthTimeout)
    assert len(_asked(ctld)) == 1


def test_no_requeue_fails_when_the_margin_is_used_up(ctld: Slurmctld, make_settings: Callable[..., Settings],
                                                      root: Path) -> None:  # fmt: skip
    """The job keeps RUNNING: questions over timeout_margin_s (backing off to 1 s), then the failure and drain."""
    out = _prolog(ctld, make_settings, root, "Alloc,DeferBatch", slurm={"timeout_margin_s": 6})
    assert isinstance(out, HealthTimeout) and _drained(ctld)
    first = 1000.0 + DEADLINE_S  # the first question comes at the deadline (the fake's TCP look takes no time)
    assert first + 6 - 0.3 <= ctld.now <= first + 6 + 0.1
    assert 8 <= len(_asked(ctld)) <= 11


def test_the_hook_timeout_bounds_the_window(ctld: Slurmctld, make_settings: Callable[..., Settings],
                                            root: Path) -> None:  # fmt: skip
    """PrologEpilogTimeout=12: the questions stop 2 x query_timeout_s + 1 s before it, whatever the margin."""
    out = _prolog(ctld, make_settings, root, "Alloc,DeferBatch", "PrologEpilogTimeout=12\n",
                  slurm={"timeout_margin_s": 6, "query_timeout_s": 2})  # fmt: skip
    assert isinstance(out, HealthTimeout)
    assert ctld.now - 1000.0 <= 12 - 2 * 2 - 1 + 0.1
