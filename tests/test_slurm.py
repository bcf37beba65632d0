"""imexctl's Prolog/Epilog under a real multi-node Slurm 22.05 cluster (tests/slurmlab.py).

Every test goes through real ``srun``/``sbatch``: slurmd runs this checkout's ``hooks/prolog`` and
``hooks/epilog`` on each node (a network namespace), and the hooks run ``/opt/imexctl/bin/imexctl`` with the
simulated IMEX daemon. Needs root, network namespaces, Slurm + munge, imexctl in /opt/imexctl and the user
``imexlab`` (uid 1501); without them the tests skip, except under ``CI=true`` where they fail.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pwd
import re
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import pytest

_spec = importlib.util.spec_from_file_location("slurmlab", Path(__file__).with_name("slurmlab.py"))
assert _spec is not None and _spec.loader is not None
slurmlab = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("slurmlab", slurmlab)
_spec.loader.exec_module(slurmlab)
SlurmLab = slurmlab.SlurmLab
wait_for = slurmlab.wait_for

pytestmark = pytest.mark.slurm

PREFIX = slurmlab.IMEXCTL_PREFIX
IMEXCTL = PREFIX / "bin" / "imexctl"
SIM = PREFIX / "bin" / "nvidia-imex-sim"
SIM_CTL = PREFIX / "bin" / "nvidia-imex-ctl-sim"
USER, UID = slurmlab.TEST_USER, slurmlab.TEST_UID
NODES = ["node1", "node2", "node3", "node4"]
PROLOG_TIMEOUT = 30
JOB_TIMEOUT = 60
DONE_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
               "DEADLINE", "OUT_OF_MEMORY"}

# lines for the terminal summary (measurements that should show in CI logs)
REPORT: List[str] = []

STEPCHECK = r'''
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
# one file per node: long stdout lines would be split by slurmstepd's I/O
with open(f"{lab}/out/step-{job}-{node}.json", "w") as fh:
    json.dump(out, fh)
if "--hold" in sys.argv:
    deadline = time.monotonic() + 60
    while not os.path.exists(f"{lab}/out/release-{job}") and time.monotonic() < deadline:
        time.sleep(0.05)
print("STEPCHECK", node, flush=True)
'''


def _unavailable(reason: str) -> None:
    """Skip, or fail when CI=true (CI must never skip these tests silently)."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"slurm lab unavailable under CI=true: {reason}", pytrace=False)
    pytest.skip(f"slurm lab unavailable: {reason}")


def _problems() -> List[str]:
    """Return why this machine cannot run the tests."""
    problems = slurmlab.preflight()
    for exe in (IMEXCTL, SIM, SIM_CTL):
        if not os.access(exe, os.X_OK):
            problems.append(f"{exe} missing (python3 -m venv {PREFIX} && {PREFIX}/bin/pip install -e '<repo>[test]')")
    try:
        pw = pwd.getpwnam(USER)
        if pw.pw_uid != UID:
            problems.append(f"user {USER} has uid {pw.pw_uid}, not {UID}")
    except KeyError:
        problems.append(f"user {USER} missing (useradd -u {UID} -M -s /usr/sbin/nologin {USER})")
    return problems


class _Summary:
    """A pytest plugin that prints REPORT at the end of the run."""

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if REPORT:
            terminalreporter.section("slurm lab measurements")
            for line in REPORT:
                terminalreporter.write_line(line)


def report(line: str, capsys: Optional[pytest.CaptureFixture] = None) -> None:
    """Record a measurement for the terminal summary and print it now."""
    REPORT.append(line)
    if capsys is not None:
        with capsys.disabled():
            print(f"\n    [slurm lab] {line}", flush=True)


