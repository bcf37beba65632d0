"""Jobs on a lab and what they leave: submit, wait, read the step checker, imexctl's logs and leftovers.

Used by the lab's tests and by bench/bench_lab.py. Every job runs as the unprivileged :data:`UID`
unless told otherwise; paths under the lab directory mean the same file for the host and for Slurm.
"""

from __future__ import annotations

import configparser
import contextlib
import io
import json
import os
import re
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from imexctl.platform.fsutil import atomic_write
from tests.lab.cluster import IMEXCTL_PREFIX, TEST_GID, TEST_UID, TEST_USER, SlurmLab
from tests.lab.procs import proc_start_time
from tests.simhelpers import wait_for

__all__ = [
    "CRED_LIFETIME_S",
    "DONE_STATES",
    "GID",
    "IMEXCTL",
    "JOB_TIMEOUT",
    "PROLOG_TIMEOUT",
    "SIM_CTL",
    "UID",
    "USER",
    "JobEnded",
    "SlurmdLogs",
    "assert_domain_up",
    "channel_dir",
    "config_value",
    "consume_steps",
    "ctl_domain",
    "diagnose",
    "drains_view",
    "events",
    "hold_script",
    "imexctl_admin",
    "imexctl_settings",
    "install_stepcheck",
    "iso_time",
    "job_dir",
    "leftovers",
    "listening_ports",
    "prolog_processes",
    "read_steps",
    "release",
    "sbatch",
    "sim_processes",
    "srun_check",
    "step_argv",
    "wait_done",
    "wait_started",
    "wait_state",
]

IMEXCTL = IMEXCTL_PREFIX / "bin" / "imexctl"
SIM = IMEXCTL_PREFIX / "bin" / "nvidia-imex-sim"
SIM_CTL = IMEXCTL_PREFIX / "bin" / "nvidia-imex-ctl-sim"
USER, UID, GID = TEST_USER, TEST_UID, TEST_GID
PROLOG_TIMEOUT = 30
#: slurm.conf's credential lifetime (AuthInfo cred_expire), 120 s by default (DEFAULT_EXPIRATION_WINDOW): slurmctld
#: starts a requeued job no sooner than this after the requeue (batch_requeue_fini), and until then a slurmd of a
#: tray of both runs may still hold the first run's credential revoked and run no prolog for the second
CRED_LIFETIME_S = 120
JOB_TIMEOUT = 60
DONE_STATES = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "OUT_OF_MEMORY",
}

STEPCHECK = r"""
# the job step: runs as the job's user on every node; usage: stepcheck.py LAB [--ctl CTL] [--hold]
import glob, json, os, socket, stat, subprocess, sys, time
t = time.time()
lab, node, job = sys.argv[1], os.environ["SLURMD_NODENAME"], os.environ["SLURM_JOB_ID"]
root = f"{lab}/nodes/{node}"
out = {"t": t, "node": node, "host": socket.gethostname(), "uid": os.getuid(), "job": int(job), "channels": []}
for p in sorted(glob.glob(f"{root}/dev/nvidia-caps-imex-channels/*")):
    st = os.stat(p)
    out["channels"].append({"name": os.path.basename(p), "uid": st.st_uid, "gid": st.st_gid,
                            "mode": stat.S_IMODE(st.st_mode), "chr": stat.S_ISCHR(st.st_mode),
                            "major": os.major(st.st_rdev), "minor": os.minor(st.st_rdev)})
if "--ctl" in sys.argv:
    ctl = sys.argv[sys.argv.index("--ctl") + 1]
    cfg = f"{root}/run/imexctl/jobs/{job}/config.cfg"
    r = subprocess.run([ctl, "-c", cfg, "-N", "-j"], capture_output=True, text=True, timeout=20)
    out["ctl"] = {"rc": r.returncode, "stdout": r.stdout, "stderr": r.stderr[-2000:]}
# one file per node: long stdout lines would be split by slurmstepd's I/O; written whole, then renamed,
# since the test reads it as soon as it appears
with open(f"{lab}/out/.step-{job}-{node}.tmp", "w") as fh:
    json.dump(out, fh)
os.rename(f"{lab}/out/.step-{job}-{node}.tmp", f"{lab}/out/step-{job}-{node}.json")
if "--hold" in sys.argv:
    deadline = time.monotonic() + 60
    while not os.path.exists(f"{lab}/out/release-{job}") and time.monotonic() < deadline:
        time.sleep(0.05)
print("STEPCHECK", node, flush=True)
"""


class JobEnded(AssertionError):
    """A job ended in a state the caller did not wait for."""


