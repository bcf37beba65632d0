"""What Slurm says: the job's environment, node lists, slurm.conf, scontrol, topology files and blocks, addresses.

This module itself holds Slurm's environment variables: the one table of the
ones imexctl reads, and the one reader of them.  Every variable Slurm sets that
imexctl reads is a row of :data:`VARIABLES`: its name, who sets it, the Slurm
versions that set it, and the variable read when it is unset or blank (its
fallback, itself a row).  Every read of one goes through :func:`value` or
:func:`source`; no other module names a Slurm variable to read it
(``tests/slurm/test_env.py`` holds both).  The job (``slurm.job``), the job's
side (``channels``), ``netcheck``, the config lookup (which takes the value of
``SLURM_CONF``: :func:`under_slurmd`), the log's context and ``health`` take
what they need from here.  The versions are read from SchedMD/slurm
``src/plugins/prep/script/prep_script_slurmd.c`` (``_build_env``; design.md
source slurm-env) for the Prolog and Epilog, ``src/common/env.c`` and
``src/slurmd/slurmstepd/task.c`` for a job's tasks, ``src/slurmd/slurmd/slurmd.c``
(``run_script_health_check``; design.md source slurm-healthcheck) for
``HealthCheckProgram``.

The table is here, in the package's own module, because every hook loads this
package for its job (``slurm.job``): a module of its own cost every hook's fast
tier about 0.08 ms (docs/performance.md "Hook start-up").  Light enough for the
job's own user too: it imports ``os`` only to look for slurmd's slurm.conf (a
value is a plain string; what it means is its reader's to judge).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "CONF",
    "HEALTHY",
    "HET_JOB_ID",
    "JOB_CONSTRAINTS",
    "JOB_EXCLUSIVE",
    "JOB_GID",
    "JOB_ID",
    "JOB_NODELIST",
    "JOB_OVERSUBSCRIBE",
    "JOB_PARTITION",
    "JOB_QOS",
    "JOB_RESTART_COUNT",
    "JOB_SLUID",
    "JOB_START_TIME",
    "JOB_UID",
    "JOB_USER",
    "LOCALID",
    "MAX_JOB_ID",
    "MAX_OWNER_ID",
    "NODENAME",
    "PROCID",
    "SLURMD_CONFS",
    "STEP_NODELIST",
    "TIME_FORMAT",
    "VARIABLES",
    "hook_env",
    "source",
    "task_job_ids",
    "under_slurmd",
    "value",
]

# the names imexctl reads, each once
JOB_ID = "SLURM_JOB_ID"
JOB_NODELIST = "SLURM_JOB_NODELIST"
STEP_NODELIST = "SLURM_STEP_NODELIST"
NODENAME = "SLURMD_NODENAME"
CONF = "SLURM_CONF"
JOB_UID = "SLURM_JOB_UID"
JOB_GID = "SLURM_JOB_GID"
JOB_USER = "SLURM_JOB_USER"
JOB_PARTITION = "SLURM_JOB_PARTITION"
JOB_CONSTRAINTS = "SLURM_JOB_CONSTRAINTS"
JOB_OVERSUBSCRIBE = "SLURM_JOB_OVERSUBSCRIBE"
JOB_EXCLUSIVE = "SLURM_JOB_EXCLUSIVE"
JOB_QOS = "SLURM_JOB_QOS"
JOB_SLUID = "SLURM_JOB_SLUID"
JOB_RESTART_COUNT = "SLURM_JOB_RESTART_COUNT"
JOB_START_TIME = "SLURM_JOB_START_TIME"
HET_JOB_ID = "SLURM_HET_JOB_ID"
PROCID = "SLURM_PROCID"
LOCALID = "SLURM_LOCALID"
HEALTHY = "SLURM_NODE_IS_HEALTHY"
#: set by imexctl for the ``squeue`` it runs (times as seconds since the epoch), never read
TIME_FORMAT = "SLURM_TIME_FORMAT"

#: ``(name, who sets it, since, fallback)``: who is ``hook`` (slurmd's Prolog and Epilog), ``task`` (a job
#: step's tasks: srun, the TaskProlog, enroot's hooks) or ``health`` (slurmd's HealthCheckProgram); since is the
#: first Slurm release that sets it there ('' for 22.05 and before); fallback the variable read when it is unset
#: or blank ('' for none).
VARIABLES = (
    (JOB_ID, "hook task", "", "SLURM_JOBID"),
    ("SLURM_JOBID", "hook task", "", ""),
    (NODENAME, "hook task health", "", ""),
    (CONF, "hook task", "", ""),
    # the hook's from 23.02 (22.05.8 sets only SLURM_NODELIST, tag slurm-22-05-8-1); a task's always
    (JOB_NODELIST, "hook task", "23.02", "SLURM_NODELIST"),
    ("SLURM_NODELIST", "hook task", "", ""),
    (STEP_NODELIST, "task", "", JOB_NODELIST),
    (JOB_UID, "hook", "", "SLURM_UID"),
    ("SLURM_UID", "hook", "", ""),
    (JOB_GID, "hook", "", ""),
    (JOB_USER, "hook", "", ""),
    # from the job's credential
    (JOB_PARTITION, "hook", "", ""),
    (JOB_CONSTRAINTS, "hook", "", ""),
    (JOB_OVERSUBSCRIBE, "hook", "23.02", ""),
    (JOB_EXCLUSIVE, "hook", "26.05", ""),
    (JOB_QOS, "hook", "26.05", ""),
    (JOB_SLUID, "hook", "25.11", ""),
    (JOB_RESTART_COUNT, "hook", "", ""),
    (JOB_START_TIME, "hook", "23.02", ""),
    # a het job's: the leader's id (and the old name); a component's own id, in its tasks only
    (HET_JOB_ID, "hook task", "", "SLURM_PACK_JOB_ID"),
    ("SLURM_PACK_JOB_ID", "hook", "", ""),
    ("SLURM_JOB_ID_HET_GROUP_<n>", "task", "", ""),
    ("SLURM_JOB_ID_PACK_GROUP_<n>", "task", "", ""),  # the tasks of a het job srun allocated (22.05, 24.11)
    (PROCID, "task", "", ""),
    (LOCALID, "task", "", ""),
    # only where slurmctld sends its verdict: 26.05.3 with SlurmctldParameters=health_check_report
    (HEALTHY, "health", "26.05.3", ""),
)
_FALLBACK = {name: fallback for name, _, _, fallback in VARIABLES if fallback}
_HET_GROUP, _PACK_GROUP = "SLURM_JOB_ID_HET_GROUP_", "SLURM_JOB_ID_PACK_GROUP_"

# Slurm job ids are uint32_t, federated ones up to 0xfffffffd (SchedMD/slurm slurm/slurm.h, SLURM_ID_HASH,
# MAX_FED_JOB_ID).  uid_t/gid_t are 32 bits and (uid_t)-1 means "leave unchanged" to chown(2).
MAX_JOB_ID = 2**32 - 1
MAX_OWNER_ID = 2**32 - 2


def source(env: Mapping[str, str], name: str) -> tuple[str, str]:
    """``(the variable read, its value as set)``: ``name``, or its fallbacks in turn while the value is blank.

    The value is as set (not stripped); ``(name, '')`` when neither is set.
    """
    key = name
    while not env.get(key, "").strip() and key in _FALLBACK:
        key = _FALLBACK[key]
    text = env.get(key, "")
    return (key, text) if text.strip() else (name, env.get(name, ""))


def value(env: Mapping[str, str], name: str) -> str:
    """The value of ``name`` (or of its fallback), as set; '' when unset."""
    return source(env, name)[1]


def task_job_ids(env: Mapping[str, str]) -> list[str]:
    """Every job id a task's environment holds, as set, in the order a task's domain is looked for.

    ``SLURM_JOB_ID`` and ``SLURM_JOBID``, the het job's ``SLURM_HET_JOB_ID``,
    then each component's ``SLURM_JOB_ID_HET_GROUP_<n>`` by ``n``, and the
    ``SLURM_JOB_ID_PACK_GROUP_<n>`` that the tasks of a het job that srun
    itself allocated see.
    """
    groups = sorted(
        (int(n), key.startswith(_PACK_GROUP), key)
        for key in env
        if key.startswith((_HET_GROUP, _PACK_GROUP))
        for n in [key.rsplit("_", 1)[1]]
        if n.isascii() and n.isdigit()
    )
    return [env.get(key, "") for key in (JOB_ID, "SLURM_JOBID", HET_JOB_ID)] + [env[key] for _, _, key in groups]


def hook_env(hook: str, job_id: int, node: str, nodelist: str, uid: int, gid: int, **more: str) -> dict[str, str]:
    """The environment slurmd gives ``hook`` (``prolog``, ``epilog``) on ``node``, as 23.02 and later set it.

    For the demo's simulated trays; ``more`` adds variables by their short names
    (``user``, ``partition``, ``cluster``).
    """
    return {
        JOB_ID: str(job_id),
        "SLURM_JOBID": str(job_id),
        JOB_NODELIST: nodelist,
        "SLURM_NODELIST": nodelist,
        NODENAME: node,
        JOB_UID: str(uid),
        JOB_GID: str(gid),
        JOB_USER: more.get("user", ""),
        JOB_PARTITION: more.get("partition", ""),
        "SLURM_CLUSTER_NAME": more.get("cluster", ""),
        "SLURM_SCRIPT_CONTEXT": f"{hook}_slurmd",
    }


#: the slurm.conf slurmd uses when it was started without ``-f``, in the order it looks: the copy a
#: configless slurmd keeps (and names in SLURM_CONF for its hooks), then the compiled-in default
SLURMD_CONFS = ("/run/slurm/conf/slurm.conf", "/etc/slurm/slurm.conf")


def under_slurmd(env: Mapping[str, str]) -> Mapping[str, str]:
    """``env`` with the ``SLURM_CONF`` that slurmd gives the hooks, when it has none (an admin's shell).

    So ``status``, ``doctor`` and ``cleanup`` read the config file the hooks
    read (``schema.find_config``): beside slurm.conf when one is there.  A slurmd
    started with ``-f FILE`` elsewhere is not guessed: set ``SLURM_CONF``.
    """
    if value(env, CONF):
        return env
    found = next((path for path in SLURMD_CONFS if os.path.isfile(path)), "")
    return {**env, CONF: found} if found else env
