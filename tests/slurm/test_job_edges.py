"""Jobs that Slurm ends, splits or restarts, over FakeHost: the hook timeout from slurm.conf,
SIGTERM, a job cancelled while its prolog waits, het jobs and one-tray jobs."""

from __future__ import annotations

import dataclasses
import os
import signal
from pathlib import Path
from typing import Any, Callable

import pytest
import structlog
from structlog.testing import capture_logs

from imexctl.config.settings import Settings
from imexctl.hooks.prolog import prolog
from imexctl.hooks.runtime import Runtime
from imexctl.hooks.teardown import epilog
from imexctl.platform.errors import ConfigError, DomainBusyError, HealthTimeout, SlurmQueryError, Terminated
from tests.support.fakes import FakeGpu, FakeHost, SlurmJob, domain_json, job_env


def leftovers(root: Path) -> list[str]:
    return [str(p) for p in (root / "run/imexctl/jobs").glob("*")] + [
        str(p) for p in (root / "dev/nvidia-caps-imex-channels").glob("*")
    ]


def slurm_conf(root: Path, text: str) -> str:
    """slurm.conf with ``text``; it lists the trays gb[01-04] (the channel's clique) unless ``text`` has node lines."""
    path = root / "slurm.conf"
    path.write_text(text if "NodeName=" in text else text + "NodeName=gb[01-04]\n")
    return str(path)


def asked(host: FakeHost) -> list[tuple[str, ...]]:
    """The questions the prolog put to slurmctld about jobs (squeue; a drain by scontrol update is no question)."""
    return [c for c in host.calls if c[0].endswith("squeue")]


def question(job_id: int) -> tuple[str, ...]:
    """The one squeue command line imexctl runs about a job."""
    spec = "JobId:0|,State:0|,NodeList:0|,OverSubscribe:0|,StartTime:0|,RestartCnt:0|,HetJobId:0|,HetJobOffset:0|"
    return ("/usr/bin/squeue", "--noheader", "--all", "--local", "--states=all", f"--jobs={job_id}", f"--Format={spec}")


def runtime(host: FakeHost, make_settings: Callable[..., Settings], **sections: dict[str, Any]) -> Runtime:
    return Runtime(host, FakeGpu(), make_settings(**sections), structlog.get_logger())


class TestDeadlineFromSlurmConf:
    def test_capped_below_the_hook_timeout(self, host: FakeHost, make_settings: Callable[..., Settings],
                                           root: Path) -> None:  # fmt: skip
        """deadline_s 60 with PrologEpilogTimeout=30 and a 10 s margin: the prolog gives up after 20 s."""
        host.ready_after = 10**6
        rt = runtime(host, make_settings, readiness={"deadline_s": 60})
        env = job_env(SLURM_CONF=slurm_conf(root, "ClusterName=x\nPrologEpilogTimeout=30\n"))
        with capture_logs() as logs, pytest.raises(HealthTimeout):
            prolog(env, rt)
        assert 1000.0 + 19.5 <= host.now <= 1000.0 + 20.5
        (capped,) = [e for e in logs if e["event"] == "prolog.deadline"]
        assert (capped["deadline_s"], capped["configured_s"], capped["hook_timeout"]) == (
            20, 60, "PrologEpilogTimeout=30s")  # fmt: skip

    @pytest.mark.parametrize(
        ("text", "cap", "deadline"),
        [
            pytest.param("PrologTimeout=90\nPrologEpilogTimeout=12\n", "yes", 8, id="prolog-timeout-wins"),
            pytest.param("PrologEpilogTimeout=12\n", "yes", 6, id="half-when-margin-too-big"),
            pytest.param("PrologEpilogTimeout=12\n", "no", 8, id="cap-off"),
            pytest.param("ClusterName=x\n", "yes", 8, id="no-timeout"),
        ],
    )
    def test_which_deadline_holds(self, host: FakeHost, make_settings: Callable[..., Settings], root: Path,
                                  text: str, cap: str, deadline: float) -> None:  # fmt: skip
        """The effective deadline: min(deadline_s, max(T/2, T - margin)), or deadline_s unchanged."""
        host.ready_after = 10**6
        rt = runtime(host, make_settings, readiness={"deadline_s": 8}, slurm={"cap_deadline": cap})
        with pytest.raises(HealthTimeout):
            prolog(job_env(SLURM_CONF=slurm_conf(root, text)), rt)
        assert deadline - 0.5 <= host.now - 1000.0 <= deadline + 0.5

    def test_unreadable_slurm_conf_is_a_warning(self, host: FakeHost, make_settings: Callable[..., Settings],
                                                root: Path) -> None:  # fmt: skip
        """A slurm.conf that cannot be read leaves the deadline as configured and says why (without a channel: one
        would have no place, TestChannelWithoutTopology)."""
        rt = runtime(host, make_settings, policy={"channels": "none"})
        with capture_logs() as logs:
            assert prolog(job_env(SLURM_CONF=str(root / "missing.conf")), rt).ok
        (warning,) = [e for e in logs if e["event"] == "prolog.deadline"]
        assert warning["log_level"] == "warning" and "missing.conf" in warning["problem"]