def install_stepcheck(lab: SlurmLab) -> None:
    """Put the step checker into ``<lab>/bin`` (readable by the job user)."""
    bindir = lab.dir / "bin"
    bindir.mkdir(mode=0o755, exist_ok=True)
    (bindir / "stepcheck.py").write_text(STEPCHECK)
    os.chmod(bindir / "stepcheck.py", 0o644)


# -- what imexctl made on a node ---------------------------------------------------------------------------


def job_dir(lab: SlurmLab, node: str, job: int) -> Path:
    """Return imexctl's per-job directory on a node."""
    return lab.node_root(node) / "run" / "imexctl" / "jobs" / str(job)


def channel_dir(lab: SlurmLab, node: str) -> Path:
    """Return the IMEX channel directory on a node."""
    return lab.node_root(node) / "dev" / "nvidia-caps-imex-channels"


def _cmdline(pid: str) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None


def sim_processes(lab: SlurmLab, node: str | None = None, job: int | None = None) -> list[tuple[int, list[str]]]:
    """Return live simulated IMEX daemons (pid, argv) of the lab, optionally of one node and job."""
    want = f"{lab.dir}/nodes/{node or ''}"
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or proc_start_time(int(entry)) is None:
            continue
        argv = _cmdline(entry)
        if not argv or not any("nvidia-imex-sim" in a for a in argv[:2]):
            continue
        cfgs = [a for a in argv if a.startswith(want) and a.endswith("config.cfg")]
        if cfgs and (job is None or f"/jobs/{job}/" in cfgs[0]):
            out.append((int(entry), argv))
    return out


def listening_ports(lab: SlurmLab, node: str) -> list[int]:
    """Return the TCP ports listening inside a node's namespace, slurmd's own excepted."""
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            text = Path(f"/proc/{lab.slurmd_pid(node)}/net/{table}").read_text()
        except OSError:
            continue
        for line in text.splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    ports.discard(6818)
    return sorted(ports)


def leftovers(lab: SlurmLab, node: str, job: int | None = None) -> list[str]:
    """Return what imexctl left on a node: job dirs, channels, daemons, listening ports."""
    found = []
    jobs = lab.node_root(node) / "run" / "imexctl" / "jobs"
    dirs = [job_dir(lab, node, job)] if job is not None else (sorted(jobs.iterdir()) if jobs.is_dir() else [])
    found += [f"job dir {d}" for d in dirs if d.exists()]
    chans = sorted(channel_dir(lab, node).glob("channel*")) if channel_dir(lab, node).is_dir() else []
    found += [f"channel {c}" for c in chans]
    found += [f"daemon pid {pid}: {' '.join(argv)}" for pid, argv in sim_processes(lab, node, job)]
    found += [f"listening port {p}" for p in listening_ports(lab, node)]
    return found


