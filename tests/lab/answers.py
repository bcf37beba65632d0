"""Record what a real slurmctld answers about jobs, hostile ones included, as tests/data/slurm/<version>.json.

    /opt/imexctl/bin/python -m tests.lab.answers --slurm 24.11 [--out tests/data/slurm]
    /opt/imexctl/bin/python -m tests.lab.answers --slurm 24.11 --drains  # drains-<version>.json

Not a test: run it as root from the repository root, one lab at a time on the machine (as the lab's
tests are run), with /opt/imexctl pointing at this checkout.

One lab per run (4 nodes, this checkout's hooks). The lab user submits, and holds running:

- ``plain``: a batch job in the exclusive partition ``debug`` on node1-2;
- ``hostile``: a batch job in ``shared`` on node3-4 whose name, comment, working directory, output
  and error paths and script path (its ``Command``) hold ``Key=value`` text for the fields slurmctld
  prints (:data:`INJECTED`), the separator imexctl's question uses, and a newline;
- then a hostile het job (node1-2 + node3-4) and an array of four one-node tasks.

For each job the file keeps, command by command, the argv, the extra environment, the exit code and
what was printed: imexctl's own question (slurm/slurmctld.py ``squeue_argv``), ``scontrol show job -o``,
``scontrol --json show job`` and ``squeue --json --jobs``; a JSON answer is kept whole for the jobs in
:data:`WHOLE_JSON`, else as the job ids it lists (``json_job_ids``, ``stdout`` null).
tests/slurm/test_slurmctld.py reads them.

With ``--drains`` it records instead what ``imexctl drains`` asks (commands/drains.py ``sinfo_argv``, with
and without the reasons) while the six trays of a lab carry the reasons of :data:`DRAINS`: two hooks' with
one code, another hook's, health's with a tag before and after it, NHC's, an admin's holding the separator;
then again with the admin's reason holding a newline and a forged record (:data:`FORGED`); and with no tray
drained.
tests/commands/test_drains.py reads them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from imexctl.commands.drains import TIME_ENV as SINFO_TIME_ENV
from imexctl.commands.drains import sinfo_argv
from imexctl.slurm.slurmctld import squeue_argv
from tests.lab import debroot
from tests.lab.cluster import SlurmLab
from tests.lab.jobs import UID, hold_script, release, wait_state
from tests.lab.versions import HostSlurm, RootSlurm, SlurmInstall
from tests.simhelpers import wait_for

__all__ = ["DRAINS", "FORGED", "INJECTED", "capture", "capture_drains", "main"]

#: what a hostile job writes into every field it sets: a Key=value for each field imexctl ever read from
#: scontrol's text, squeue's separator with a forged line, and (in the comment) a newline with a forged record
INJECTED = (
    "x JobId=999 JobState=CANCELLED OverSubscribe=NO Exclusive=NODE NodeList=gb[01-18] Restarts=9 "
    "StartTime=2000-01-01T00:00:00 HetJobId=1 HetJobOffset=7 |999|CANCELLED|gb[01-18]|NO|1|9|N/A|N/A|"
)
TIME_ENV = {"SLURM_TIME_FORMAT": "%s"}
#: the answers whose JSON is kept whole (10-35 KB each); of the others only the job ids listed are kept
WHOLE_JSON = ("hostile running", "het leader running")
#: the reason each tray is drained with for ``--drains``: two hooks' with one code, a hook's with another,
#: health's with a tag before and after it, NHC's, an admin's holding the separator
DRAINS = {
    "node1": "imex:config_invalid node1 job 12: /etc/imexctl/imexctl.conf:3: [readiness] deadline_s: not a number",
    "node2": "imex:config_invalid node2 job 12: /etc/imexctl/imexctl.conf:3: [readiness] deadline_s: not a number",
    "node3": "imex:not_ready node3 job 13: peers node1,node2 not ready (WAITING_FOR_PEERS)",
    "node4": "[ticket-7] imexh:stale_daemon node4: IMEX daemon pid 4242 of job 9, which no longer runs here [RO:reboot]",
    "node5": "NHC: imexn:config_invalid node5: /etc/imexctl/imexctl.conf:3: [readiness] deadline_s: not a number",
    "node6": "bad DIMM | ticket 4711",
}
#: node6's second reason: a newline, then a line shaped like node1's record with another reason
FORGED = "maintenance\nnode1|idle+drain|0|imexh:stock_unit node1: forged"


def _install(version: str) -> SlurmInstall:
    if version == "22.05":
        return HostSlurm()
    return RootSlurm(debroot.ensure_root(suite=debroot.SUITES[version]).path, RootSlurm.SERIES_NAMES[version])


def _answers(lab: SlurmLab, job_id: int, what: str) -> list[dict[str, Any]]:
    """Ask slurmctld about one job in every way the data keeps."""
    asks: list[tuple[list[str], dict[str, str]]] = [
        (list(squeue_argv("squeue", job_id)), TIME_ENV),
        (["scontrol", "show", "job", "-o", str(job_id)], {}),
        (["scontrol", "--json", "show", "job", str(job_id)], {}),
        (["squeue", "--json", f"--jobs={job_id}"], {}),
    ]
    out = []
    for argv, env in asks:
        res = lab.run(argv, check=False, env=env, timeout=30)
        answer = {"what": what, "job_id": job_id, "argv": argv, "env": env, "rc": res.returncode,
                  "stdout": res.stdout, "stderr": res.stderr}  # fmt: skip
        if "--json" in argv and res.returncode == 0 and what not in WHOLE_JSON:
            answer["stdout"] = None
            answer["json_job_ids"] = [j["job_id"] for j in json.loads(res.stdout)["jobs"]]
        out.append(answer)
    return out


def _hostile_dir(lab: SlurmLab) -> Path:
    d = lab.dir / "out" / "JobState=CANCELLED OverSubscribe=NO NodeList=gb[01-18] |CANCELLED|"
    d.mkdir(exist_ok=True)
    os.chmod(d, 0o1777)
    return d


def _script(path: Path, body: str, headers: Sequence[str] = ()) -> Path:
    path.write_text("#!/bin/sh\n" + "".join(f"#SBATCH {h}\n" for h in headers) + body + "\n")
    os.chmod(path, 0o755)
    return path


def _submit(lab: SlurmLab, argv: Sequence[str], cwd: Path | None = None) -> int:
    res = lab.run(["sbatch", "--parsable", *argv], user=UID, cwd=cwd, timeout=30)
    return int(res.stdout.strip().split(";")[0].split("+")[0])


def _running(lab: SlurmLab, job_id: int) -> None:
    wait_for((lab.dir / "out" / f"started-{job_id}").exists, 60, what=f"job {job_id} to start")


def _batch_jobs(lab: SlurmLab) -> dict[str, Any]:
    """``plain`` and ``hostile``, running, then ended."""
    hostile_dir = _hostile_dir(lab)
    plain = _submit(lab, ["-p", "debug", "-N2", "-w", "node1,node2", "-t", "5", "-o", f"{lab.dir}/out/%j.out",
                          "--wrap", hold_script(lab)])  # fmt: skip
    script = _script(hostile_dir / f"{INJECTED.split('|', 1)[0]}.sh", hold_script(lab))
    out = f"{hostile_dir}/NodeList=gb[01-18] JobState=CANCELLED %j.out"
    hostile = _submit(
        lab,
        ["-p", "shared", "-N2", "-w", "node3,node4", "-t", "5", "-J", INJECTED, "--comment", INJECTED + "\n" + INJECTED,
         "-o", out, "-e", out, "-D", str(hostile_dir), str(script)],
        cwd=hostile_dir,
    )  # fmt: skip
    _running(lab, plain)
    _running(lab, hostile)
    answers = _answers(lab, plain, "plain running") + _answers(lab, hostile, "hostile running")
    for job in (plain, hostile):
        release(lab, job)
        wait_state(lab, job, ["COMPLETED"])
    answers += _answers(lab, hostile, "hostile completed")
    jobs = {"plain": {"job_id": plain, "nodes": "node[1-2]", "partition": "debug"},
            "hostile": {"job_id": hostile, "nodes": "node[3-4]", "partition": "shared"}}  # fmt: skip
    return {"jobs": jobs, "answers": answers}


def _het_job(lab: SlurmLab) -> dict[str, Any]:
    hostile_dir = _hostile_dir(lab)
    script = _script(
        lab.dir / "out" / "het.sh",
        hold_script(lab),
        [f"-N 2 -w node1,node2 -t 5 -p debug -o {lab.dir}/out/%j.out", "hetjob", "-N 2 -w node3,node4 -t 5 -p debug"],
    )
    leader = _submit(lab, ["-J", INJECTED, "--comment", INJECTED, "-D", str(hostile_dir), str(script)])
    _running(lab, leader)
    answers = _answers(lab, leader, "het leader running") + _answers(lab, leader + 1, "het component running")
    release(lab, leader)
    wait_state(lab, leader, ["COMPLETED"])
    jobs = {"het": {"job_id": leader, "components": [["node[1-2]", 0], ["node[3-4]", 1]]}}
    return {"jobs": jobs, "answers": answers}


def _array_job(lab: SlurmLab) -> dict[str, Any]:
    first = _submit(lab, ["-p", "debug", "-N1", "-t", "5", "--array=0-3", "-o", f"{lab.dir}/out/%A_%a.out",
                          "--wrap", hold_script(lab)])  # fmt: skip
    tasks = range(first, first + 4)  # the tasks split off the array take the next ids
    wait_for(lambda: all((lab.dir / "out" / f"started-{t}").exists() for t in tasks), 60, what="the array's tasks")
    answers = _answers(lab, first, "array job id running") + _answers(lab, first + 1, "array task running")
    for task in tasks:
        release(lab, task)
    wait_for(lambda: not lab.run(["squeue", "-h"], check=False).stdout.strip(), 60, what="the array to end")
    return {"jobs": {"array": {"job_id": first, "tasks": 4}}, "answers": answers}


def capture(version: str) -> dict[str, Any]:
    """Bring a lab of ``version`` up, record every answer, take it down."""
    lab = SlurmLab(_install(version), nodes=4, owner_pid=os.getpid())
    lab.up()
    try:
        data: dict[str, Any] = {"slurm": lab.version, "injected": INJECTED, "jobs": {}, "answers": []}
        for part in (_batch_jobs, _het_job, _array_job):
            got = part(lab)
            data["jobs"].update(got["jobs"])
            data["answers"] += got["answers"]
        data["answers"] += _answers(lab, 99999, "unknown job")
        return data
    finally:
        lab.down()


def _sinfo(lab: SlurmLab, what: str) -> list[dict[str, Any]]:
    """Both of ``imexctl drains``' questions, as sinfo answers them now."""
    out = []
    for reasons in (False, True):
        argv = list(sinfo_argv("sinfo", reasons=reasons))
        res = lab.run(argv, check=False, env=SINFO_TIME_ENV, timeout=30)
        out.append({"what": what, "argv": argv, "env": SINFO_TIME_ENV, "rc": res.returncode, "stdout": res.stdout,
                    "stderr": res.stderr})  # fmt: skip
    return out