class TestCancelledWhileWaiting:
    def _never_ready(self, host: FakeHost, make_settings: Callable[..., Settings], root: Path,
                     **sections: dict[str, Any]) -> tuple[Runtime, dict[str, str]]:  # fmt: skip
        """This tray's daemon is READY; its peer went away (its epilog stopped it): the domain never comes UP."""
        host.domain = lambda hosts: (0, domain_json(hosts, status="DEGRADED", node_status={1: "UNAVAILABLE"},
                                                    conn_status="INVALID"))  # fmt: skip
        rt = runtime(host, make_settings, readiness={"deadline_s": 3}, **sections)
        # Slurm 23.02+: the environment says the job owns its trays, so slurmctld is asked only about its end
        return rt, job_env(job_id=42, SLURM_CONF=slurm_conf(root, "ClusterName=x\n"), SLURM_JOB_OVERSUBSCRIBE="NO")

    @pytest.mark.parametrize("state", ["CANCELLED", "COMPLETING", "COMPLETED", "TIMEOUT", "PENDING", "REQUEUED"])
    def test_ended_job_rolls_back_and_exits_0(self, host: FakeHost, make_settings: Callable[..., Settings],
                                              root: Path, state: str) -> None:  # fmt: skip
        """slurmctld says the job ended: everything is undone, prolog.done is ok with job_ended, no raise."""
        rt, env = self._never_ready(host, make_settings, root)
        host.slurm_jobs[42] = SlurmJob(42, state, "gb[01-02]")
        with capture_logs() as logs:
            out = prolog(env, rt)
        assert out.ok and out.job_ended == state and leftovers(root) == []
        assert asked(host) == [question(42)]
        want_env = {"SLURM_CONF": env["SLURM_CONF"], "SLURM_TIME_FORMAT": "%s"}
        assert [e for e in host.envs if e[0] == question(42)] == [(question(42), want_env)]
        assert [e["event"] for e in logs if e["event"].startswith("prolog.")][-2:] == ["prolog.job_ended",
                                                                                      "prolog.done"]  # fmt: skip

    @pytest.mark.parametrize(
        "answer",
        [
            pytest.param(SlurmJob(42, "RUNNING", "gb[01-02]"), id="still-running"),
            pytest.param(SlurmJob(42, "CONFIGURING", "gb[01-02]"), id="configuring"),
            pytest.param(SlurmJob(41, "CANCELLED", "gb[01-02]"), id="another-job"),
            pytest.param(None, id="unknown-job"),
            pytest.param(SlurmJob(42, "CANCELLED", "gb[01-02", start_time=5), id="unparseable"),
        ],
    )
    def test_job_that_still_wants_to_run_fails_as_before(self, host: FakeHost,
                                                          make_settings: Callable[..., Settings], root: Path,
                                                          answer: SlurmJob | None) -> None:  # fmt: skip
        """Running, requeued, unknown to slurmctld or no usable answer: the prolog fails (exit 75)."""
        rt, env = self._never_ready(host, make_settings, root)
        if answer is not None:
            host.slurm_jobs[answer.job_id] = answer
        with pytest.raises(HealthTimeout):
            prolog(env, rt)
        assert leftovers(root) == []

    def test_slurmctld_that_hangs_costs_query_timeout_only(self, host: FakeHost,
                                                          make_settings: Callable[..., Settings],
                                                          root: Path) -> None:  # fmt: skip
        """A hung slurmctld is bounded by [slurm] query_timeout_s per question, and the prolog still fails.

        Two questions hang: whether the job ended (squeue), then the node's drain reason (scontrol, issue 34)."""
        rt, env = self._never_ready(host, make_settings, root, slurm={"query_timeout_s": 2})
        host.squeue_hangs = host.scontrol_hangs = True
        with pytest.raises(HealthTimeout):
            prolog(env, rt)
        assert host.now - 1000.0 <= 3 + 2 + 2 + 0.5

    def test_a_tray_whose_own_daemon_never_got_ready_is_drained(self, host: FakeHost,
                                                                 make_settings: Callable[..., Settings],
                                                                 root: Path) -> None:  # fmt: skip
        """The broken tray itself (its daemon never READY) fails although the job went back to the queue: it asks
        once whether the job is over (issue 41), and a requeue is no end."""
        host.ready_after = 10**6
        rt = runtime(host, make_settings, readiness={"deadline_s": 3})
        host.slurm_jobs[42] = SlurmJob(42, "PENDING", reason="launch_failed_requeued_held")
        with pytest.raises(HealthTimeout) as info:
            prolog(job_env(job_id=42, SLURM_CONF=slurm_conf(root, "ClusterName=x\n"), SLURM_JOB_OVERSUBSCRIBE="NO"), rt)
        assert info.value.local_ready is False and asked(host) == [question(42)]

    def test_check_off_asks_nobody(self, host: FakeHost, make_settings: Callable[..., Settings], root: Path) -> None:
        """[slurm] check_cancelled = no: slurmctld is not asked, the prolog fails."""
        rt, env = self._never_ready(host, make_settings, root, slurm={"check_cancelled": "no"})
        host.slurm_jobs[42] = SlurmJob(42, "CANCELLED", "gb[01-02]")
        with pytest.raises(HealthTimeout):
            prolog(env, rt)
        assert not asked(host)

    def test_other_failures_never_ask(self, host: FakeHost, make_settings: Callable[..., Settings],
                                      root: Path) -> None:  # fmt: skip
        """A tray that is broken (here: no IMEX channel support) fails whatever became of the job."""
        (root / "proc/devices").write_text("Character devices:\n195 nvidia\nBlock devices:\n")
        rt = runtime(host, make_settings)
        host.slurm_jobs[42] = SlurmJob(42, "CANCELLED", "gb[01-02]")
        with pytest.raises(Exception, match="nvidia-caps-imex-channels"):
            prolog(job_env(job_id=42), rt)
        assert not asked(host)


