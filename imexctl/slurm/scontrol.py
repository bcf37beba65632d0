"""The three questions imexctl asks slurmctld, each once, only when it must (``scontrol``, bounded).

- A prolog about to fail asks whether its job still wants to start: a job
  cancelled while its prologs ran must not drain a healthy node.
- A het job's prolog asks for the other components' nodes, so all components
  that share an NVLink domain get one IMEX domain.
- Under Slurm 22.05, whose slurmd does not say, a prolog asks whether its job
  may share its trays (``[slurm] ask_sharing``).

Prologs should not call Slurm commands (design.md source slurm-no-commands):
every other hook run never does.
"""

from __future__ import annotations

import re
from typing import Final

from imexctl.config.settings import Settings
from imexctl.platform.errors import CommandError, SlurmQueryError
from imexctl.platform.host import Host
from imexctl.slurm import nodelist

__all__ = ["ENDED_STATES", "het_nodes", "job_oversubscribe", "job_state", "parse_show_job", "wants_to_start"]

#: job states in which the job will not run on the allocation this prolog sets up: it ended, is
#: ending, or went back to the queue (requeued because another node's prolog failed, say)
ENDED_STATES: Final = frozenset(
    {
        "CANCELLED", "COMPLETED", "COMPLETING", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
        "DEADLINE", "OUT_OF_MEMORY", "PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SPECIAL_EXIT",
        "REVOKED",
    }
)  # fmt: skip
_PAIR: Final = re.compile(r"(\w+)=(\S*)")


def parse_show_job(text: str) -> list[dict[str, str]]:
    """``scontrol show job -o`` output: one ``{Key: Value}`` per line (values with blanks are cut short)."""
    return [dict(_PAIR.findall(line)) for line in text.splitlines() if "JobId=" in line]


def _show_job(job_id: int, host: Host, settings: Settings, slurm_conf: str) -> tuple[int, str]:
    argv = (settings.commands.scontrol, "show", "job", "-o", str(job_id))
    env = {"SLURM_CONF": slurm_conf} if slurm_conf else {}
    done = host.run(argv, timeout_s=settings.slurm.query_timeout_s, env=env)
    if done.returncode != 0:
        return done.returncode, done.stderr.strip() or done.stdout.strip()
    return 0, done.stdout


def job_state(job_id: int, host: Host, settings: Settings, slurm_conf: str) -> str | None:
    """The job's ``JobState`` as slurmctld reports it, or None when it cannot tell.

    None also for a job slurmctld does not know ("Invalid job id"): that is
    what a slurm.conf of another cluster answers too, and a prolog must never
    let a job start without its domain on a guess.
    """
    return _job_field(job_id, "JobState", host, settings, slurm_conf)


def job_oversubscribe(job_id: int, host: Host, settings: Settings, slurm_conf: str) -> str | None:
    """The job's ``OverSubscribe`` as slurmctld reports it (``OK``, ``NO``, ``YES``, ``USER``, ...), or None.

    For Slurm 22.05, whose slurmd does not tell the prolog (``scontrol show
    job`` prints ``job_share_string()``, the same words 23.02 to 25.11 put in
    ``SLURM_JOB_OVERSUBSCRIBE``).  None when slurmctld cannot be asked or does
    not say.
    """
    found = _job_field(job_id, "OverSubscribe", host, settings, slurm_conf)
    return (found.strip().upper() or None) if found else None


def _job_field(job_id: int, field: str, host: Host, settings: Settings, slurm_conf: str) -> str | None:
    """One field of the job's ``scontrol show job -o`` record; None when slurmctld cannot be asked or lacks it."""
    try:
        rc, out = _show_job(job_id, host, settings, slurm_conf)
    except CommandError:
        return None
    if rc != 0:
        return None
    for record in parse_show_job(out):
        if record.get("JobId") == str(job_id):
            return record.get(field) or None
    return None


def wants_to_start(state: str) -> bool:
    """Whether a job in ``state`` may still run on its allocation (unknown states count as yes)."""
    return state not in ENDED_STATES


def het_nodes(het_job_id: int, host: Host, settings: Settings, slurm_conf: str) -> tuple[tuple[int, str], ...]:
    """``(offset, node)`` of every node of every component of a het job, by component offset.

    Raises:
        SlurmQueryError: slurmctld cannot be asked, or its answer lacks the components.
    """
    try:
        rc, out = _show_job(het_job_id, host, settings, slurm_conf)
    except CommandError as exc:
        raise SlurmQueryError(f"cannot ask slurmctld for het job {het_job_id}: {exc}") from exc
    if rc != 0:
        raise SlurmQueryError(f"scontrol show job {het_job_id}: exit {rc}: {out[-300:]}")
    parts = [r for r in parse_show_job(out) if r.get("HetJobId") == str(het_job_id)]
    if not parts or any(not r.get("HetJobOffset", "").isdigit() or not r.get("NodeList") for r in parts):
        raise SlurmQueryError(f"scontrol show job {het_job_id} did not list the het job's components with nodes")
    out_nodes: list[tuple[int, str]] = []
    for record in sorted(parts, key=lambda r: int(r["HetJobOffset"])):
        out_nodes += [(int(record["HetJobOffset"]), n) for n in nodelist.expand(record["NodeList"])]
    return tuple(out_nodes)