def _drain(lab: SlurmLab, node: str, reason: str) -> None:
    lab.run(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"], timeout=30)


def capture_drains(version: str) -> dict[str, Any]:
    """Bring a lab of ``version`` up, drain its trays with :data:`DRAINS` (then :data:`FORGED`), record sinfo."""
    lab = SlurmLab(_install(version), nodes=len(DRAINS), owner_pid=os.getpid())
    lab.up()
    try:
        data: dict[str, Any] = {"slurm": lab.version, "drains": DRAINS, "forged": FORGED, "answers": []}
        data["answers"] += _sinfo(lab, "none drained")
        for node, reason in DRAINS.items():
            _drain(lab, node, reason)
        data["answers"] += _sinfo(lab, "drained")
        _drain(lab, "node6", FORGED)
        data["answers"] += _sinfo(lab, "forged")
        for node in DRAINS:
            lab.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], timeout=30)
        return data
    finally:
        lab.down()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tests.lab.answers --slurm VERSION [--out DIR] [--drains]``."""
    ap = argparse.ArgumentParser(prog="python -m tests.lab.answers", description=__doc__.split("\n", 1)[0])
    ap.add_argument("--slurm", required=True, choices=("22.05", "24.11", "26.05"))
    ap.add_argument("--out", default="tests/data/slurm")
    ap.add_argument("--drains", action="store_true", help="record imexctl drains' sinfo answers instead")
    args = ap.parse_args(argv)
    data = capture_drains(args.slurm) if args.drains else capture(args.slurm)
    path = Path(args.out) / f"{'drains-' if args.drains else ''}{args.slurm}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {path}: Slurm {data['slurm']}, {len(data['answers'])} answers", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