class TestSigterm:
    def test_sigterm_logs_the_reason_first_then_rolls_back(self, host: FakeHost,
                                                            make_settings: Callable[..., Settings],
                                                            root: Path) -> None:  # fmt: skip
        """SIGTERM while waiting (slurmd's timeout): one prolog.done line, written before the roll-back,
        naming the signal and the slurm.conf timeout; nothing is left; the old handler is back."""
        host.ready_after = 10**6
        rt = runtime(host, make_settings, readiness={"deadline_s": 50})
        env = job_env(SLURM_CONF=slurm_conf(root, "PrologEpilogTimeout=100\n"))
        sleeps = []

        def sleep(seconds: float) -> None:
            sleeps.append(seconds)
            host.now += seconds
            if len(sleeps) == 3:
                os.kill(os.getpid(), signal.SIGTERM)

        host.sleep = sleep  # type: ignore[method-assign]
        before = signal.getsignal(signal.SIGTERM)
        with capture_logs() as logs, pytest.raises(Terminated) as info:
            prolog(env, rt)
        done = [e for e in logs if e["event"] == "prolog.done"]
        assert len(done) == 1 and done[0]["error_code"] == "terminated" and done[0]["exit_code"] == 75
        assert "terminated by SIGTERM after" in str(info.value)
        assert "(slurm.conf PrologEpilogTimeout=100s; readiness deadline 50s)" in str(info.value)
        order = [e["event"] for e in logs]
        assert order.index("prolog.done") < order.index("prolog.rolled_back")
        assert leftovers(root) == [] and signal.getsignal(signal.SIGTERM) is before

    def test_sigterm_with_the_cap_off_still_names_the_hook_timeout(
        self, host: FakeHost, make_settings: Callable[..., Settings], root: Path
    ) -> None:
        """[slurm] cap_deadline = no: slurmd's SIGTERM at PrologEpilogTimeout is reported with that timeout."""
        host.ready_after = 10**6
        rt = runtime(host, make_settings, readiness={"deadline_s": 60}, slurm={"cap_deadline": "no"})
        env = job_env(SLURM_CONF=slurm_conf(root, "PrologEpilogTimeout=8\n"))

        def sleep(seconds: float) -> None:
            host.now += seconds
            if host.now - 1000.0 >= 8:
                os.kill(os.getpid(), signal.SIGTERM)

        host.sleep = sleep  # type: ignore[method-assign]
        with capture_logs() as logs, pytest.raises(Terminated) as info:
            prolog(env, rt)
        assert "(slurm.conf PrologEpilogTimeout=8s; readiness deadline 60s)" in str(info.value)
        assert not [e for e in logs if e["event"] == "prolog.deadline"], "the cap is off: no deadline line"
        assert leftovers(root) == []

    def test_sigterm_without_slurm_conf_suggests_the_cause(
        self, host: FakeHost, make_settings: Callable[..., Settings]
    ) -> None:
        """Without a known hook timeout, the reason points at the likely cause."""
        host.ready_after = 10**6
        rt = runtime(host, make_settings, readiness={"deadline_s": 50})
        host.sleep = lambda s: (setattr(host, "now", host.now + s), os.kill(os.getpid(), signal.SIGINT))  # type: ignore
        with pytest.raises(Terminated, match=r"terminated by SIGINT .*shorter than \[readiness\] deadline_s=50s"):
            prolog(job_env(), rt)