# ---------------------------------------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="module")
def lab(request: pytest.FixtureRequest) -> Iterator[SlurmLab]:
    """A 4-node cluster running this checkout's hooks, brought up once for the module."""
    problems = _problems()
    if problems:
        _unavailable("; ".join(problems))
    if not request.config.pluginmanager.has_plugin("slurm-lab-summary"):
        request.config.pluginmanager.register(_Summary(), "slurm-lab-summary")
    t0 = time.monotonic()
    the_lab = SlurmLab(nodes=len(NODES), slurmd_debug="debug2", prolog_epilog_timeout=PROLOG_TIMEOUT,
                       owner_pid=os.getpid())
    try:
        the_lab.up()
    except slurmlab.LabUnavailable as exc:
        _unavailable(str(exc))
    REPORT.append(f"lab bring-up: {time.monotonic() - t0:.2f}s ({the_lab.dir})")
    bindir = the_lab.dir / "bin"
    bindir.mkdir(mode=0o755)
    (bindir / "stepcheck.py").write_text(STEPCHECK)
    os.chmod(bindir / "stepcheck.py", 0o644)
    imexctl_src = _imexctl_source()
    if imexctl_src and not imexctl_src.startswith(str(slurmlab.REPO)):
        REPORT.append(f"WARNING: {IMEXCTL} runs imexctl from {imexctl_src}, not from this checkout")
    try:
        yield the_lab
    finally:
        t1 = time.monotonic()
        the_lab.down()
        REPORT.append(f"lab teardown: {time.monotonic() - t1:.2f}s")


@pytest.fixture(autouse=True)
def fresh(lab: SlurmLab, request: pytest.FixtureRequest) -> Iterator[None]:
    """Give each test an idle cluster without faults, and put it back that way afterwards."""
    lab.faults.write_text("")
    yield
    lab.faults.write_text("")

    def drained() -> bool:
        # a job may still be completing or about to be requeued: cancel again until the queue is empty
        if not lab.run(["squeue", "-h"], check=False).stdout.strip():
            return True
        lab.run(["scancel", "--user", USER], check=False)
        lab.run(["scancel", "--user", "root"], check=False)
        return False
    wait_for(drained, 60, "the queue to drain", interval=0.5)
    for node, st in lab.node_states().items():
        if st["state"] != "idle":
            lab.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
    lab.wait_idle(timeout=30)
    for node in NODES:
        left = leftovers(lab, node)
        if left:
            REPORT.append(f"after {request.node.name}: {node} had leftovers, ran cleanup --force: {left}")
            imexctl_admin(lab, node, "cleanup", "--force", check=False)


# ---------------------------------------------------------------------------------------------------------
# helpers


def _imexctl_source() -> Optional[str]:
    """Return where /opt/imexctl imports imexctl from."""
    import subprocess
    res = subprocess.run([str(PREFIX / "bin" / "python"), "-c", "import imexctl; print(imexctl.__file__)"],
                         capture_output=True, text=True, timeout=30)
    return res.stdout.strip() or None


def job_dir(lab: SlurmLab, node: str, job: int) -> Path:
    """Return imexctl's per-job directory on a node."""
    return lab.node_root(node) / "run" / "imexctl" / "jobs" / str(job)


def channel_dir(lab: SlurmLab, node: str) -> Path:
    """Return the IMEX channel directory on a node."""
    return lab.node_root(node) / "dev" / "nvidia-caps-imex-channels"


def sim_processes(lab: SlurmLab, node: Optional[str] = None, job: Optional[int] = None) -> List[Tuple[int, List[str]]]:
    """Return live simulated IMEX daemons (pid, argv) of the lab, optionally of one node and job."""
    want = f"{lab.dir}/nodes/{node or ''}"
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or slurmlab.proc_start_time(int(entry)) is None:
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if not any("nvidia-imex-sim" in a for a in argv[:2]):
            continue
        cfgs = [a for a in argv if a.startswith(want) and a.endswith("config.cfg")]
        if cfgs and (job is None or f"/jobs/{job}/" in cfgs[0]):
            out.append((int(entry), argv))
    return out


