"""health: polling nvidia-imex-ctl under a deadline (design.md source ctl-network), over FakeHost's fake clock."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Callable

import pytest
import structlog

from imexctl.config.settings import Settings
from imexctl.hooks import readiness
from imexctl.hooks.prolog import prolog
from imexctl.hooks.runtime import Runtime
from imexctl.imex import config as imexconf
from imexctl.platform.errors import DaemonError, HealthTimeout
from tests.support.fakes import FakeHost, domain_json, job_env

ADDRESSES = ("10.0.0.1", "10.0.0.2")
START = 1000.0  # FakeHost's clock at start


def make_probe(
    root: Path, *, level: str = "domain", addresses: Sequence[str] = ADDRESSES, alive: Callable[[], bool] = lambda: True
) -> readiness.Probe:
    """Write a job's nodes file and config.cfg under ``root`` and describe the probe."""
    job_dir = root / "run/imexctl/jobs/42"
    job_dir.mkdir(parents=True, exist_ok=True)
    nodes = job_dir / "nodes_config.cfg"
    nodes.write_text(imexconf.render_nodes(addresses))
    config = job_dir / "config.cfg"
    config.write_text(
        imexconf.render_config(
            job_id=42,
            port=61042,
            bind_ip=addresses[0],
            nodes_path=nodes,
            cmd_port=62042,
            log_file=root / "imex.log",
            overrides={},
        )
    )
    return readiness.Probe(config, addresses[0], tuple(addresses), level, alive)


def wait(host: FakeHost, s: Settings, p: readiness.Probe) -> readiness.Readiness:
    deadline = host.monotonic() + s.readiness.deadline_s
    return readiness.wait_ready(host, s, p, deadline=deadline, log=structlog.get_logger())


def ctl_calls(host: FakeHost, *flags: str) -> list[tuple[str, ...]]:
    return [c for c in host.calls if c[0].endswith("nvidia-imex-ctl") and all(f in c for f in flags)]


def sequence(*answers: tuple[int, str]) -> Callable[[list[str]], tuple[int, str]]:
    """A FakeHost.domain answering each -N -j call with the next answer (the last one repeats)."""
    it: Iterator[tuple[int, str]] = iter(answers)
    last: list[tuple[int, str]] = []

    def answer(hosts: list[str]) -> tuple[int, str]:
        last[:] = [next(it, last[0] if last else answers[-1])]
        return last[0]

    return answer