HET = (
    SlurmJob(100, "CONFIGURING", "gb[01-02]", het_job_id=100, het_job_offset=0),
    SlurmJob(101, "CONFIGURING", "gb[03-04]", het_job_id=100, het_job_offset=1),
)


class TestHetJobs:
    def test_components_share_one_domain(self, host: FakeHost, make_settings: Callable[..., Settings],
                                         root: Path) -> None:  # fmt: skip
        """Component 1 on gb03: the domain is keyed by the het job id and lists both components' trays."""
        host.slurm_jobs.update({j.job_id: j for j in HET})
        rt = runtime(host, make_settings)
        env = job_env(job_id=101, nodelist="gb[03-04]", node="gb03", SLURM_HET_JOB_ID="100")
        with capture_logs() as logs:
            out = prolog(env, rt)
        jd = root / "run/imexctl/jobs/100"
        assert (jd / "nodes_config.cfg").read_text() == "10.0.0.1\n10.0.0.2\n10.0.0.3\n10.0.0.4\n"
        assert out.setup.trays == 4 and out.setup.port == 61100 and out.setup.channel.endswith("channel101")
        (het,) = [e for e in logs if e["event"] == "imex.het_job"]
        assert (het["mode"], het["components"], het["trays"]) == ("joint", 2, 4)
        assert epilog(env, rt).fields()["actions"] and leftovers(root) == []

    def test_old_pack_variable(self, host: FakeHost, make_settings: Callable[..., Settings], root: Path) -> None:
        """SLURM_PACK_JOB_ID (older Slurm) means the same."""
        host.slurm_jobs.update({j.job_id: j for j in HET})
        env = job_env(job_id=100, nodelist="gb[01-02]", node="gb01", SLURM_PACK_JOB_ID="100")
        assert prolog(env, runtime(host, make_settings)).setup.trays == 4

    def test_per_component(self, host: FakeHost, make_settings: Callable[..., Settings], root: Path) -> None:
        """[slurm] het_jobs = per_component: the component is a domain of its own; slurmctld is not asked."""
        rt = runtime(host, make_settings, slurm={"het_jobs": "per_component"})
        env = job_env(job_id=101, nodelist="gb[03-04]", node="gb03", SLURM_HET_JOB_ID="100")
        assert prolog(env, rt).setup.trays == 2 and (root / "run/imexctl/jobs/101").is_dir()
        assert not asked(host)
        epilog(env, rt)
        assert leftovers(root) == []

    @pytest.mark.parametrize(
        "answer",
        [
            pytest.param((), id="unknown"),
            pytest.param(HET[:1], id="this-node-missing"),
            pytest.param((HET[0], dataclasses.replace(HET[1], het_job_offset=0)), id="offset-twice"),
            pytest.param((HET[0], dataclasses.replace(HET[1], nodes="")), id="component-without-nodes"),
            pytest.param((HET[0], dataclasses.replace(HET[1], nodes="gb[03-")), id="bad-node-list"),
        ],
    )
    def test_no_usable_answer_fails_before_anything(self, host: FakeHost, make_settings: Callable[..., Settings],
                                                     root: Path, answer: tuple[SlurmJob, ...]) -> None:  # fmt: skip
        """Without the components every tray could build a different nodes file: fail (exit 69), touch nothing."""
        host.slurm_jobs.update({j.job_id: j for j in answer})
        env = job_env(job_id=101, nodelist="gb[03-04]", node="gb03", SLURM_HET_JOB_ID="100")
        with pytest.raises(SlurmQueryError) as info:
            prolog(env, runtime(host, make_settings))
        assert info.value.exit_code == 69 and leftovers(root) == []
        assert not any(c[0] == "spawn" for c in host.calls)