def imexctl_admin(lab: SlurmLab, node: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run an imexctl admin command for a node, as an administrator would (in the node's namespace)."""
    return lab.node_exec(
        node,
        [str(IMEXCTL), "--config", str(lab.imexctl_conf), *args],
        env={"SLURMD_NODENAME": node},
        check=check,
        timeout=60,
    )


@contextlib.contextmanager
def imexctl_settings(lab: SlurmLab, changes: Mapping[str, Mapping[str, str]]) -> Iterator[None]:
    """Change keys of the lab's imexctl.conf (``{section: {key: value}}``) for the block, then put it back.

    Every hook reads the file anew, so the change applies to the next job; the lab's slurm.conf is untouched.
    """
    old = lab.imexctl_conf.read_text()
    conf = configparser.ConfigParser(interpolation=None)
    conf.read_string(old)
    for section, keys in changes.items():
        if not conf.has_section(section):
            conf.add_section(section)
        for key, value in keys.items():
            conf.set(section, key, value)
    text = io.StringIO()
    conf.write(text)
    atomic_write(lab.imexctl_conf, text.getvalue(), mode=0o644)
    try:
        yield
    finally:
        atomic_write(lab.imexctl_conf, old, mode=0o644)


def events(lab: SlurmLab, node: str, job: int | None = None, event: str | None = None) -> list[dict[str, Any]]:
    """Return imexctl's JSON log records on a node, optionally of one job and event."""
    path = lab.node_root(node) / "var" / "log" / "imexctl.log"
    out = []
    if path.exists():
        for line in path.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if job is not None and str(rec.get("job_id")) != str(job):
                continue
            if event is not None and rec.get("event") != event:
                continue
            out.append(rec)
    return out


def ctl_domain(lab: SlurmLab, node: str, job: int) -> dict[str, Any]:
    """Return the job's domain as the simulated nvidia-imex-ctl -N -j shows it on a node (as root)."""
    cfg = job_dir(lab, node, job) / "config.cfg"
    res = lab.node_exec(node, [str(SIM_CTL), "-c", str(cfg), "-N", "-j"], check=False, timeout=30)
    assert res.returncode == 0, f"ctl on {node} failed ({res.returncode}): {res.stdout}{res.stderr}"
    return dict(json.loads(res.stdout))


def assert_domain_up(domain: dict[str, Any], n: int, where: str) -> None:
    """Assert a domain snapshot is UP with n READY nodes, all pairs CONNECTED."""
    assert domain.get("status") == "UP", f"{where}: domain not UP: {json.dumps(domain)}"
    nodes = domain["nodes"]
    assert len(nodes) == n, f"{where}: {len(nodes)} nodes in the domain, want {n}"
    for key, info in nodes.items():
        assert info["status"] == "READY", f"{where}: node #{key} is {info['status']}"
        states = {k: c["status"] for k, c in info["connections"].items()}
        assert set(states.values()) == {"CONNECTED"} and len(states) == n, f"{where}: node #{key} sees {states}"


def config_value(path: Path, key: str) -> str:
    """Return one KEY=VALUE from an IMEX config.cfg."""
    for line in path.read_text().splitlines():
        if line.startswith(f"{key}="):
            return line.split("=", 1)[1].strip()
    raise KeyError(f"{key} not in {path}")


def prolog_processes(job: int) -> list[dict[str, Any]]:
    """Return the running `imexctl prolog` processes of a job with their environment, pgid and sid."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            if b"prolog" not in argv or not any(a.endswith(b"/imexctl") for a in argv[:2]):
                continue
            env = dict(
                kv.split("=", 1)
                for kv in Path(f"/proc/{entry}/environ").read_bytes().decode(errors="replace").split("\0")
                if "=" in kv
            )
            pid = int(entry)
            rec = {"pid": pid, "env": env, "pgid": os.getpgid(pid), "sid": os.getsid(pid)}
        except (OSError, ValueError):
            continue
        if env.get("SLURM_JOB_ID") == str(job):
            out.append(rec)
    return out


# -- jobs -------------------------------------------------------------------------------------------------


def sbatch(lab: SlurmLab, wrap: str, nodes: Sequence[str], user: int = UID, extra: Sequence[str] = ()) -> int:
    """Submit a batch job on exactly these nodes and return its id."""
    res = lab.run(
        [
            "sbatch",
            "--parsable",
            "-N",
            str(len(nodes)),
            "-w",
            ",".join(nodes),
            "-t",
            "5",
            "-o",
            f"{lab.dir}/out/%j.out",
            *extra,
            "--wrap",
            wrap,
        ],
        user=user,
        timeout=30,
    )
    return int(res.stdout.strip().split(";")[0])


def hold_script(lab: SlurmLab) -> str:
    """Return a batch script that marks its start and runs until out/release-<jobid> appears (bounded)."""
    out = lab.dir / "out"
    return (
        f"touch {out}/started-$SLURM_JOB_ID; i=0; while [ ! -e {out}/release-$SLURM_JOB_ID ]; do i=$((i+1)); "
        f"[ $i -gt 1200 ] && exit 3; sleep 0.1; done; echo released"
    )


def wait_started(lab: SlurmLab, job: int, timeout: float = JOB_TIMEOUT) -> dict[str, str]:
    """Wait until a hold_script job's batch script runs (so every prolog has finished: DeferBatch)."""
    marker = lab.dir / "out" / f"started-{job}"

    def started() -> bool:
        if marker.exists():
            return True
        state = lab.job(job).get("JobState")
        if state in DONE_STATES:
            raise JobEnded(f"job {job} ended {state} before its script started\n{diagnose(lab, job)}")
        return False

    try:
        wait_for(started, timeout, what=f"job {job}'s batch script to start")
    except JobEnded:
        raise
    except AssertionError:
        info = lab.job(job)
        raise AssertionError(
            f"job {job} did not start in {timeout}s: {info.get('JobState')} "
            f"({info.get('Reason')})\n{diagnose(lab, job)}"
        ) from None
    return lab.job(job)


def release(lab: SlurmLab, job: int) -> None:
    """Let a job started with hold_script finish."""
    (lab.dir / "out" / f"release-{job}").touch()


def wait_state(lab: SlurmLab, job: int, states: Sequence[str], timeout: float = JOB_TIMEOUT) -> dict[str, str]:
    """Wait until a job is in one of the given states and return its record."""
    last: dict[str, str] = {}

    def check() -> dict[str, str] | None:
        nonlocal last
        last = lab.job(job)
        if last.get("JobState") in DONE_STATES and last["JobState"] not in states:
            raise JobEnded(
                f"job {job} ended {last.get('JobState')} ({last.get('Reason')}), want {states}\n{diagnose(lab, job)}"
            )
        return last if last.get("JobState") in states else None

    try:
        return wait_for(check, timeout, what=f"job {job} to be {'/'.join(states)}")
    except JobEnded:
        raise
    except AssertionError:
        raise AssertionError(
            f"job {job} not {states} after {timeout}s: {last.get('JobState')} "
            f"({last.get('Reason')})\n{diagnose(lab, job)}"
        ) from None


def wait_done(lab: SlurmLab, job: int, timeout: float = JOB_TIMEOUT) -> dict[str, str]:
    """Wait until a job COMPLETED, epilogs included, and return its record."""
    return wait_state(lab, job, ["COMPLETED"], timeout)


#: slurmd's RETRY_DELAY (src/slurmd/slurmd/req.c, 15 s in 22.05, 24.11 and 26.05)
SLURMD_RETRY_DELAY_S = 15.0
_RETRY_LINE = re.compile(r"^\[(\S+)\] .*Retrying prolog complete RPC for (?:JobId=|StepId=)?(\d+)\b")


def prolog_rpc_retries(lab: SlurmLab, job: int, nodes: Sequence[str] | None = None) -> list[datetime]:
    """When each slurmd (of ``nodes``, default all) logged that it will send ``job``'s failed prolog's completion
    again, in 15 s."""
    out = []
    for node in lab.nodes if nodes is None else nodes:
        log = lab.slurmd_log(node)
        if log.exists():
            for line in log.read_text(errors="replace").splitlines():
                m = _RETRY_LINE.match(line)
                if m and int(m.group(2)) == job:
                    out.append(datetime.fromisoformat(m.group(1)))
    return out


def wait_prolog_rpcs_settled(lab: SlurmLab, job: int) -> None:
    """Wait until no slurmd is about to resend ``job``'s failed prolog to slurmctld.

    After a failed prolog slurmd sends slurmctld the prolog's completion and the
    batch launch's failure until slurmctld takes them, every 15 s (a loaded
    slurmctld may miss the first).  A resend that arrives after the held job was
    released and started again ends the new run FAILED (NonZeroExitCode)
    before any prolog of it runs: the last sleep must be over first.
    """

    def settled() -> bool:
        last = max(prolog_rpc_retries(lab, job), default=None)
        return last is None or (datetime.now() - last).total_seconds() > SLURMD_RETRY_DELAY_S + 2

    wait_for(settled, 2 * SLURMD_RETRY_DELAY_S + 10, 0.5, what=f"slurmd's resends of job {job}'s prolog completion")


def diagnose(lab: SlurmLab, job: int) -> str:
    """Return diagnostics for a failed job: imexctl's failures, slurmd errors, slurmctld's lines on the job and
    the last lines of each node's IMEX log."""
    lines = []
    ctld = lab.slurmctld_log
    if ctld.exists():
        pattern = re.compile(rf"JobId={job}\b|job_?id[ =]{job}\b", re.IGNORECASE)
        lines += [f"slurmctld: {ln}" for ln in ctld.read_text(errors="replace").splitlines() if pattern.search(ln)][
            -30:
        ]
    for node in lab.nodes:
        for rec in events(lab, node, job):
            if rec.get("level") in ("error", "warning") or rec.get("event") in ("prolog.done", "epilog.done"):
                lines.append(f"{node}: {json.dumps(rec)[:600]}")
        log = lab.slurmd_log(node)
        if log.exists():
            lines += [f"{node}: {ln}" for ln in log.read_text(errors="replace").splitlines() if "error" in ln.lower()][
                -5:
            ]
        # the simulated daemons' own words: why one exited during start-up, what it saw of its peers
        imex_log = lab.node_root(node) / "var/log/nvidia-imex.log"
        if imex_log.exists():
            lines += [f"{node} imex: {ln}" for ln in imex_log.read_text(errors="replace").splitlines()[-15:]]
    return "\n".join(lines)


# -- the step checker -------------------------------------------------------------------------------------


def step_argv(lab: SlurmLab, nodes: Sequence[str], *opts: str) -> list[str]:
    """Return an srun command line running the step checker on exactly these nodes."""
    return [
        "srun",
        "-N",
        str(len(nodes)),
        "-w",
        ",".join(nodes),
        "-t",
        "5",
        "-l",
        "/usr/bin/python3",
        "-I",
        str(lab.dir / "bin" / "stepcheck.py"),
        str(lab.dir),
        *opts,
    ]


def read_steps(lab: SlurmLab, nodes: Sequence[str]) -> dict[str, dict[str, Any]] | None:
    """Return the step checker's results once every node has written one (None before)."""
    found = {n: sorted((lab.dir / "out").glob(f"step-*-{n}.json")) for n in nodes}
    if not all(found.values()):
        return None
    return {n: json.loads(files[-1].read_text()) for n, files in found.items()}


def consume_steps(lab: SlurmLab, nodes: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Read and remove the step checker's results of these nodes."""
    out = read_steps(lab, nodes) or {}
    for n in nodes:
        for f in (lab.dir / "out").glob(f"step-*-{n}.json"):
            f.unlink()
    return out


def srun_check(lab: SlurmLab, nodes: Sequence[str], *opts: str, user: int = UID) -> tuple[int, dict[str, Any]]:
    """Run the step checker on every node of a new job; return (job id, per-node results)."""
    res = lab.run(step_argv(lab, nodes, *opts), user=user, timeout=JOB_TIMEOUT, check=False)
    m = re.search(r"job (\d+)", res.stderr)
    checks = consume_steps(lab, nodes)
    job = next(iter(checks.values()))["job"] if checks else (int(m.group(1)) if m else -1)
    assert res.returncode == 0, f"srun failed ({res.returncode}):\n{res.stdout}\n{res.stderr}\n{diagnose(lab, job)}"
    assert sorted(checks) == sorted(nodes), f"step ran on {sorted(checks)}:\n{res.stdout}\n{res.stderr}"
    return job, checks


def iso_time(text: str) -> float:
    """Return the epoch seconds of an ISO timestamp from imexctl's log (UTC, 'Z')."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


# -- slurmd's own view ------------------------------------------------------------------------------------

_TS = re.compile(r"^\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})\] (.*)$")
# the same lines in 22.05.8 and 24.11.5 (prep/script plugin, SlurmdDebug=debug2)
_PROLOG_START = "Processing RPC: REQUEST_LAUNCH_PROLOG"
_PROLOG_END = re.compile(r"_run_subpath_command: prolog (success|failed)|prolog failed")


class SlurmdLogs:
    """Reads what the slurmds logged since a mark (SlurmdDebug=debug2, LogTimeFormat=iso8601_ms)."""

    def __init__(self, lab: SlurmLab, nodes: Sequence[str] | None = None) -> None:
        self.lab, self.nodes = lab, list(nodes or lab.nodes)
        self.offsets = {n: lab.slurmd_log(n).stat().st_size for n in self.nodes}

    def prolog_times(self) -> dict[str, float]:
        """Return each node's prolog duration (s): REQUEST_LAUNCH_PROLOG processing to the script's result."""
        out = {}
        for node in self.nodes:
            with open(self.lab.slurmd_log(node), errors="replace") as fh:
                fh.seek(self.offsets[node])
                text = fh.read()
            start = None
            for line in text.splitlines():
                m = _TS.match(line)
                if not m:
                    continue
                when = datetime.fromisoformat(m.group(1)).timestamp()
                if _PROLOG_START in m.group(2):
                    start = when
                elif start is not None and _PROLOG_END.search(m.group(2)):
                    out[node] = when - start
                    start = None
        return out


#: the blocks an admin's login node knows the lab's trays by (its topology.conf)
LOGIN_TOPOLOGY = "BlockName=b1 Nodes=node[1-2]\nBlockName=b2 Nodes=node[3-4]\nBlockSizes=2\n"


def drains_view(lab: SlurmLab) -> dict[str, Any]:
    """``imexctl drains --json`` as an admin runs it on a login node: its own config, whose topology has blocks."""
    topology = lab.dir / "etc" / "topology-login.conf"
    topology.write_text(LOGIN_TOPOLOGY)
    config = lab.dir / "etc" / "imexctl-login.conf"
    config.write_text(f"[paths]\ntopology_file = {topology}\n")
    for path in (topology, config):
        path.chmod(0o644)
    res = lab.node_exec(lab.nodes[0], [str(IMEXCTL), "--config", str(config), "drains", "--json"], timeout=60)
    return dict(json.loads(res.stdout)["data"])