@pytest.fixture
def s(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings()


class TestReady:
    def test_ready_when_local_ready_and_domain_up(self, host: FakeHost, s: Settings, root: Path) -> None:
        """A READY daemon in an UP domain with every own link CONNECTED is ready at the first probe."""
        result = wait(host, s, make_probe(root))
        assert result.ready and result.status == "domain UP" and host.slept == []
        assert len(ctl_calls(host, "-q")) == 1 and len(ctl_calls(host, "-N", "-j")) == 1

    def test_ctl_is_called_with_the_job_config(self, host: FakeHost, s: Settings, root: Path) -> None:
        """nvidia-imex-ctl is pointed at the job's config.cfg, by absolute path."""
        p = make_probe(root)
        wait(host, s, p)
        assert host.calls[0] == ("/usr/bin/nvidia-imex-ctl", "-c", str(p.config), "-q")
        assert host.calls[1] == ("/usr/bin/nvidia-imex-ctl", "-c", str(p.config), "-N", "-j")

    def test_waits_for_peer_to_come_up(self, host: FakeHost, s: Settings, root: Path) -> None:
        """A domain that is DEGRADED because a peer is UNAVAILABLE is polled until it is UP."""
        down = domain_json(ADDRESSES, status="DEGRADED", node_status={1: "UNAVAILABLE"}, conn_status="INVALID")
        host.domain = sequence((0, down), (0, down), (0, domain_json(ADDRESSES)))
        assert wait(host, s, make_probe(root)).ready
        assert len(ctl_calls(host, "-N", "-j")) == 3

    def test_after_local_ready_each_probe_asks_only_the_domain(self, host: FakeHost, s: Settings, root: Path) -> None:
        """Once -q said READY, the later probes run -N alone (it reports this node's own status): one ctl each."""
        down = domain_json(ADDRESSES, status="DEGRADED", node_status={1: "UNAVAILABLE"}, conn_status="INVALID")
        host.domain = sequence((0, down), (0, down), (0, domain_json(ADDRESSES)))
        assert wait(host, s, make_probe(root)).ready
        assert len(ctl_calls(host, "-q")) == 1 and len(ctl_calls(host, "-N", "-j")) == 3
        assert host.calls[0][-1] == "-q" and all(c[-2:] == ("-N", "-j") for c in host.calls[1:])

    def test_own_node_not_ready_in_the_domain_view_keeps_waiting(self, host: FakeHost, s: Settings, root: Path) -> None:
        """After -q said READY, -N showing this node not READY (its daemon went back) is not ready."""
        host.domain = lambda hosts: (0, domain_json(hosts, status="DEGRADED", node_status={0: "UNAVAILABLE"}))
        with pytest.raises(HealthTimeout, match="own node UNAVAILABLE"):
            wait(host, s, make_probe(root))
        assert len(ctl_calls(host, "-q")) == 1 and len(ctl_calls(host, "-N", "-j")) > 2

    def test_own_link_down_is_not_ready(self, host: FakeHost, s: Settings, root: Path) -> None:
        """An UP domain whose own connections are not all CONNECTED is not ready."""
        host.domain = lambda hosts: (0, domain_json(hosts, conn_status="RECOVERING"))
        with pytest.raises(HealthTimeout, match="domain UP"):
            wait(host, s, make_probe(root))

    def test_local_level_never_asks_the_domain(
        self, host: FakeHost, make_settings: Callable[..., Settings], root: Path
    ) -> None:
        """With level=local a READY answer to -q is enough and -N -j is never run."""
        host.ready_after = 3
        host.domain = lambda hosts: (0, "must not be asked")
        result = wait(host, make_settings(readiness={"level": "local"}), make_probe(root, level="local"))
        assert result.ready and result.status == "local READY"
        assert ctl_calls(host, "-N") == [] and len(ctl_calls(host, "-q")) == 3

    def test_nonzero_exit_with_ready_output_is_not_ready(self, host: FakeHost, s: Settings, root: Path) -> None:
        """READY printed by a command that exits non-zero does not count."""
        host.q_outputs = [(1, "READY\n")]
        with pytest.raises(HealthTimeout, match=r"local READY \(exit 1\)"):
            wait(host, s, make_probe(root))


class TestGarbage:
    def test_garbage_query_output_keeps_polling_then_times_out(self, host: FakeHost, s: Settings, root: Path) -> None:
        """Unknown -q output is not fatal: polling continues and the timeout names the output."""
        host.q_outputs = [(0, "BANANA\n")]
        with pytest.raises(HealthTimeout, match="unknown state 'BANANA'") as info:
            wait(host, s, make_probe(root))
        assert info.value.attempts > 2 and "BANANA" in info.value.last_status
        assert host.now - START == pytest.approx(5.0 - 0.2)

    def test_empty_query_output_is_reported(self, host: FakeHost, s: Settings, root: Path) -> None:
        """Empty -q output keeps polling and the timeout says the output was empty."""
        host.q_outputs = [(0, "")]
        with pytest.raises(HealthTimeout, match="empty output"):
            wait(host, s, make_probe(root))

    @pytest.mark.parametrize(
        ("output", "problem"),
        [
            pytest.param("{not json", "not JSON", id="not-json"),
            pytest.param("[]", "top level is list", id="list"),
            pytest.param('{"nodes": {}}', "missing key 'status'", id="no-status"),
            pytest.param(
                '{"status": "UP", "nodes": {"0": {"status": "READY"}}}', "missing key 'host'", id="node-without-host"
            ),
        ],
    )
    def test_garbage_domain_json_keeps_polling_then_times_out(
        self, host: FakeHost, s: Settings, root: Path, output: str, problem: str
    ) -> None:
        """Unparseable -N -j output keeps polling and the HealthTimeout message contains the problem."""
        host.domain = lambda hosts: (0, output)
        with pytest.raises(HealthTimeout, match=problem) as info:
            wait(host, s, make_probe(root))
        assert info.value.attempts > 2 and len(ctl_calls(host, "-N", "-j")) == info.value.attempts

    def test_garbage_through_the_prolog_rolls_back(self, rt: Runtime, host: FakeHost, root: Path) -> None:
        """A prolog whose daemon prints garbage fails with HealthTimeout naming it and leaves no job dir."""
        host.domain = lambda hosts: (0, "Segmentation fault")
        with pytest.raises(HealthTimeout, match="not JSON.*Segmentation fault"):
            prolog(job_env(), rt)
        assert list((root / "run/imexctl/jobs").iterdir()) == []


class TestHang:
    def test_hanging_ctl_times_out_naming_the_hang(
        self, host: FakeHost, make_settings: Callable[..., Settings], root: Path
    ) -> None:
        """A ctl that never answers ends in HealthTimeout that says it did not answer."""
        host.hang_ctl = True
        with pytest.raises(HealthTimeout, match=r"ctl -q: no answer within [0-9.]+s"):
            wait(host, make_settings(readiness={"ctl_timeout_s": 1}), make_probe(root))

    def test_hanging_ctl_through_the_prolog(self, rt: Runtime, host: FakeHost) -> None:
        """A prolog whose ctl hangs fails with HealthTimeout instead of hanging itself."""
        host.hang_ctl = True
        with pytest.raises(HealthTimeout, match="no answer"):
            prolog(job_env(), rt)

    def test_hanging_ctl_never_runs_past_the_deadline(
        self, host: FakeHost, make_settings: Callable[..., Settings], root: Path
    ) -> None:
        """Probes that hang are cut at the deadline, so the wait ends within deadline_s."""
        host.hang_ctl = True
        s = make_settings(readiness={"deadline_s": 6, "ctl_timeout_s": 5})
        with pytest.raises(HealthTimeout):
            wait(host, s, make_probe(root))
        assert host.now - START <= 6.0 + 0.5


class TestFatal:
    def test_exit_255_fails_at_once(self, host: FakeHost, s: Settings, root: Path) -> None:
        """ctl exit 255 (cannot read the node config) is a DaemonError at the first probe."""
        host.q_outputs = [(255, "")]
        with pytest.raises(DaemonError, match="cannot read the node config"):
            wait(host, s, make_probe(root))
        assert host.slept == [] and len(host.calls) == 1

    def test_failed_to_read_node_configuration_fails_at_once(self, host: FakeHost, s: Settings, root: Path) -> None:
        """'Failed to read node configuration file' is a DaemonError quoting it, without polling."""
        host.q_outputs = [(1, "Failed to read node configuration file /x/nodes_config.cfg\n")]
        with pytest.raises(DaemonError, match="Failed to read node configuration file /x/nodes_config.cfg"):
            wait(host, s, make_probe(root))
        assert host.slept == []

    def test_node_map_differs_fails_naming_both_lists(self, host: FakeHost, s: Settings, root: Path) -> None:
        """A daemon reporting other node hosts than the job's nodes file fails at once, naming both lists."""
        host.domain = lambda hosts: (0, domain_json(["10.0.0.1", "10.0.0.9"]))
        with pytest.raises(DaemonError) as info:
            wait(host, s, make_probe(root))
        assert "['10.0.0.1', '10.0.0.9']" in str(info.value) and "['10.0.0.1', '10.0.0.2']" in str(info.value)
        assert host.slept == []

    @pytest.mark.parametrize("status", ["NODE_MAP_MISMATCH", "VERSION_MISMATCH"])
    def test_mismatch_connection_fails_at_once(self, host: FakeHost, s: Settings, root: Path, status: str) -> None:
        """A link in a MISMATCH state cannot heal by waiting and fails the wait at once."""
        host.domain = lambda hosts: (0, domain_json(hosts, status="DEGRADED", conn_status=status))
        with pytest.raises(DaemonError, match=status):
            wait(host, s, make_probe(root))
        assert host.slept == [] and len(ctl_calls(host, "-N", "-j")) == 1

    def test_daemon_exit_fails_at_once(self, host: FakeHost, s: Settings, root: Path) -> None:
        """A daemon that is gone fails the wait without asking nvidia-imex-ctl."""
        with pytest.raises(DaemonError, match="exited"):
            wait(host, s, make_probe(root, alive=lambda: False))
        assert host.calls == []


class TestPolling:
    def test_pauses_are_a_twentieth_of_the_time_waited(
        self, host: FakeHost, make_settings: Callable[..., Settings], root: Path
    ) -> None:
        """Pauses are a twentieth of the time waited so far, at least poll_initial_s and at most poll_max_s."""
        host.ready_after = 10**6
        s = make_settings(readiness={"deadline_s": 30})
        with pytest.raises(HealthTimeout):
            wait(host, s, make_probe(root))
        waited = [sum(host.slept[:i]) for i in range(len(host.slept))]
        want = [min(1.0, max(0.03, w / 20)) for w in waited]
        assert host.slept[:-1] == pytest.approx(want[:-1])  # the last one is cut at the deadline
        assert host.slept[:20] == pytest.approx([0.03] * 20)  # until 0.6 s have passed
        assert host.slept[20] == pytest.approx(0.03, rel=0.01) and host.slept[21] > host.slept[20]
        assert max(host.slept) == pytest.approx(1.0)

    def test_never_sleeps_past_the_deadline(self, host: FakeHost, s: Settings, root: Path) -> None:
        """The last sleep is cut so that the last probe still has 0.2 s before the deadline."""
        host.ready_after = 10**6
        with pytest.raises(HealthTimeout) as info:
            wait(host, s, make_probe(root))
        assert sum(host.slept) == pytest.approx(5.0 - 0.2)
        assert host.slept[-1] < 1.0
        assert info.value.waited_s == pytest.approx(5.0 - 0.2)

    def test_custom_intervals(self, host: FakeHost, make_settings: Callable[..., Settings], root: Path) -> None:
        """poll_initial_s and poll_max_s from the settings shape the sleeps."""
        host.ready_after = 5
        s = make_settings(readiness={"poll_initial_s": 0.5, "poll_max_s": 0.7, "deadline_s": 30})
        host.ready_after = 30
        assert wait(host, s, make_probe(root)).ready
        assert host.slept[:10] == pytest.approx([0.5] * 10)  # a twentieth of the time waited is less until 10 s
        assert host.slept[-1] == pytest.approx(0.7) and max(host.slept) == pytest.approx(0.7)

    def test_ready_result_logs_attempts(self, host: FakeHost, s: Settings, root: Path) -> None:
        """Readiness is logged once as imex.ready with the number of probes and the time waited."""
        host.ready_after = 3
        with structlog.testing.capture_logs() as logs:
            wait(host, s, make_probe(root))
        ready = [e for e in logs if e["event"] == "imex.ready"]
        assert len(ready) == 1 and ready[0]["attempts"] == 3
        assert ready[0]["waited_s"] == pytest.approx(0.06)


def _unreachable_peer(peers_see: str) -> str:
    """-N -j as the real ctl prints it when it cannot ask node 2's command service: node 2
    UNAVAILABLE with every link INVALID, while nodes 0 and 1 report their own links to it."""
    import json

    hosts = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    doc = json.loads(domain_json(hosts, status="DEGRADED"))
    doc["nodes"]["2"].update(status="UNAVAILABLE", version="")
    for conn in doc["nodes"]["2"]["connections"].values():
        conn["status"] = "INVALID"
    for i in ("0", "1"):
        doc["nodes"][i]["connections"]["2"]["status"] = peers_see
    return json.dumps(doc)


class TestCommandServiceReachability:
    def test_blocked_command_port_is_named(
        self, host: FakeHost, make_settings: Callable[..., Settings], root: Path
    ) -> None:
        """A peer whose daemon its peers are CONNECTED to, but which -N cannot ask, is named with the port:
        its command port is blocked between the trays."""
        s = make_settings(readiness={"deadline_s": 2})
        p = make_probe(root, addresses=("10.0.0.1", "10.0.0.2", "10.0.0.3"))
        p = readiness.Probe(p.config, p.own_address, p.addresses, p.level, p.daemon_alive, 62042)
        host.domain = lambda hosts: (0, _unreachable_peer("CONNECTED"))
        with pytest.raises(HealthTimeout) as info:
            wait(host, s, p)
        msg = str(info.value)
        assert "command port 62042 unreachable on 10.0.0.3" in msg and "UNAVAILABLE 10.0.0.3" in msg
        assert "2->" not in msg  # the unreachable node's own row (all INVALID by construction) is not listed

    def test_peer_that_never_started_is_not_called_blocked(
        self, host: FakeHost, make_settings: Callable[..., Settings], root: Path
    ) -> None:
        """A peer nobody is connected to (its prolog never ran) is UNAVAILABLE, not 'blocked'."""
        s = make_settings(readiness={"deadline_s": 2})
        p = make_probe(root, addresses=("10.0.0.1", "10.0.0.2", "10.0.0.3"))
        host.domain = lambda hosts: (0, _unreachable_peer("NEVER_CONNECTED"))
        with pytest.raises(HealthTimeout) as info:
            wait(host, s, p)
        msg = str(info.value)
        assert "although their daemons are connected" not in msg, msg  # not called blocked
        assert "0->2 NEVER_CONNECTED" in msg and "UNAVAILABLE 10.0.0.3" in msg
        # issue 22: the reason names the peer that never answered and that its command service was unreachable
        assert (
            "peers that never answered: 10.0.0.3 (command service unreachable, link from here NEVER_CONNECTED)" in msg
        )
        assert "never reached the command service" not in msg and not info.value.isolated  # 10.0.0.2 answered

    def test_cmd_unreachable_needs_a_live_observer(self) -> None:
        """Links reported by UNAVAILABLE nodes carry no information and never mark a peer blocked."""
        from imexctl.imex import ctl as ctloutput

        doc = _unreachable_peer("CONNECTED").replace('"status":"READY"', '"status":"UNAVAILABLE"')
        dom = ctloutput.parse_domain_json(doc.replace('"status": "READY"', '"status": "UNAVAILABLE"'))
        assert dom.unreachable_but_connected() == ()
        assert ctloutput.parse_domain_json(_unreachable_peer("CONNECTED")).unreachable_but_connected() == ("10.0.0.3",)


class TestCutOffTray:
    """Issue 22: a tray that never reached any of two or more peers is the likely culprit, and is told so."""

    def _all_unavailable(self, hosts: Any) -> tuple[int, str]:
        return (0, domain_json(hosts, status="DEGRADED", node_status={1: "UNAVAILABLE", 2: "UNAVAILABLE"},
                               conn_status="INVALID"))  # fmt: skip

    def test_no_peer_ever_reached_is_isolated(self, host: FakeHost, make_settings: Callable[..., Settings],
                                              root: Path) -> None:  # fmt: skip
        s = make_settings(readiness={"deadline_s": 2})
        p = make_probe(root, addresses=("10.0.0.1", "10.0.0.2", "10.0.0.3"))
        host.domain = self._all_unavailable
        with pytest.raises(HealthTimeout) as info:
            wait(host, s, p)
        assert info.value.isolated, str(info.value)
        assert "never reached the command service of any of its 2 peers: check its firewall" in str(info.value)

    def test_a_peer_seen_once_is_not_isolation(self, host: FakeHost, make_settings: Callable[..., Settings],
                                               root: Path) -> None:  # fmt: skip
        """Peers that answered earlier and went away (their epilogs ran after a requeue): not this tray's fault."""
        s = make_settings(readiness={"deadline_s": 2})
        p = make_probe(root, addresses=("10.0.0.1", "10.0.0.2", "10.0.0.3"))
        calls = {"n": 0}

        def domain(hosts: Any) -> tuple[int, str]:
            calls["n"] += 1
            if calls["n"] == 1:
                return (0, domain_json(hosts, status="DEGRADED", node_status={2: "WAITING_FOR_PEERS"}))
            return self._all_unavailable(hosts)

        host.domain = domain
        with pytest.raises(HealthTimeout) as info:
            wait(host, s, p)
        assert not info.value.isolated and "never reached" not in str(info.value)

    def test_one_peer_alone_never_decides(self, host: FakeHost, make_settings: Callable[..., Settings],
                                          root: Path) -> None:  # fmt: skip
        """Two trays: either may be the one cut off; nobody is called isolated."""
        s = make_settings(readiness={"deadline_s": 2})
        p = make_probe(root, addresses=("10.0.0.1", "10.0.0.2"))
        host.domain = lambda hosts: (0, domain_json(hosts, status="DEGRADED", node_status={1: "UNAVAILABLE"},
                                                    conn_status="INVALID"))  # fmt: skip
        with pytest.raises(HealthTimeout) as info:
            wait(host, s, p)
        assert not info.value.isolated


def _without(hosts: Any, lone: str) -> tuple[int, str]:
    """A -N answer where ``lone`` is READY alone: nobody links to it, it links to nobody, the rest connected."""
    doc = json.loads(domain_json(hosts, status="DEGRADED"))
    for node in doc["nodes"].values():
        for conn in node["connections"].values():
            if lone in (node["host"], conn["host"]):
                conn["status"] = "NEVER_CONNECTED"
    return (0, json.dumps(doc))


def test_tray_the_others_formed_without_is_left_out(host: FakeHost, make_settings: Callable[..., Settings],
                                                     root: Path) -> None:  # fmt: skip
    """Issue 22: two peers connected to each other and neither to this tray (it refuses them): this tray is
    the likely culprit, says so, and counts as cut off; a peer that sees the same domain is not."""
    s = make_settings(readiness={"deadline_s": 2})
    host.domain = lambda hosts: _without(hosts, "10.0.0.3")
    with pytest.raises(HealthTimeout) as info:
        wait(host, s, make_probe(root, addresses=("10.0.0.3", "10.0.0.1", "10.0.0.2")))
    assert info.value.isolated and "none of them to this tray" in str(info.value), str(info.value)
    with pytest.raises(HealthTimeout) as peer:
        wait(host, s, make_probe(root, addresses=("10.0.0.1", "10.0.0.2", "10.0.0.3")))
    assert not peer.value.isolated and "none of them to this tray" not in str(peer.value), str(peer.value)