class TestSingleTray:
    def test_domain_by_default(self, host: FakeHost, make_settings: Callable[..., Settings], root: Path) -> None:
        """A one-tray job gets a one-tray domain: a daemon and a channel."""
        out = prolog(job_env(nodelist="gb01"), runtime(host, make_settings))
        assert out.setup.trays == 1 and any(c[0] == "spawn" for c in host.calls) and host.mknods

    def test_channel_only(self, host: FakeHost, make_settings: Callable[..., Settings], root: Path) -> None:
        """single_tray = channel: the channel, no daemon; the epilog removes it all."""
        rt = runtime(host, make_settings, policy={"single_tray": "channel"})
        out = prolog(job_env(job_id=42, nodelist="gb01"), rt)
        assert out.setup.daemon is False and out.setup.channel.endswith("channel43") and len(host.mknods) == 1
        assert not any(c[0] == "spawn" or c[0].endswith("nvidia-imex-ctl") for c in host.calls)
        epilog(job_env(job_id=42, nodelist="gb01"), rt)
        assert leftovers(root) == [] and not [c for c in host.calls if c[0].endswith("systemctl")]

    def test_none(self, host: FakeHost, make_settings: Callable[..., Settings], root: Path) -> None:
        """single_tray = none: skipped, nothing touched; a two-tray job is unaffected."""
        rt = runtime(host, make_settings, policy={"single_tray": "none"})
        assert "single_tray = none" in prolog(job_env(nodelist="gb01"), rt).skipped
        assert host.calls == [] and leftovers(root) == []
        assert prolog(job_env(nodelist="gb[01-02]"), rt).setup.trays == 2


class TestSlurmOwnsChannels:
    def test_switch_nvidia_imex_means_no_channel_from_imexctl(self, host: FakeHost,
                                                              make_settings: Callable[..., Settings],
                                                              root: Path) -> None:  # fmt: skip
        """slurm.conf with SwitchType=switch/nvidia_imex: the domain is set up, but imexctl makes no channel."""
        rt = runtime(host, make_settings)
        env = job_env(
            SLURM_CONF=slurm_conf(root, "SwitchType=switch/nvidia_imex\nSwitchParameters=imex_channel_count=64\n")
        )
        with capture_logs() as logs:
            out = prolog(env, rt)
        assert out.setup.ready and out.setup.channel == "" and host.mknods == []
        assert [e["event"] for e in logs if e["event"] == "imex.channels.slurm"] == ["imex.channels.slurm"]
        epilog(env, rt)
        assert leftovers(root) == []

    def test_channel_only_tray_makes_no_channel_either(self, host: FakeHost, make_settings: Callable[..., Settings],
                                                       root: Path) -> None:  # fmt: skip
        """single_tray = channel under switch/nvidia_imex: Slurm's plugin owns the channel there too (the one-tray
        path used to make one all the same, invisible to the job's steps)."""
        rt = runtime(host, make_settings, policy={"single_tray": "channel"})
        env = job_env(nodelist="gb01", SLURM_CONF=slurm_conf(root, "SwitchType=switch/nvidia_imex\n"))
        out = prolog(env, rt)
        assert out.setup.daemon is False and out.setup.channel == "" and host.mknods == []
        epilog(env, rt)
        assert leftovers(root) == []

    def test_other_switch_types_keep_channels(self, host: FakeHost, make_settings: Callable[..., Settings],
                                              root: Path) -> None:  # fmt: skip
        """switch/none (or none set): imexctl creates the job's channel as usual."""
        out = prolog(job_env(SLURM_CONF=slurm_conf(root, "SwitchType=switch/none\n")), runtime(host, make_settings))
        assert out.setup.channel and len(host.mknods) == 1