def listening_ports(lab: SlurmLab, node: str) -> List[int]:
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


def leftovers(lab: SlurmLab, node: str, job: Optional[int] = None) -> List[str]:
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


def imexctl_admin(lab: SlurmLab, node: str, *args: str, check: bool = True):
    """Run an imexctl admin command for a node, as an administrator would (in the node's namespace)."""
    return lab.node_exec(node, [str(IMEXCTL), "--config", str(lab.imexctl_conf), *args],
                         env={"SLURMD_NODENAME": node}, check=check, timeout=60)


def events(lab: SlurmLab, node: str, job: Optional[int] = None, event: Optional[str] = None) -> List[Dict[str, Any]]:
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


def ctl_domain(lab: SlurmLab, node: str, job: int) -> Dict[str, Any]:
    """Return the job's domain as the simulated nvidia-imex-ctl -N -j shows it on a node (as root)."""
    cfg = job_dir(lab, node, job) / "config.cfg"
    res = lab.node_exec(node, [str(SIM_CTL), "-c", str(cfg), "-N", "-j"], check=False, timeout=30)
    assert res.returncode == 0, f"ctl on {node} failed ({res.returncode}): {res.stdout}{res.stderr}"
    return json.loads(res.stdout)


def assert_domain_up(domain: Dict[str, Any], n: int, where: str) -> None:
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


def sbatch(lab: SlurmLab, wrap: str, nodes: Sequence[str], user: int = UID, extra: Sequence[str] = ()) -> int:
    """Submit a batch job on exactly these nodes and return its id."""
    res = lab.run(["sbatch", "--parsable", "-N", str(len(nodes)), "-w", ",".join(nodes), "-t", "5",
                   "-o", f"{lab.dir}/out/%j.out", *extra, "--wrap", wrap], user=user, timeout=30)
    return int(res.stdout.strip().split(";")[0])


def hold_script(lab: SlurmLab) -> str:
    """Return a batch script that marks its start and runs until out/release-<jobid> appears (bounded)."""
    return (f'touch {lab.dir}/out/started-$SLURM_JOB_ID; i=0; while [ ! -e {lab.dir}/out/release-$SLURM_JOB_ID ]; do i=$((i+1)); '
            f'[ $i -gt 1200 ] && exit 3; sleep 0.1; done; echo released')


def wait_started(lab: SlurmLab, job: int, timeout: float = JOB_TIMEOUT) -> Dict[str, str]:
    """Wait until a hold_script job's batch script runs (so every prolog has finished: DeferBatch)."""
    marker = lab.dir / "out" / f"started-{job}"

    def started() -> bool:
        if marker.exists():
            return True
        state = lab.job(job).get("JobState")
        if state in DONE_STATES:
            raise AssertionError(f"job {job} ended {state} before its script started\n{_diag(lab, job)}")
        return False
    try:
        wait_for(started, timeout, f"job {job}'s batch script to start")
    except TimeoutError:
        info = lab.job(job)
        raise AssertionError(f"job {job} did not start in {timeout}s: {info.get('JobState')} "
                             f"({info.get('Reason')})\n{_diag(lab, job)}") from None
    return lab.job(job)


def release(lab: SlurmLab, job: int) -> None:
    """Let a job started with hold_script finish."""
    (lab.dir / "out" / f"release-{job}").touch()


def wait_state(lab: SlurmLab, job: int, states: Sequence[str], timeout: float = JOB_TIMEOUT) -> Dict[str, str]:
    """Wait until a job is in one of the given states and return its record."""
    last: Dict[str, str] = {}

    def check() -> Optional[Dict[str, str]]:
        nonlocal last
        last = lab.job(job)
        if last.get("JobState") in DONE_STATES and last["JobState"] not in states:
            raise AssertionError(f"job {job} ended {last.get('JobState')} ({last.get('Reason')}), "
                                 f"want {states}\n{_diag(lab, job)}")
        return last if last.get("JobState") in states else None
    try:
        return wait_for(check, timeout, f"job {job} to be {'/'.join(states)}")
    except TimeoutError:
        raise AssertionError(f"job {job} not {states} after {timeout}s: {last.get('JobState')} "
                             f"({last.get('Reason')})\n{_diag(lab, job)}") from None


