"""Prolog, epilog and cleanup end to end over FakeHost, with real files under a temporary root."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any, Callable

import pytest
import structlog
from structlog.testing import capture_logs

from imexctl.config.settings import Settings
from imexctl.gpu.fabric import FabricInfo
from imexctl.hooks.prolog import prolog
from imexctl.hooks.runtime import Runtime
from imexctl.hooks.teardown import cleanup, epilog
from imexctl.platform.errors import (
    CommandError,
    DaemonError,
    DeviceError,
    DomainBusyError,
    EnvironmentError_,
    FileError,
    GpuError,
    HealthTimeout,
    ResolveError,
    UnsafeNodeError,
)
from imexctl.platform.host import TcpSocket
from tests.support.fakes import JOB_GID, FakeGpu, FakeHost, SlurmJob, domain_json, job_env


def events(logs: list[dict], level: str = "info") -> list[str]:
    return [e["event"] for e in logs if e["log_level"] == level]


def leftovers(root: Path) -> list[str]:
    """Everything a job may leave: job dirs and channel nodes."""
    found = [str(p) for p in (root / "run/imexctl/jobs").glob("*")]
    found += [str(p) for p in (root / "dev/nvidia-caps-imex-channels").glob("*")]
    return found


def live(host: FakeHost) -> list[int]:
    return [pid for pid, p in host.procs.items() if p.alive]


class TestProlog:
    def test_writes_config_starts_daemon_waits_and_creates_channel(self, rt: Any, host: FakeHost, root: Path) -> None:
        """A 2-tray prolog writes both files, spawns the daemon, waits for UP and creates the channel."""
        host.ready_after = 3
        with capture_logs() as logs:
            out = prolog(job_env(job_id=42, nodelist="gb[01-02]", node="gb01", uid=1234), rt)

        job_dir = root / "run/imexctl/jobs/42"
        assert (job_dir / "nodes_config.cfg").read_text() == "10.0.0.1\n10.0.0.2\n"
        cfg = (job_dir / "config.cfg").read_text().splitlines()
        assert "SERVER_PORT=61042" in cfg and "BIND_INTERFACE_IP=10.0.0.1" in cfg and "DAEMONIZE=0" in cfg
        assert "IMEX_CMD_BIND_INTERFACE_IP=10.0.0.1" in cfg and "IMEX_CMD_PORT=62042" in cfg
        assert "IMEX_CMD_UNIX_DOMAIN_PATH=" in cfg
        assert ("spawn", "/usr/bin/nvidia-imex", "-c", f"{job_dir}/config.cfg") in host.calls
        chan = root / "dev/nvidia-caps-imex-channels/channel43"
        assert host.mknods == [(str(chan), 234, 43, 0o600, 1234, JOB_GID)]
        assert host.slept == [0.03, 0.03]  # a twentieth of the time waited is less than poll_initial_s
        assert out.ok and (out.setup.port, out.setup.cmd_port) == (61042, 62042) and out.setup.ready
        assert json.loads((job_dir / "state.json").read_text())["cmd_port"] == 62042
        assert events(logs) == [
            "imex.nodes.resolved",
            "imex.config.written",
            "imex.daemon.started",
            "imex.ready",
            "device.channel.created",
            "prolog.done",
        ]

    def test_health_timeout_rolls_back_everything(self, rt: Any, host: FakeHost, root: Path) -> None:
        """A daemon that never gets READY fails the prolog within the deadline and leaves nothing."""
        host.ready_after = 10**6
        with pytest.raises(HealthTimeout, match="WAITING_FOR_PEERS"):
            prolog(job_env(), rt)
        assert leftovers(root) == [] and live(host) == []
        assert host.now - 1000.0 <= 5.0 + 0.5

    def test_missing_proc_devices_entry_fails_before_start(self, rt: Any, host: FakeHost, root: Path) -> None:
        """Without the IMEX entry in /proc/devices the daemon is never started and nothing is left."""
        (root / "proc/devices").write_text("Character devices:\n195 nvidia\nBlock devices:\n")
        with pytest.raises(DeviceError, match="nvidia-caps-imex-channels"):
            prolog(job_env(), rt)
        assert not any(c[0] == "spawn" for c in host.calls) and leftovers(root) == []

    def test_unresolvable_tray_is_named(self, rt: Any, host: FakeHost, root: Path) -> None:
        """A tray without an address fails the prolog with that tray's name."""
        with pytest.raises(ResolveError, match="nope"):
            prolog(job_env(nodelist="gb01,nope"), rt)
        assert leftovers(root) == [] and host.calls == []

    def test_daemon_that_dies_fails_fast(self, rt: Any, host: FakeHost, root: Path) -> None:
        """A daemon that exits during start-up fails the prolog at once, not at the deadline."""
        host.daemon_dies = True
        with pytest.raises(DaemonError, match="exited"):
            prolog(job_env(), rt)
        assert host.slept == [] and leftovers(root) == []

    def test_a_daemon_mid_exec_is_not_taken_for_dead(self, rt: Any, host: FakeHost, root: Path) -> None:
        """A daemon started through a wrapper that execs it shows no command line for a moment: a probe's scan
        that falls into it does not fail the prolog, the process the exec backend started stands for it."""
        host.spawn_exec_scans = 2
        out = prolog(job_env(), rt)
        assert out.setup.ready and len(live(host)) == 1 and host.slept == []  # no probe lost to the exec

    def test_under_systemd_a_daemon_a_scan_misses_counts_while_its_unit_runs(
        self, host: FakeHost, gpu: Any, root: Path, make_settings: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """systemd backend: the start's wait sees the daemon, the readiness wait's first scan falls into a wrapper's
        exec; the unit is active, so the probe goes on (one systemctl show), and the prolog succeeds."""
        rt = Runtime(host, gpu, make_settings(daemon={"backend": "systemd"}), __import__("structlog").get_logger())
        host.unit_exec = f"/usr/bin/nvidia-imex -c {rt.settings.paths.jobs_dir}/{{job}}/config.cfg"
        real, after_start = host.processes_with_arg, []

        def scan(arg: str, *, prefix: bool = False, uids: Any = None) -> list[Any]:
            found = real(arg, prefix=prefix, uids=uids)
            if any(c[1:2] == ("start",) for c in host.calls):
                after_start.append(len(found))
                if len(after_start) == 2:  # the first scan after the start's own: mid-exec
                    return []
            return found

        monkeypatch.setattr(host, "processes_with_arg", scan)
        out = prolog(job_env(), rt)
        assert out.setup.ready and after_start[:2] == [1, 1]
        start = next(i for i, c in enumerate(host.calls) if c[1:2] == ("start",))
        # after systemctl start: no show for the start's wait (its scan saw the daemon), one for the empty scan
        assert sum(c[1:2] == ("show",) for c in host.calls[start:]) == 1

    def test_not_ready_peer_fails_every_tray_and_is_named(self, rt: Any, host: FakeHost, root: Path) -> None:
        """By default a domain that is not UP fails this tray too, naming the peer that says it is not ready."""
        host.domain = lambda hosts: (0, domain_json(hosts, status="DEGRADED", node_status={1: "WAITING_FOR_PEERS"}))
        with pytest.raises(HealthTimeout, match=r"not ready: 10\.0\.0\.2"):
            prolog(job_env(), rt)
        assert leftovers(root) == [] and live(host) == []

    def test_timeout_reports_what_the_daemon_last_said(self, rt: Any, host: FakeHost, root: Path) -> None:
        """When the final probe gets no answer, the error still names the peer the daemon last reported."""

        def domain(hosts: list[str]) -> Any:
            if host.now > 1003.0:
                raise CommandError(("nvidia-imex-ctl",), "no answer within 0.05s")
            return 0, domain_json(hosts, status="DEGRADED", node_status={1: "WAITING_FOR_PEERS"})

        host.domain = domain
        with pytest.raises(HealthTimeout, match=r"domain DEGRADED \(then ctl -N -j: .*not ready: 10\.0\.0\.2"):
            prolog(job_env(), rt)

    def test_blamed_peer_leaves_failure_to_that_tray(
        self, host: FakeHost, gpu: Any, root: Path, make_settings: Callable[..., Any]
    ) -> None:
        """With blame_peers = yes, a live peer reporting itself not ready lets this tray exit 0."""
        rt = Runtime(host, gpu, make_settings(readiness={"blame_peers": "yes"}), __import__("structlog").get_logger())
        host.domain = lambda hosts: (0, domain_json(hosts, status="DEGRADED", node_status={1: "WAITING_FOR_PEERS"}))
        with capture_logs() as logs:
            out = prolog(job_env(), rt)
        assert out.setup.blamed == ("10.0.0.2",) and not out.setup.ready
        assert "imex.peer_blamed" in events(logs, "warning")
        assert host.now - 1000.0 < 5.0  # decided before the deadline, while the culprit still runs

    def test_unavailable_peer_is_not_blamed(self, rt: Any, host: FakeHost, root: Path) -> None:
        """An UNAVAILABLE peer may be our own network's fault: the prolog fails."""
        host.domain = lambda hosts: (0, domain_json(hosts, status="DEGRADED", node_status={1: "UNAVAILABLE"}))
        with pytest.raises(HealthTimeout):
            prolog(job_env(), rt)
        assert leftovers(root) == []

    def test_other_jobs_domain_is_refused_and_untouched(self, rt: Any, host: FakeHost, root: Path) -> None:
        """A prolog on a node whose domain belongs to another job fails without touching it."""
        prolog(job_env(job_id=7), rt)
        before = leftovers(root)
        with pytest.raises(DomainBusyError, match="job 7"):
            prolog(job_env(job_id=8), rt)
        assert leftovers(root) == before and len(live(host)) == 1

    def test_port_in_use_is_refused(self, rt: Any, host: FakeHost, root: Path) -> None:
        """A stale IMEX daemon on the job's SERVER_PORT fails the prolog before starting a daemon (a holder that is
        no daemon: tests/hooks/test_portholder.py)."""
        host.ports_in_use.add(("10.0.0.1", 61042))
        stale = host.add_process(["/usr/bin/nvidia-imex", "-c", "/etc/nvidia-imex/config.cfg"])
        host.sockets = [TcpSocket("10.0.0.1", 61042, "LISTEN", 0, 1, stale)]
        with pytest.raises(DomainBusyError, match="SERVER_PORT 10.0.0.1:61042 is held by an IMEX daemon"):
            prolog(job_env(job_id=42), rt)
        assert leftovers(root) == [] and not any(c[0] == "spawn" for c in host.calls)

    def test_command_port_in_use_is_refused(self, rt: Any, host: FakeHost, root: Path) -> None:
        """A stale daemon's listener on the job's IMEX_CMD_PORT (on the tray's address) is refused the same way."""
        host.ports_in_use.add(("10.0.0.1", 62042))
        stale = host.add_process(["/usr/bin/nvidia-imex", "-c", "/etc/nvidia-imex/config.cfg"])
        host.sockets = [TcpSocket("0.0.0.0", 62042, "LISTEN", 0, 1, stale)]
        with pytest.raises(DomainBusyError, match="IMEX_CMD_PORT 10.0.0.1:62042 is held by an IMEX daemon"):
            prolog(job_env(job_id=42), rt)
        assert leftovers(root) == [] and not any(c[0] == "spawn" for c in host.calls)

    @pytest.mark.parametrize(("count", "ok"), [(44, True), (43, False), (8, False)])
    def test_channel_minor_checked_against_the_driver(
        self, rt: Any, host: FakeHost, root: Path, count: int, ok: bool
    ) -> None:
        """Job 42's minor 43 must lie below the driver's NVreg_ImexChannelCount: a clear error, before any
        daemon starts or file is written, not a failed mknod."""
        params = root / "proc/driver/nvidia/params"
        params.parent.mkdir(parents=True)
        params.write_text(f"ResmanDebugLevel: 4294967295\nImexChannelCount: {count}\nCreateImexChannel0: 0\n")
        if ok:
            assert prolog(job_env(job_id=42), rt).setup.channel.endswith("channel43")
            return
        with pytest.raises(DeviceError, match=rf"minor 43 is out of range.*NVreg_ImexChannelCount={count}"):
            prolog(job_env(job_id=42), rt)
        assert leftovers(root) == [] and host.calls == []

    def test_ctl_address_ip_queries_the_trays_endpoint(
        self, host: FakeHost, gpu: Any, root: Path, make_settings: Callable[..., Any]
    ) -> None:
        """[readiness] ctl_address = ip: -q goes to -i <tray address> <command port>; -N keeps -c."""
        rt = Runtime(host, gpu, make_settings(readiness={"ctl_address": "ip"}), __import__("structlog").get_logger())
        prolog(job_env(job_id=42), rt)
        ctl = [c for c in host.calls if c[0].endswith("nvidia-imex-ctl")]
        assert ctl[0] == ("/usr/bin/nvidia-imex-ctl", "-i", "10.0.0.1", "62042", "-q")
        assert ctl[-1][1] == "-c" and ctl[-1][-2:] == ("-N", "-j")

    def test_policy_gate_skips_without_touching_anything(
        self, host: FakeHost, gpu: Any, root: Path, make_settings: Callable[..., Any]
    ) -> None:
        """A job outside the configured partitions exits 0 and touches nothing."""
        rt = Runtime(
            host,
            gpu,
            make_settings(policy={"jobs": "partitions", "partitions": "nvl72"}),
            __import__("structlog").get_logger(),
        )
        with capture_logs() as logs:
            out = prolog(job_env(SLURM_JOB_PARTITION="cpu"), rt)
        assert "cpu" in out.skipped and host.calls == [] and gpu.calls == 0
        assert events(logs) == ["imex.skipped", "prolog.done"]

    def test_unregistered_fabric_fails(self, rt: Any, gpu: Any, host: FakeHost) -> None:
        """A GPU whose NVLink fabric is still registering fails the prolog before any change."""
        gpu.infos = [FabricInfo(0, b"\x11" * 16, 7, 2, 0)]
        with pytest.raises(GpuError, match="not attached"):
            prolog(job_env(), rt)
        assert host.calls == []

    def test_unwritable_job_directory_is_a_clear_error(self, rt: Any, host: FakeHost, root: Path) -> None:
        """A symlink where the jobs directory belongs fails the prolog with file_failed, before any daemon."""
        (root / "run/imexctl").mkdir(parents=True)
        (root / "elsewhere").mkdir()
        (root / "run/imexctl/jobs").symlink_to(root / "elsewhere")
        with pytest.raises(FileError, match="jobs"):
            prolog(job_env(), rt)
        assert list((root / "elsewhere").iterdir()) == [] and not any(c[0] == "spawn" for c in host.calls)

    def test_bad_environment_is_named(self, rt: Any) -> None:
        """A job id that is not a number is reported with its variable name."""
        with pytest.raises(EnvironmentError_, match="SLURM_JOB_ID"):
            prolog(job_env(SLURM_JOB_ID="4x2"), rt)


class TestEpilog:
    def test_removes_everything_and_is_idempotent(self, rt: Any, real_nodes: FakeHost, root: Path) -> None:
        """The epilog stops the daemon, removes channel and files, and a second run is a no-op."""
        host = real_nodes
        prolog(job_env(job_id=42), rt)
        out = epilog(job_env(job_id=42), rt)
        assert leftovers(root) == [] and live(host) == []
        assert any("channel" in a for a in out.fields()["actions"])
        assert epilog(job_env(job_id=42), rt).fields()["actions"] == []

    def test_never_touches_another_job(self, rt: Any, host: FakeHost, root: Path) -> None:
        """The epilog of a job that never ran here leaves the owner's domain alone."""
        prolog(job_env(job_id=7), rt)
        before = leftovers(root)
        assert epilog(job_env(job_id=8), rt).fields()["actions"] == []
        assert leftovers(root) == before and len(live(host)) == 1

    def test_sigkill_after_grace(self, rt: Any, host: FakeHost, root: Path) -> None:
        """A daemon ignoring SIGTERM is killed after the grace period."""
        host.daemon_ignores_sigterm = True
        prolog(job_env(job_id=42), rt)
        epilog(job_env(job_id=42), rt)
        assert [s for _, s in host.signals][-1] == signal.SIGKILL and live(host) == []

    def test_unkillable_daemon_fails_the_epilog(self, rt: Any, host: FakeHost, root: Path) -> None:
        """A daemon that survives SIGKILL makes the epilog fail (the node is unsafe)."""
        host.daemon_ignores_sigterm = host.daemon_unkillable = True
        prolog(job_env(job_id=42), rt)
        with pytest.raises(UnsafeNodeError, match="survives"):
            epilog(job_env(job_id=42), rt)

    def test_the_daemon_stops_only_once_the_jobs_driver_clients_are_gone(
        self, rt: Any, host: FakeHost, root: Path
    ) -> None:
        """A process of the job's user that still holds the NVIDIA driver (stuck ending its CUDA context): the epilog
        waits until it is gone, then stops the daemon (SIGTERM after the last look); no busy stop is reported."""
        prolog(job_env(job_id=42), rt)
        (daemon_pid,) = live(host)
        cuda = host.add_process(["/home/alice/train"], uid=1000, driver=True, scans_left=3)
        with capture_logs() as logs:
            out = epilog(job_env(job_id=42), rt)
        scans = [i for i, c in enumerate(host.calls) if c[0] == "driver_clients"]
        assert len(scans) == 4 and host.calls[scans[0]] == ("driver_clients", "1000")  # 3 saw it, the 4th did not
        assert not host.is_alive(cuda) and live(host) == []
        assert host.signals[0] == (daemon_pid, signal.SIGTERM)  # the stop came after the process was gone
        assert host.slept[:3] == [0.05, 0.1, 0.2]
        assert "busy_stop" not in out.fields() and not [e for e in logs if e["event"] == "imex.daemon.stop_busy"]

    def test_the_daemon_is_stopped_after_the_bound_and_the_stop_is_reported(
        self, make_settings: Any, host: FakeHost, gpu: Any, root: Path
    ) -> None:
        """A driver client that never ends: the epilog waits [daemon] process_wait_s, stops the daemon all the
        same, warns (imex.daemon.stop_busy) and lists it in epilog.done; only the job user's driver clients count."""
        rt = Runtime(host, gpu, make_settings(daemon={"process_wait_s": 3}), structlog.get_logger())
        prolog(job_env(job_id=42), rt)
        stuck = host.add_process(["/home/alice/train"], uid=1000, driver=True)
        host.add_process(["/usr/bin/dcgm"], uid=0, driver=True)  # root's, as the daemon itself
        host.add_process(["/home/bob/train"], uid=2000, driver=True)  # another user's
        host.add_process(["-bash"], uid=1000)  # the job's user, without the driver
        t0 = host.monotonic()
        with capture_logs() as logs:
            out = epilog(job_env(job_id=42), rt).fields()
        (busy,) = [e for e in logs if e["event"] == "imex.daemon.stop_busy"]
        assert (busy["log_level"], busy["domain_job_id"], busy["uid"], busy["pids"]) == (
            "warning",
            42,
            1000,
            [stuck.pid],
        )
        assert 3.0 <= busy["waited_s"] <= 3.1 and 3.0 <= host.monotonic() - t0 < 3.2
        why = (
            f"the IMEX daemon of job 42 is stopped while pid {stuck.pid} of uid 1000 still hold the NVIDIA driver "
            f"(after {busy['waited_s']:.1f}s of [daemon] process_wait_s)"
        )
        assert out["busy_stop"] == [why]
        assert out["ok"] and any(a.startswith("stop daemon of job 42") for a in out["actions"])
        assert host.is_alive(stuck)  # imexctl ends no process of the user's

    @pytest.mark.parametrize("how", ["root-job", "daemon-gone", "channel-only"])
    def test_no_wait_without_a_daemon_of_a_users_job(
        self, make_settings: Any, host: FakeHost, gpu: Any, root: Path, how: str
    ) -> None:
        """No wait and no busy stop: a job of root's (root's own daemons hold the driver), a domain whose daemon
        is already gone (the driver has dealt with its clients), a tray with a channel and no daemon."""
        policy = {"single_tray": "channel"} if how == "channel-only" else {}
        rt = Runtime(host, gpu, make_settings(policy=policy), structlog.get_logger())
        uid = 0 if how == "root-job" else 1000
        env = job_env(job_id=42, uid=uid, nodelist="gb01" if how == "channel-only" else "gb[01-02]")
        prolog(env, rt)
        if how == "daemon-gone":
            for p in host.procs.values():
                p.alive = False
        host.add_process(["/home/alice/train"], uid=uid, driver=True)
        out = epilog(env, rt).fields()
        assert "busy_stop" not in out and not [c for c in host.calls if c[0] == "driver_clients"]

    def test_a_lost_state_still_finds_the_jobs_channel_by_its_uid(
        self, rt: Any, real_nodes: FakeHost, root: Path
    ) -> None:
        """state.json unreadable: the channel's number names no job (design.md "The channel rule"), so the
        epilog takes the one node of the job's uid that no other job's state claims; another job's claimed node
        of the same uid, and another uid's node, stay."""
        prolog(job_env(job_id=42), rt)
        jobs, chans = root / "run/imexctl/jobs", root / "dev/nvidia-caps-imex-channels"
        state = json.loads((jobs / "42/state.json").read_text())
        (jobs / "7").mkdir()
        other = {**state, "job_id": 7, "channel_minor": 50, "channel_path": str(chans / "channel50")}
        (jobs / "7/state.json").write_text(json.dumps(other))
        for minor, uid in ((50, 1000), (60, 2000)):
            real_nodes.mknod_char(chans / f"channel{minor}", 234, minor, mode=0o600, uid=uid, gid=uid)
        (jobs / "42/state.json").write_text('{"job_id": 4')
        actions = epilog(job_env(job_id=42), rt).fields()["actions"]
        assert f"remove channel {chans / 'channel43'}" in actions, actions
        assert sorted(p.name for p in chans.iterdir()) == ["channel50", "channel60"]
        assert not (jobs / "42").exists()

    def test_a_lost_state_with_two_candidates_takes_none(self, rt: Any, real_nodes: FakeHost, root: Path) -> None:
        """Two unclaimed nodes of the job's uid: which is the job's cannot be told; both stay for cleanup."""
        prolog(job_env(job_id=42), rt)
        chans = root / "dev/nvidia-caps-imex-channels"
        real_nodes.mknod_char(chans / "channel9", 234, 9, mode=0o600, uid=1000, gid=1000)
        (root / "run/imexctl/jobs/42/state.json").write_text("")
        actions = epilog(job_env(job_id=42), rt).fields()["actions"]
        assert not [a for a in actions if "channel" in a] and sorted(p.name for p in chans.iterdir()) == [
            "channel43",
            "channel9",
        ]
        assert sorted(cleanup(rt).data()["actions"]) == [
            f"remove stray channel {chans / c}" for c in ("channel43", "channel9")
        ]


class Killed(BaseException):
    """SIGKILL, simulated at a step boundary."""


def epilog_killed(rt: Any, job_id: int) -> None:
    """Set a job up, then kill its epilog right after it took the node lock (the job has ended)."""
    prolog(job_env(job_id=job_id), rt)

    def kill(step: str) -> None:
        if step == "locked":
            raise Killed(step)

    with pytest.raises(Killed):
        epilog(job_env(job_id=job_id), rt._replace(on_step=kill))


class TestCleanup:
    @pytest.mark.parametrize("dry_run", [False, True], ids=["cleanup", "dry-run"])
    def test_no_stray_channel_goes_while_a_running_jobs_state_cannot_be_read(
        self, rt: Any, real_nodes: FakeHost, root: Path, dry_run: bool
    ) -> None:
        """Job 2089 runs here and its state.json cannot be read: it may claim any channel but channel0 (its own
        channel43 among them), as the epilog's channel rule holds.  cleanup removes no stray channel then, and
        says so under skipped, naming the job; once its state reads again, only the stray goes.  A gone job's
        unreadable state holds nothing back: cleanup tears that job down first."""
        prolog(job_env(job_id=2089), rt)
        real_nodes.running_jobs.add(2089)
        chans, state = root / "dev/nvidia-caps-imex-channels", rt.settings.paths.job(2089).state
        real_nodes.mknod_char(chans / "channel9", 234, 9, mode=0o600, uid=2000, gid=2000)
        good = state.read_text()
        state.write_text('{"job_id": 20')
        report = cleanup(rt, dry_run=dry_run).data()
        assert report["actions"] == [] and report["errors"] == [], report
        assert report["skipped"] == [
            "job 2089 still runs on this node (use --force)",
            "no stray channel removed (channel9, channel43): the state of job 2089 cannot be read, and it may claim any",
        ], report
        assert sorted(p.name for p in chans.iterdir()) == ["channel43", "channel9"]
        state.write_text(good)
        (root / "run/imexctl/jobs/77").mkdir()
        (root / "run/imexctl/jobs/77/state.json").write_text("")
        report = cleanup(rt, dry_run=dry_run).data()
        would = "would remove" if dry_run else "remove"
        assert report["actions"] == [
            f"{'would stop' if dry_run else 'stop'} daemon of job 77",  # without a state, through the backend
            f"{would} {root / 'run/imexctl/jobs/77'}",
            f"{would} stray channel {chans / 'channel9'}",
        ], report
        assert sorted(p.name for p in chans.iterdir()) == ["channel43", *(["channel9"] if dry_run else [])]

    def test_set_up_job_without_a_step_counts_as_running(self, rt: Any, host: FakeHost, root: Path) -> None:
        """No slurmstepd, no cgroup, but a set-up domain and no epilog yet: cleanup leaves it, --force removes it."""
        prolog(job_env(job_id=42), rt)
        before = leftovers(root)
        for report in (cleanup(rt), cleanup(rt, job_id=42), cleanup(rt, dry_run=True)):
            assert report.data()["actions"] == [] and report.data()["errors"] == []
            assert report.data()["skipped"] == [
                (
                    "job 42 may still run on this node: its domain is set up and its epilog has not run here, and "
                    "a job has no slurmstepd or cgroup on a node before its first step there (use --force)"
                )
            ]
        assert leftovers(root) == before and len(live(host)) == 1
        cleanup(rt, force=True)
        assert leftovers(root) == [] and live(host) == []

    def test_job_whose_epilog_ran_is_torn_down(self, rt: Any, host: FakeHost, root: Path) -> None:
        """The epilog marks the job ended as soon as it holds the lock: cleanup finishes what it began."""
        epilog_killed(rt, 42)
        assert json.loads((root / "run/imexctl/jobs/42/state.json").read_text())["ended"] > 0
        assert live(host) and leftovers(root)
        report = cleanup(rt)
        assert (
            report.data()["skipped"] == [] and report.data()["actions"] and leftovers(root) == [] and live(host) == []
        )

    def test_set_up_job_whose_daemon_died_is_torn_down(self, rt: Any, host: FakeHost, root: Path) -> None:
        """A set-up domain whose daemon is gone is no domain to protect: cleanup removes the rest."""
        prolog(job_env(job_id=42), rt)
        for proc in host.procs.values():
            proc.alive = False
        report = cleanup(rt)
        assert report.data()["skipped"] == [] and report.data()["actions"] and leftovers(root) == []

    def test_skips_running_jobs_unless_forced(self, rt: Any, host: FakeHost, root: Path) -> None:
        """Cleanup leaves a job that still runs here, and removes it with --force."""
        prolog(job_env(job_id=42), rt)
        host.running_jobs.add(42)
        assert cleanup(rt).data()["skipped"] and leftovers(root)
        cleanup(rt, force=True)
        assert leftovers(root) == [] and live(host) == []

    def test_dry_run_names_one_item_per_object_and_the_run_does_exactly_those(
        self, rt: Any, real_nodes: FakeHost, root: Path
    ) -> None:
        """Daemon, channel, directory: one item each, the dry run's ``would`` list is what cleanup then does."""
        epilog_killed(rt, 42)
        jd, chan = root / "run/imexctl/jobs/42", root / "dev/nvidia-caps-imex-channels/channel43"
        named = ["stop daemon of job 42", f"remove channel {chan}", f"remove {jd}"]
        assert cleanup(rt, dry_run=True).data()["actions"] == [f"would {a}" for a in named]
        assert cleanup(rt).data()["actions"] == named and leftovers(root) == [] and live(real_nodes) == []

    def test_a_stop_that_needed_sigkill_is_one_item_saying_so(self, rt: Any, host: FakeHost, root: Path) -> None:
        """A daemon that ignores SIGTERM: still one daemon item, its detail names the SIGKILL."""
        host.daemon_ignores_sigterm = True
        epilog_killed(rt, 42)
        (pid,) = live(host)
        assert cleanup(rt).data()["actions"][0] == f"stop daemon of job 42 (SIGKILL to pid {pid})"

    def test_dry_run_names_no_channel_that_is_not_there(self, rt: Any, host: FakeHost, root: Path) -> None:
        """The state names a channel that was never made (or is gone): neither run lists it."""
        host.real_nodes = False  # the channel is never made
        epilog_killed(rt, 42)
        assert json.loads((root / "run/imexctl/jobs/42/state.json").read_text())["channel_minor"] == 43
        for dry in (True, False):
            assert not any("channel" in a for a in cleanup(rt, dry_run=dry).data()["actions"])

    def test_dry_run_names_a_stateless_jobs_channel_once(self, rt: Any, real_nodes: FakeHost, root: Path) -> None:
        """A job directory without state.json and the job's channel: its number names no job, so cleanup (which
        knows no job's uid) removes it once, as a stray, and the dry run says exactly that."""
        epilog_killed(rt, 42)
        (root / "run/imexctl/jobs/42/state.json").unlink()
        chan = root / "dev/nvidia-caps-imex-channels/channel43"
        dry = cleanup(rt, dry_run=True).data()["actions"]
        assert [a for a in dry if "channel" in a] == [f"would remove stray channel {chan}"]
        assert cleanup(rt).data()["actions"] == [a.removeprefix("would ") for a in dry] and leftovers(root) == []

    def test_dry_run_changes_nothing(self, rt: Any, host: FakeHost, root: Path) -> None:
        """A dry run reports the teardown of a dead job and performs none of it."""
        epilog_killed(rt, 42)
        before = leftovers(root)
        report = cleanup(rt, dry_run=True)
        assert report.data()["actions"] and all(a.startswith("would ") for a in report.data()["actions"])
        assert leftovers(root) == before and len(live(host)) == 1


class TestChannelOfAnEndingDomain:
    """A new domain whose first tray is an old domain's, while the old one's epilog still runs on another of its trays
    (slurmctld returns a COMPLETING job's trays one by one): the same position, and with job ids alike modulo T the
    same number. slurm.conf lists gb[01-04] (the clique, no topology source) and channel_count = 5: T = 1, so jobs 7
    on gb[01-02] and 8 on gb[01,03] both get channel 1 (design.md "The channel rule")."""

    CONF = "ClusterName=x\nNodeName=gb[01-04]\n"

    def _rt(self, host: FakeHost, make_settings: Callable[..., Settings], channel_count: int = 5) -> Runtime:
        settings = make_settings(policy={"channel_count": channel_count})
        return Runtime(host, FakeGpu(), settings, structlog.get_logger())

    def _old_job_ended_here(self, rt: Runtime, root: Path) -> str:
        """Job 7 set up on gb01 and torn down by its epilog there; returns the slurm.conf path."""
        conf = root / "slurm.conf"
        conf.write_text(self.CONF)
        env = job_env(job_id=7, nodelist="gb[01-02]", SLURM_CONF=str(conf))
        assert prolog(env, rt).setup.channel.endswith("/channel1")
        epilog(env, rt)
        assert leftovers(root) == []
        return str(conf)

    def _new_job(self, conf: str) -> dict[str, str]:
        return job_env(job_id=8, nodelist="gb[01,03]", SLURM_CONF=conf)

    @staticmethod
    def _slurmctld_later(host: FakeHost, at: float, job: SlurmJob) -> None:
        """From host time ``at`` on, slurmctld's record of ``job.job_id`` is ``job`` (the epilog elsewhere ended)."""
        sleep = host.sleep

        def later(seconds: float) -> None:
            sleep(seconds)
            if host.now >= at:
                host.slurm_jobs[job.job_id] = job

        host.sleep = later  # type: ignore[method-assign]

    def test_waits_while_slurmctld_says_the_old_domain_still_completes_elsewhere(
        self, host: FakeHost, make_settings: Callable[..., Settings], root: Path
    ) -> None:
        """slurmctld lists job 7 COMPLETING on gb02 for 3 s: the prolog waits, asking, and starts its daemon only
        once slurmctld says job 7 holds gb02 no more."""
        rt = self._rt(host, make_settings)
        conf = self._old_job_ended_here(rt, root)
        host.slurm_jobs[7] = SlurmJob(7, "COMPLETING", "gb02")
        self._slurmctld_later(host, host.now + 3, SlurmJob(7, "COMPLETED", "gb[01-02]"))
        with capture_logs() as logs:
            out = prolog(self._new_job(conf), rt)
        assert out.ok and out.setup.channel.endswith("/channel1")
        (waited,) = [e for e in logs if e["event"] == "imex.channel.waited"]
        assert (waited["channel"], waited["old_job_id"], waited["trays"]) == (1, 7, "gb02")
        assert 3 <= waited["waited_s"] < 5 and "slurmctld says job 7 is COMPLETED" in waited["how"]
        questions = [i for i, c in enumerate(host.calls) if c[0].endswith("squeue")]
        (spawn,) = [i for i, c in enumerate(host.calls) if c[0] == "spawn" and "/jobs/8/" in c[-1]]
        assert len(questions) >= 3 and all(c[5] == "--jobs=7" for c in (host.calls[i] for i in questions))
        assert max(questions) < spawn, "the daemon started before the old domain was gone"

    @pytest.mark.parametrize(
        "record",
        [SlurmJob(7, "COMPLETED", "gb[01-02]"), SlurmJob(7, "COMPLETING", "gb04"), SlurmJob(7, "PENDING", "")],
        ids=["completed", "completing-elsewhere", "requeued"],
    )
    def test_goes_on_when_slurmctld_says_the_old_domain_is_gone(
        self, host: FakeHost, make_settings: Callable[..., Settings], root: Path, record: SlurmJob
    ) -> None:
        """slurmctld says job 7 holds gb02 no more: one question, no wait."""
        rt = self._rt(host, make_settings)
        conf = self._old_job_ended_here(rt, root)
        host.slurm_jobs[7] = record
        with capture_logs() as logs:
            assert prolog(self._new_job(conf), rt).ok
        (waited,) = [e for e in logs if e["event"] == "imex.channel.waited"]
        assert waited["waited_s"] == 0 and "slurmctld says job 7" in waited["how"]
        assert [c[5] for c in host.calls if c[0].endswith("squeue")] == ["--jobs=7"]

    def test_without_an_answer_waits_out_the_bound(
        self, host: FakeHost, make_settings: Callable[..., Settings], root: Path
    ) -> None:
        """slurmctld does not answer: the prolog waits until the old domain's epilogs must have ended everywhere
        (its epilog's deadline here plus the clock slack), then goes on."""
        from imexctl.hooks import remnants

        rt = self._rt(host, make_settings)
        conf = self._old_job_ended_here(rt, root)
        (old,) = remnants.load(rt)
        host.now += old.until - rt.host.time() - 2.5  # 2.5 s before the bound
        host.squeue_down_for = 100
        with capture_logs() as logs:
            assert prolog(self._new_job(conf), rt).ok
        (waited,) = [e for e in logs if e["event"] == "imex.channel.waited"]
        assert 2.5 <= waited["waited_s"] < 4 and "did not answer" in waited["how"]
        assert rt.host.time() >= old.until

    def test_the_deadline_first_fails_naming_the_old_job_and_its_trays(
        self, host: FakeHost, make_settings: Callable[..., Settings], root: Path
    ) -> None:
        """Job 7 stays COMPLETING on gb02 past the readiness deadline: the prolog fails (domain_busy) naming job 7,
        gb02 and the channel, with nothing started and nothing left."""
        rt = self._rt(host, make_settings)
        conf = self._old_job_ended_here(rt, root)
        host.slurm_jobs[7] = SlurmJob(7, "COMPLETING", "gb02")
        with pytest.raises(DomainBusyError) as info:
            prolog(self._new_job(conf), rt)
        why = str(info.value)
        assert "channel 1" in why and "job 7's IMEX domain on gb02" in why and "COMPLETING on gb02" in why
        assert not [c for c in host.calls if c[0] == "spawn" and "/jobs/8/" in c[-1]] and leftovers(root) == []

    def test_a_new_domain_on_the_old_trays_waits_for_nothing(
        self, host: FakeHost, make_settings: Callable[..., Settings], root: Path
    ) -> None:
        """The next job on the very trays of the old domain: its trays were given to the new job, so the old domain
        has ended on all of them: nothing asked, nothing waited for (the common case)."""
        rt = self._rt(host, make_settings)
        conf = self._old_job_ended_here(rt, root)
        host.slurm_jobs[7] = SlurmJob(7, "COMPLETING", "gb02")  # would hold the prolog, were it asked
        with capture_logs() as logs:
            assert prolog(job_env(job_id=8, nodelist="gb[01-02]", SLURM_CONF=conf), rt).ok
        assert not [e for e in logs if e["event"] == "imex.channel.waited"]
        assert not [c for c in host.calls if c[0].endswith("squeue")]

    def test_another_number_waits_for_nothing(
        self, host: FakeHost, make_settings: Callable[..., Settings], root: Path
    ) -> None:
        """channel_count 9: T = 2, job 8's number (5) is not job 7's (1): no question, no wait."""
        rt = self._rt(host, make_settings, channel_count=9)
        conf = root / "slurm.conf"
        conf.write_text(self.CONF)
        env = job_env(job_id=7, nodelist="gb[01-02]", SLURM_CONF=str(conf))
        assert prolog(env, rt).setup.channel.endswith("/channel5")  # 1 + 0 + 4 * (7 % 2)
        epilog(env, rt)
        host.slurm_jobs[7] = SlurmJob(7, "COMPLETING", "gb02")
        out = prolog(self._new_job(str(conf)), rt)
        assert out.setup.channel.endswith("/channel1") and not [c for c in host.calls if c[0].endswith("squeue")]