class TestChannelWithoutTopology:
    """No topology source: the clique is every node of slurm.conf, in Slurm's order (design.md "The channel rule")."""

    CONF = "NodeName=DEFAULT CPUs=4\nNodeName=login1\nNodeName=gb[01-04] NodeAddr=10.0.0.[1-4]\n"

    # five nodes, 2047 // 5 = 409 turns: 1 + position + 5 * (job id % 409)
    @pytest.mark.parametrize(
        ("job_id", "nodelist", "node", "minor"),
        [(610, "gb[01-02]", "gb02", 1 + 1 + 5 * 201), (2657, "gb[03-04]", "gb03", 1 + 3 + 5 * 203)],
    )
    def test_slurm_conf_order_places_the_domain(self, host: FakeHost, make_settings: Callable[..., Settings],
                                                root: Path, job_id: int, nodelist: str, node: str,
                                                minor: int) -> None:  # fmt: skip
        """Five nodes (login1, gb01-gb04): jobs 610 and 2657, which the job-id rule gave one channel, sit at
        positions 1 and 3 and get different ones."""
        env = job_env(job_id=job_id, nodelist=nodelist, node=node, SLURM_CONF=slurm_conf(root, self.CONF))
        with capture_logs() as logs:
            out = prolog(env, runtime(host, make_settings))
        assert out.setup.channel.endswith(f"channel{minor}")
        (created,) = [e for e in logs if e["event"] == "device.channel.created"]
        assert (created["clique"], created["clique_trays"]) == ("slurm.conf", 5)
        assert not [e for e in logs if e["event"] == "imex.channel.unplaced"]

    @pytest.mark.parametrize(
        ("conf", "why"),
        [
            ("NodeName=gb01\n", "slurm.conf does not list gb02"),
            (None, "could not be read"),
            ("NodeName=gb[01-\n", "NodeName=gb[01-: invalid node list"),
        ],
        ids=["dynamic-node", "unreadable", "bad-node-line"],
    )
    def test_under_slurmd_a_domain_without_a_place_is_refused(self, host: FakeHost,
                                                              make_settings: Callable[..., Settings], root: Path,
                                                              conf: str | None, why: str) -> None:  # fmt: skip
        """A tray slurm.conf does not list (a dynamic node), or a slurm.conf that cannot say: the job-id rule would
        give a number a placed domain of the clique can hold, so the prolog refuses IMEX before anything starts,
        naming the trays and the fix."""
        path = slurm_conf(root, conf) if conf is not None else str(root / "missing.conf")
        env = job_env(job_id=42, SLURM_CONF=path)
        with pytest.raises(ConfigError) as info:
            prolog(env, runtime(host, make_settings))
        assert "this domain (gb[01-02])" in str(info.value) and why in str(info.value)
        assert "has no place in its NVLink clique" in str(info.value) and "imexctl topology blocks" in str(info.value)
        assert host.mknods == [] and not [c for c in host.calls if c[0] == "spawn"] and leftovers(root) == []

    def test_outside_slurmd_a_domain_without_a_place_gets_the_job_id_rule(self, host: FakeHost,
                                                                          make_settings: Callable[..., Settings],
                                                                          root: Path) -> None:  # fmt: skip
        """No SLURM_CONF (imexctl demo, the simulator): no clique to place the domain in, the job-id rule, silently."""
        with capture_logs() as logs:
            out = prolog(job_env(job_id=42), runtime(host, make_settings))
        assert out.setup.channel.endswith("channel43")
        (created,) = [e for e in logs if e["event"] == "device.channel.created"]
        assert (created["clique"], created["position"], created["clique_trays"]) == ("none", 0, 1)
        assert not [e for e in logs if e["log_level"] == "warning"]