def wait_done(lab: SlurmLab, job: int, timeout: float = JOB_TIMEOUT) -> Dict[str, str]:
    """Wait until a job COMPLETED, epilogs included, and return its record."""
    return wait_state(lab, job, ["COMPLETED"], timeout)


def _diag(lab: SlurmLab, job: int) -> str:
    """Return diagnostics for a failed job: imexctl's failures and slurmd errors."""
    lines = []
    for node in NODES:
        for rec in events(lab, node, job):
            if rec.get("level") in ("error", "warning") or rec.get("event") in ("prolog.done", "epilog.done"):
                lines.append(f"{node}: {json.dumps(rec)[:600]}")
        log = lab.slurmd_log(node)
        if log.exists():
            lines += [f"{node}: {ln}" for ln in log.read_text(errors="replace").splitlines()
                      if "error" in ln.lower()][-5:]
    return "\n".join(lines)


def stepchecks(lab: SlurmLab, output: str) -> Dict[str, Dict[str, Any]]:
    """Read the step checker's per-node results of the nodes that reported in an srun's output."""
    out = {}
    for line in output.splitlines():
        if "STEPCHECK " in line:
            node = line.split("STEPCHECK ", 1)[1].strip()
            found = sorted((lab.dir / "out").glob(f"step-*-{node}.json"), key=lambda p: p.stat().st_mtime)
            out[node] = json.loads(found[-1].read_text())
            found[-1].unlink()
    return out


def step_argv(lab: SlurmLab, nodes: Sequence[str], *opts: str) -> List[str]:
    """Return an srun command line running the step checker on exactly these nodes."""
    return ["srun", "-N", str(len(nodes)), "-w", ",".join(nodes), "-t", "5", "-l", "/usr/bin/python3", "-I",
            str(lab.dir / "bin" / "stepcheck.py"), str(lab.dir), *opts]


def read_steps(lab: SlurmLab, nodes: Sequence[str]) -> Optional[Dict[str, Dict[str, Any]]]:
    """Return the step checker's results once every node has written one (None before)."""
    found = {n: sorted((lab.dir / "out").glob(f"step-*-{n}.json")) for n in nodes}
    if not all(found.values()):
        return None
    return {n: json.loads(files[-1].read_text()) for n, files in found.items()}


def consume_steps(lab: SlurmLab, nodes: Sequence[str]) -> Dict[str, Dict[str, Any]]:
    """Read and remove the step checker's results of these nodes."""
    out = read_steps(lab, nodes) or {}
    for n in nodes:
        for f in (lab.dir / "out").glob(f"step-*-{n}.json"):
            f.unlink()
    return out


def srun_check(lab: SlurmLab, nodes: Sequence[str], *opts: str, user: int = UID) -> Tuple[int, Dict[str, Any]]:
    """Run the step checker on every node of a new job; return (job id, per-node results)."""
    res = lab.run(step_argv(lab, nodes, *opts), user=user, timeout=JOB_TIMEOUT, check=False)
    m = re.search(r"job (\d+)", res.stderr)
    checks = consume_steps(lab, nodes)
    job = next(iter(checks.values()))["job"] if checks else (int(m.group(1)) if m else -1)
    assert res.returncode == 0, f"srun failed ({res.returncode}):\n{res.stdout}\n{res.stderr}\n{_diag(lab, job)}"
    assert sorted(checks) == sorted(nodes), f"step ran on {sorted(checks)}:\n{res.stdout}\n{res.stderr}"
    return job, checks