class TestSharingUnderSlurm2205:
    """Slurm 22.05 sets neither SLURM_JOB_OVERSUBSCRIBE nor SLURM_JOB_EXCLUSIVE: the prolog asks slurmctld once."""

    def _env(self, root: Path, **more: str) -> dict[str, str]:
        return job_env(job_id=42, SLURM_CONF=slurm_conf(root, "ClusterName=x\n"), SLURM_JOB_OVERSUBSCRIBE=None, **more)

    @pytest.mark.parametrize(("answer", "shared"), [("OK", True), ("USER", True), ("YES", True), ("NO", False),
                                                    ("TOPO", False)])  # fmt: skip
    def test_slurmctld_says_whether_the_job_shares(self, host: FakeHost, make_settings: Callable[..., Settings],
                                                   root: Path, answer: str, shared: bool) -> None:  # fmt: skip
        """22.05's squeue prints OverSubscribe as 23.02-25.11's variable: read by the same rule."""
        host.slurm_jobs[42] = SlurmJob(42, "CONFIGURING", "gb[01-02]", oversubscribe=answer)
        out = prolog(self._env(root), runtime(host, make_settings))
        assert asked(host) == [question(42)]
        if shared:
            assert out.skipped.startswith(f"the job may share its trays with other jobs (OverSubscribe={answer} "
                                             "from slurmctld)"), out  # fmt: skip
            assert leftovers(root) == [], leftovers(root)  # no domain: nothing of the job's but its note
        else:
            assert out.ok and not out.skipped and out.setup.trays == 2, out

    @pytest.mark.parametrize(("how", "shared"), [("down", "skip"), ("hangs", "skip"), ("unknown-job", "skip"),
                                                 ("down", "refuse")])  # fmt: skip
    def test_no_answer_means_no_domain_and_the_user_is_told(self, host: FakeHost,
                                                             make_settings: Callable[..., Settings], root: Path,
                                                             how: str, shared: str) -> None:  # fmt: skip
        """slurmctld unreachable, hung or not knowing the job, three questions a second apart: the job may share
        its trays (no domain, the note, a warning, skipped), with [policy] shared = refuse too (no drain)."""
        host.squeue_down_for = 10 if how == "down" else 0
        host.squeue_hangs = how == "hangs"
        if how != "unknown-job":
            host.slurm_jobs[42] = SlurmJob(42, "CONFIGURING", "gb[01-02]", oversubscribe="NO")
        rt = runtime(host, make_settings, slurm={"query_timeout_s": 2}, policy={"shared": shared})
        with capture_logs() as logs:
            out = prolog(self._env(root), rt)
        assert asked(host) == [question(42)] * 3 and host.slept[:2] == [1.0, 1.0], (host.calls, host.slept)
        assert out.ok and out.setup is None and out.told_user and out.sharing_unknown, out
        assert "slurmctld did not say whether it may" in out.skipped and "run the job again" in out.skipped, out
        assert leftovers(root) == [] and not host.mknods and not any(c[0] == "spawn" for c in host.calls)
        note = (root / "run/imexctl/notes/42").read_text()
        assert "IMEX was not set up for job 42" in note and "slurmctld did not say" in note, note
        (warning,) = [e for e in logs if e["event"] == "imex.sharing_unknown"]
        assert warning["log_level"] == "warning" and warning["tries"] == 3, warning
        assert ("exit 1" if how == "down" else "no answer within 2s" if how == "hangs" else "Invalid job id") \
            in warning["problem"]  # fmt: skip
        assert host.now - 1000.0 <= 3 * (2 if how == "hangs" else 1) + 2 + 0.5

    def test_an_answer_to_a_later_question_is_used(self, host: FakeHost, make_settings: Callable[..., Settings],
                                                   root: Path) -> None:  # fmt: skip
        """slurmctld answers the second question: an exclusive job gets its domain, nothing is logged as unknown."""
        host.squeue_down_for = 1
        host.slurm_jobs[42] = SlurmJob(42, "CONFIGURING", "gb[01-02]", oversubscribe="NO")
        with capture_logs() as logs:
            out = prolog(self._env(root), runtime(host, make_settings))
        assert out.ok and out.setup.trays == 2 and not out.sharing_unknown, out
        assert asked(host) == [question(42)] * 2 and host.slept[:1] == [1.0]
        assert not [e for e in logs if e["event"] == "imex.sharing_unknown"]

    @pytest.mark.parametrize("where", ["env-says", "not-under-slurmd", "turned-off"])
    def test_not_asked(self, host: FakeHost, make_settings: Callable[..., Settings], root: Path, where: str) -> None:
        """Not asked when the environment says (23.02+), without SLURM_CONF, or with ask_sharing = no."""
        env = self._env(root) | ({"SLURM_JOB_OVERSUBSCRIBE": "NO"} if where == "env-says" else {})
        if where == "not-under-slurmd":
            del env["SLURM_CONF"]
        slurm = {"ask_sharing": "no"} if where == "turned-off" else {}
        assert prolog(env, runtime(host, make_settings, slurm=slurm)).ok
        assert not asked(host)