def iso_time(text: str) -> float:
    """Return the epoch seconds of an ISO timestamp from imexctl's log (UTC, 'Z')."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


_TS = re.compile(r"^\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})\] (.*)$")


class SlurmdLogs:
    """Reads what the slurmds logged since a mark (SlurmdDebug=debug2, LogTimeFormat=iso8601_ms)."""

    def __init__(self, lab: SlurmLab, nodes: Sequence[str] = NODES) -> None:
        self.lab, self.nodes = lab, list(nodes)
        self.offsets = {n: lab.slurmd_log(n).stat().st_size for n in self.nodes}

    def prolog_times(self) -> Dict[str, float]:
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
                if "Processing RPC: REQUEST_LAUNCH_PROLOG" in m.group(2):
                    start = when
                elif start is not None and re.search(r"_run_subpath_command: prolog (success|failed)|prolog failed",
                                                     m.group(2)):
                    out[node] = when - start
                    start = None
        return out


# ---------------------------------------------------------------------------------------------------------
# tests


def test_four_node_job_gets_domain_and_channel_and_leaves_nodes_clean(lab: SlurmLab) -> None:
    """A 4-node job of a normal user finds its domain UP and its channel on every node, and leaves nothing."""
    srun = lab.spawn(step_argv(lab, NODES, "--hold"), user=UID)
    try:
        checks = wait_for(lambda: read_steps(lab, NODES), JOB_TIMEOUT, "the first step on every node")
        job = checks[NODES[0]]["job"]
        # while the job's first step runs: the domain is UP, seen from every tray
        for node in NODES:
            assert_domain_up(ctl_domain(lab, node, job), len(NODES), f"job {job} on {node}, during its first step")
    finally:
        consume_steps(lab, NODES)
        if "job" in locals():
            release(lab, job)
        out, err = srun.communicate(timeout=JOB_TIMEOUT)
    assert srun.returncode == 0, f"srun failed ({srun.returncode}):\n{out}\n{err}"
    minors = set()
    for node in NODES:
        done = events(lab, node, job, "prolog.done")
        assert done and done[-1].get("ok") is True, f"{node}: no successful prolog.done for job {job}: {done}"
        assert not done[-1].get("skipped"), f"{node}: the prolog skipped job {job}: {done[-1]}"
        ready = events(lab, node, job, "imex.ready")
        assert ready and ready[-1].get("status") == "domain UP", f"{node}: {ready}"
        rec = checks[node]
        assert iso_time(ready[-1]["timestamp"]) < rec["t"], f"{node}: the step started before the domain was UP"
        assert rec["host"] == node and rec["uid"] == UID
        assert len(rec["channels"]) == 1, f"{node}: channels visible to the step: {rec['channels']}"
        ch = rec["channels"][0]
        assert ch["chr"] and ch["uid"] == UID and ch["mode"] == 0o600, f"{node}: {ch}"
        assert ch["name"] == f"channel{ch['minor']}" and ch["major"] == 234, f"{node}: {ch}"
        minors.add(ch["minor"])
    assert len(minors) == 1, f"channel minors differ between nodes: {checks}"
    wait_done(lab, job)
    for node in NODES:
        assert leftovers(lab, node) == [], f"{node} not clean after job {job}"


def test_job_step_can_query_its_domain_with_nvidia_imex_ctl(lab: SlurmLab) -> None:
    """The job's first step, run by the job's user, sees its domain UP through nvidia-imex-ctl -N -j."""
    job, checks = srun_check(lab, NODES[:2], "--ctl", str(SIM_CTL))
    for node, rec in checks.items():
        ctl = rec["ctl"]
        assert ctl["rc"] == 0 and "Permission denied" not in ctl["stderr"], f"{node}: {ctl['stderr'].strip()}"
        assert_domain_up(json.loads(ctl["stdout"]), 2, f"{node} (as uid {rec['uid']}, from the job's first step)")
    wait_done(lab, job)


def test_two_jobs_side_by_side_have_independent_domains(lab: SlurmLab) -> None:
    """Two 2-node jobs get their own domains and ports, and ending one leaves the other UP."""
    a = sbatch(lab, hold_script(lab), NODES[:2])
    b = sbatch(lab, hold_script(lab), NODES[2:])
    wait_started(lab, a)
    wait_started(lab, b)
    ports = {}
    for job, nodes in ((a, NODES[:2]), (b, NODES[2:])):
        for node in nodes:
            assert_domain_up(ctl_domain(lab, node, job), 2, f"job {job} on {node}")
        ports[job] = {config_value(job_dir(lab, n, job) / "config.cfg", "SERVER_PORT") for n in nodes}
        assert len(ports[job]) == 1, f"job {job} has different SERVER_PORTs on its nodes: {ports[job]}"
    assert ports[a] != ports[b], f"both jobs use SERVER_PORT {ports[a]}"
    b_daemons = {node: sim_processes(lab, node, b) for node in NODES[2:]}
    b_channels = {node: sorted(p.name for p in channel_dir(lab, node).glob("channel*")) for node in NODES[2:]}

    release(lab, a)
    wait_done(lab, a)
    for node in NODES[:2]:
        assert leftovers(lab, node) == [], f"{node} not clean after job {a}"
    for node in NODES[2:]:
        assert sim_processes(lab, node, b) == b_daemons[node], f"{node}: job {b}'s daemon changed"
        assert sorted(p.name for p in channel_dir(lab, node).glob("channel*")) == b_channels[node]
        assert_domain_up(ctl_domain(lab, node, b), 2, f"job {b} on {node} after job {a} ended")
    assert lab.job(b)["JobState"] == "RUNNING"

    release(lab, b)
    wait_done(lab, b)
    for node in NODES:
        assert leftovers(lab, node) == [], f"{node} not clean after job {b}"


def test_prolog_failure_rolls_back_drains_requeues_and_recovers(lab: SlurmLab, capsys: pytest.CaptureFixture) -> None:
    """A daemon that never gets ready fails the prolog: rollback, drain, requeue held; after repair the job runs."""
    bad = "node2"
    lab.faults.write_text(f"@{SlurmLab.addr(bad)} never_ready\n")
    marker = lab.dir / "out" / "prolog-failure-ran"
    t0 = time.monotonic()
    job = sbatch(lab, f"touch {marker}.$SLURM_RESTART_COUNT", NODES)

    def held() -> Optional[Dict[str, str]]:
        rec = lab.job(job)
        held = rec.get("JobState") == "PENDING" and rec.get("Reason") == "launch_failed_requeued_held"
        return rec if held else None
    info = wait_for(held, PROLOG_TIMEOUT + 30, f"job {job} to be requeued and held")
    failed_after = time.monotonic() - t0
    assert info["JobState"] == "PENDING" and info.get("Restarts") == "1", info
    states = lab.node_states()
    assert states[bad]["state"].startswith("drain") and states[bad]["reason"] == "Prolog error", states
    drained = sorted(n for n, s in states.items() if s["state"].startswith("drain"))
    report(f"never_ready on {bad}: job {job} requeued+held after {failed_after:.1f}s; drained: {drained}", capsys)
    # by default ([readiness] blame_peers = no) every tray fails, so the batch script never starts
    assert not list(marker.parent.glob(marker.name + ".*")), "the batch script ran on a domain that was not UP"
    for node in sorted(set(NODES) - {bad}):
        done = wait_for(lambda: events(lab, node, job, "prolog.done"), 30, f"{node}'s prolog summary")
        assert f"not ready: {SlurmLab.addr(bad)}" in done[-1].get("reason", ""), f"{node}: {done}"
    wait_for(lambda: all(s["state"].startswith("drain") for s in lab.node_states().values()), 30, "all drained")
    drained = list(NODES)
    # the epilog runs too after a failed prolog; wait for the nodes to stop completing, then nothing may remain
    wait_for(lambda: not lab.run(["squeue", "-h", "-t", "CG"], check=False).stdout.strip(), 30, "epilogs")
    for node in NODES:
        assert leftovers(lab, node, job) == [], f"{node} not rolled back after the failed prolog"
    assert events(lab, bad, job, "prolog.rolled_back"), f"{bad}: imexctl logged no rollback for job {job}"

    lab.faults.write_text("")
    res = imexctl_admin(lab, bad, "cleanup", check=False)
    assert res.returncode == 0, f"imexctl cleanup on {bad} failed ({res.returncode}): {res.stdout}{res.stderr}"
    for node in drained:
        lab.run(["scontrol", "update", f"nodename={node}", "state=resume"])
    lab.wait_idle()
    lab.run(["scontrol", "release", str(job)])
    lab.run(["scontrol", "update", f"jobid={job}", "StartTime=now"])
    info = wait_done(lab, job)
    assert info.get("Restarts") == "1" and Path(f"{marker}.1").exists(), info
    for node in NODES:
        assert leftovers(lab, node) == [], f"{node} not clean after the recovered job {job}"


def _prolog_processes(job: int) -> List[Dict[str, Any]]:
    """Return the running `imexctl prolog` processes of a job with their environment, pgid and sid."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            if b"prolog" not in argv or not any(a.endswith(b"/imexctl") for a in argv[:2]):
                continue
            env = dict(kv.split("=", 1) for kv in
                       Path(f"/proc/{entry}/environ").read_bytes().decode(errors="replace").split("\0") if "=" in kv)
            pid = int(entry)
            rec = {"pid": pid, "env": env, "pgid": os.getpgid(pid), "sid": os.getsid(pid)}
        except (OSError, ValueError):
            continue
        if env.get("SLURM_JOB_ID") == str(job):
            out.append(rec)
    return out


def test_hooks_run_in_slurmds_environment_and_detach_the_daemon(lab: SlurmLab, capsys: pytest.CaptureFixture) -> None:
    """The prolog works with slurmd's bare environment, returns promptly, and its daemon is fully detached."""
    nodes = NODES[:2]
    lab.faults.write_text("slow_start=2\n")  # keeps the prolog running long enough to read its environment
    logs = SlurmdLogs(lab, nodes)
    job = sbatch(lab, hold_script(lab), nodes)
    seen: Dict[str, Dict[str, Any]] = {}

    def caught() -> bool:
        for rec in _prolog_processes(job):
            seen.setdefault(rec["env"].get("SLURMD_NODENAME", "?"), rec)
        return len(seen) == len(nodes) or (lab.dir / "out" / f"started-{job}").exists()
    wait_for(caught, JOB_TIMEOUT, f"the prologs of job {job}", interval=0.01)
    info = wait_started(lab, job)
    times = logs.prolog_times()
    lab.faults.write_text("")
    assert sorted(seen) == nodes, f"could not catch the running prologs: {seen}"
    env = seen[nodes[0]]["env"]
    report(f"prolog environment from slurmd 22.05 (node1): {json.dumps(env, sort_keys=True)}", capsys)
    assert "PATH" not in env, f"slurmd gave the prolog a PATH: {env.get('PATH')}"
    assert env.get("SLURM_NODELIST") == "node[1-2]" and "SLURM_JOB_NODELIST" not in env, env
    assert env.get("SLURM_JOB_UID") == str(UID) and env.get("SLURM_SCRIPT_CONTEXT") == "prolog_slurmd", env
    for node in nodes:
        prolog = seen[node]
        slurmd = lab.slurmd_pid(node)
        assert prolog["pgid"] == prolog["pid"] != os.getpgid(slurmd), f"{node}: prolog {prolog} slurmd {slurmd}"
        daemons = sim_processes(lab, node, job)
        assert len(daemons) == 1, f"{node}: daemons of job {job}: {daemons}"
        pid = daemons[0][0]
        assert os.getsid(pid) not in (os.getsid(slurmd), prolog["sid"]), f"{node}: daemon {pid} in slurmd's session"
        assert os.getpgid(pid) not in (os.getpgid(slurmd), prolog["pgid"]), f"{node}: daemon {pid} in a hook's group"
        fds = {fd: os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        pipes = {fd: t for fd, t in fds.items() if t.startswith("pipe:")}
        assert not pipes, f"{node}: daemon {pid} holds pipes (slurmd's?): {pipes}"
        assert fds.get("0") == "/dev/null", f"{node}: daemon stdin is {fds.get('0')}"
    assert sorted(times) == nodes, f"no prolog timing in slurmd's log: {times}"
    report(f"prolog with slow_start=2: {', '.join(f'{n} {t:.2f}s' for n, t in sorted(times.items()))} "
           f"(PrologEpilogTimeout={PROLOG_TIMEOUT}s)", capsys)
    assert max(times.values()) < PROLOG_TIMEOUT / 3, f"prolog took {times} (a daemon holding slurmd's pipe?)"
    assert info["JobState"] == "RUNNING"
    release(lab, job)
    wait_done(lab, job)
    for node in nodes:
        assert leftovers(lab, node) == [], f"{node} not clean after job {job}"


def test_twenty_jobs_back_to_back_leak_nothing(lab: SlurmLab, capsys: pytest.CaptureFixture) -> None:
    """Twenty jobs in a row on the same nodes all get their channel, and nothing accumulates."""
    nodes = NODES[2:]
    before = {n: slurmlab.netns_pids(SlurmLab.netns(n)) for n in nodes}
    durations, jobs = [], []
    for _ in range(20):
        t0 = time.monotonic()
        job, checks = srun_check(lab, nodes)
        durations.append(time.monotonic() - t0)
        jobs.append(job)
        for node, rec in checks.items():
            assert [c["uid"] for c in rec["channels"]] == [UID], f"job {job} on {node}: {rec['channels']}"
    for job in jobs:
        wait_done(lab, job)
    report(f"20 x srun -N2 (prolog+step+epilog): median {statistics.median(durations):.2f}s, "
           f"max {max(durations):.2f}s", capsys)
    for node in nodes:
        assert leftovers(lab, node) == [], f"{node} leaks after 20 jobs"
        wait_for(lambda: len(slurmlab.netns_pids(SlurmLab.netns(node))) <= len(before[node]), 15,
                 f"{node}: only slurmd left in the namespace")
        assert slurmlab.netns_pids(SlurmLab.netns(node)) == before[node]


def test_prolog_time_of_a_four_node_job_is_reported(lab: SlurmLab, capsys: pytest.CaptureFixture) -> None:
    """Slurm's own view of the prolog time of a 4-node job is measured and printed."""
    runs = []
    for _ in range(3):
        logs = SlurmdLogs(lab)
        t0 = time.monotonic()
        job, _checks = srun_check(lab, NODES)
        wall = time.monotonic() - t0
        times = logs.prolog_times()
        assert sorted(times) == NODES, f"no prolog timing in slurmd's log for job {job}: {times}"
        imex = {n: (events(lab, n, job, "prolog.done") or [{}])[-1] for n in NODES}
        runs.append(max(times.values()))
        report(f"4-node job {job}: slurmd prolog time per node "
               f"{', '.join(f'{n} {t * 1000:.0f}ms' for n, t in sorted(times.items()))}; srun wall {wall:.2f}s; "
               f"imexctl's own prolog.done duration_s {json.dumps({n: r.get('duration_s') for n, r in imex.items()})}",
               capsys)
        wait_done(lab, job)
    report(f"4-node prolog time (slowest node) over 3 jobs: {', '.join(f'{t * 1000:.0f}ms' for t in runs)}", capsys)
    assert max(runs) < PROLOG_TIMEOUT / 3