class TestLeftoversOfEndedJobs:
    """Issue 22: a prolog clears what a job that no longer runs here left; in doubt it asks slurmctld once."""

    def _set_up_job_7(self, host: FakeHost, make_settings: Callable[..., Settings], root: Path) -> Runtime:
        rt = runtime(host, make_settings)
        env = job_env(job_id=7, SLURM_CONF=slurm_conf(root, "ClusterName=x\n"), SLURM_JOB_OVERSUBSCRIBE="NO")
        assert prolog(env, rt).ok
        return rt

    @pytest.mark.parametrize(("answer", "cleared"), [("COMPLETED", True), ("REQUEUED", True), ("RUNNING", False),
                                                     (None, False)])  # fmt: skip
    def test_domain_of_a_job_in_doubt(self, host: FakeHost, make_settings: Callable[..., Settings], root: Path,
                                      answer: str | None, cleared: bool) -> None:  # fmt: skip
        """Job 7's domain is set up and its epilog never ran: slurmctld's word decides; no answer keeps it."""
        rt = self._set_up_job_7(host, make_settings, root)
        if answer:
            host.slurm_jobs[7] = SlurmJob(7, answer, "gb[01-02]")
        env = job_env(job_id=8, SLURM_CONF=slurm_conf(root, "ClusterName=x\n"), SLURM_JOB_OVERSUBSCRIBE="NO")
        with capture_logs() as logs:
            if cleared:
                assert prolog(env, rt).ok
            else:
                with pytest.raises(DomainBusyError, match="belongs to job 7, which may still run on this node"):
                    prolog(env, rt)
        assert asked(host) == [question(7)]
        removed = [e for e in logs if e["event"] == "state.removed"]
        assert bool(removed) is cleared and (not removed or "leftovers of job 7" in removed[0]["reason"]), removed
        assert (root / "run/imexctl/jobs/7").exists() is not cleared

    def test_job_with_a_slurmstepd_here_is_not_asked_about(self, host: FakeHost,
                                                           make_settings: Callable[..., Settings],
                                                           root: Path) -> None:  # fmt: skip
        """A slurmstepd of job 7 on the tray proves it runs: refused, slurmctld never asked."""
        rt = self._set_up_job_7(host, make_settings, root)
        host.running_jobs.add(7)
        env = job_env(job_id=8, SLURM_CONF=slurm_conf(root, "ClusterName=x\n"), SLURM_JOB_OVERSUBSCRIBE="NO")
        with pytest.raises(DomainBusyError, match="belongs to job 7, which still runs on this node"):
            prolog(env, rt)
        assert not asked(host)


def test_cut_off_tray_fails_even_when_the_job_was_requeued(host: FakeHost, make_settings: Callable[..., Settings],
                                                            root: Path) -> None:  # fmt: skip
    """Issue 22: a tray that never reached any of its peers fails although slurmctld says the job went back to the
    queue (requeued for the healthy tray that timed out first): Slurm drains the tray at fault too."""
    host.domain = lambda hosts: (0, domain_json(hosts, status="DEGRADED", node_status={1: "UNAVAILABLE",
                                                2: "UNAVAILABLE"}, conn_status="INVALID"))  # fmt: skip
    host.slurm_jobs[42] = SlurmJob(42, "PENDING", restarts=1, reason="launch_failed_requeued_held")
    host.reach = {"10.0.0.2": "timeout", "10.0.0.3": "no route to host"}
    rt = runtime(host, make_settings, readiness={"deadline_s": 3})
    env = job_env(job_id=42, nodelist="gb[01-03]", SLURM_CONF=slurm_conf(root, "ClusterName=x\n"),
                  SLURM_JOB_OVERSUBSCRIBE="NO")  # fmt: skip
    with pytest.raises(HealthTimeout) as info:
        prolog(env, rt)
    assert info.value.isolated and "never reached the command service of any of its 2 peers" in str(info.value)
    assert "10.0.0.2 (command service unreachable, link from here INVALID; TCP port 62042: timeout)" in str(info.value)
    assert ("tcp_reach", "62042", "10.0.0.2", "10.0.0.3") in host.calls
    assert leftovers(root) == []


def test_peers_that_refuse_are_not_a_cut_off(host: FakeHost, make_settings: Callable[..., Settings],
                                             root: Path) -> None:  # fmt: skip
    """Peers whose command port answers with a refusal (their daemons gone after the requeue): the path works,
    so this tray is not cut off and exits 0 for a job that went back to the queue."""
    host.domain = lambda hosts: (0, domain_json(hosts, status="DEGRADED", node_status={1: "UNAVAILABLE",
                                                2: "UNAVAILABLE"}, conn_status="INVALID"))  # fmt: skip
    host.slurm_jobs[42] = SlurmJob(42, "PENDING", restarts=1, reason="launch_failed_requeued_held")
    host.reach = {"10.0.0.2": "refused", "10.0.0.3": "refused"}
    rt = runtime(host, make_settings, readiness={"deadline_s": 3})
    env = job_env(job_id=42, nodelist="gb[01-03]", SLURM_CONF=slurm_conf(root, "ClusterName=x\n"),
                  SLURM_JOB_OVERSUBSCRIBE="NO")  # fmt: skip
    assert prolog(env, rt).job_ended == "PENDING"
