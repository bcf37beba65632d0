"""A hook that fails for a fault of its tray drains its node with its own reason first (issue 34 §1).

slurmctld keeps a reason the node already has and drains a draining node no further (node_mgr.c
``validate_node_specs``, ``_drain_node``), so ``sinfo -R`` shows ``imex:<code> <node> job <id>: ...`` instead
of ``Prolog error``, also when the config file does not load (issue 42). The fake slurmctld records each
``scontrol update`` and refuses any other form. The reasons' prefix family, and how a reason of ours is
found again with tags added around it: ``TestParse``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
import structlog
from structlog.testing import capture_logs

from imexctl.commands import health
from imexctl.config.settings import Settings
from imexctl.hooks.prolog import prolog
from imexctl.hooks.runtime import Runtime
from imexctl.hooks.teardown import epilog
from imexctl.platform import errors
from imexctl.platform.errors import DaemonLostError, HealthTimeout, PortHeldError
from imexctl.platform.host import TcpSocket
from imexctl.slurm import drain
from tests.support.fakes import FakeGpu, FakeHost, SlurmJob, domain_json, job_env


def _rt(host: FakeHost, make_settings: Callable[..., Settings], **sections: dict[str, Any]) -> Runtime:
    return Runtime(host, FakeGpu(), make_settings(**sections), structlog.get_logger())


def _env(root: Path, **extra: str) -> dict[str, str]:
    """A prolog under slurmd: SLURM_CONF set, the job owns its trays (23.02+), three trays gb01-gb03.

    Tests that expect a drain tell the fake slurmctld about gb01 (``_known``): an unknown node is refused.
    """
    conf = root / "slurm.conf"
    conf.write_text("ClusterName=x\nNodeName=gb[01-18]\n")  # the trays: the channel's clique
    return job_env(job_id=42, nodelist="gb[01-03]", SLURM_CONF=str(conf), SLURM_JOB_OVERSUBSCRIBE="NO", **extra)


def _updates(host: FakeHost) -> list[tuple[str, ...]]:
    return [c for c in host.calls if c[0].endswith("scontrol") and c[1] == "update"]


def _known(host: FakeHost) -> FakeHost:
    """slurmctld knows gb01, allocated to the job whose prolog runs."""
    host.slurm_nodes["gb01"] = {"state": "ALLOCATED"}
    return host


def _reason(host: FakeHost) -> str | None:
    """gb01's reason once drained by the hook (DRAIN in its state), else None."""
    node = host.slurm_nodes.get("gb01", {})
    return node.get("reason") if "DRAIN" in node.get("state", "").split("+") else None


class TestReason:
    def test_code_and_node_come_first(self) -> None:
        """``sinfo -R`` prints 20 characters: the error code and the tray are in them."""
        text = drain.reason("not_ready", "r03t12", "peers 10.1.0.5,10.1.0.7 unreachable",
                            {"10.1.0.5": "r03t05", "10.1.0.7": "r03t07"})  # fmt: skip
        assert text == "imex:not_ready r03t12: peers r03t05,r03t07 unreachable"
        assert text[:20] == "imex:not_ready r03t1"

    def test_an_address_is_never_taken_for_the_start_of_another(self) -> None:
        """10.0.0.1 and 10.0.0.12 are two trays; ports and punctuation around an address stay."""
        names = {"10.0.0.1": "gb01", "10.0.0.12": "gb12"}
        text = drain.reason("not_ready", "gb03", "10.0.0.12 (TCP port 62042: timeout); 10.0.0.1:62042, 10.0.0.123",
                            names)  # fmt: skip
        assert text == "imex:not_ready gb03: gb12 (TCP port 62042: timeout); gb01:62042, 10.0.0.123"

    @pytest.mark.parametrize(
        "detail",
        [
            pytest.param("line one\nline two\tand\x00a NUL", id="control-characters"),
            pytest.param('"quoted from start to end"', id="quotes"),
            pytest.param("é" * 400, id="multibyte"),
            pytest.param("x" * 1000, id="long"),
        ],
    )
    def test_one_printable_line_within_slurmdbds_255_bytes(self, detail: str) -> None:
        """What scontrol passes on unchanged and slurmdbd keeps whole: no newline, no quote at the ends."""
        text = drain.reason("gpu_failed", "gb01", detail)
        assert len(text.encode()) <= drain.REASON_BYTES and text.isprintable() and '"' not in text
        assert text.startswith("imex:gpu_failed gb01: ") and "\n" not in text

    def test_the_job_follows_the_tray(self) -> None:
        """Code, tray, job: triage starts from the reason, not from sacct."""
        text = drain.reason("not_ready", "gb200-r01-t07", "own daemon not ready (WAITING_FOR_PEERS)", job=4294967295)
        assert text == "imex:not_ready gb200-r01-t07 job 4294967295: own daemon not ready (WAITING_FOR_PEERS)"

    @pytest.mark.parametrize("job", [None, 4294967295])
    @pytest.mark.parametrize("prefix", [drain.PREFIX, drain.HEALTH, drain.NHC])
    def test_a_long_detail_is_cut_the_head_and_suffix_kept(self, prefix: str, job: int | None) -> None:
        """The longest node name Slurm takes, the longest job id: 255 bytes, cut in the detail only, with ``...``;
        what follows the detail (health's ``(+N more)``) is kept whole; found again as it was written."""
        node = "n" * 64
        text = drain.reason("slurm_query_failed", node, "x" * 300, job=job, prefix=prefix, suffix="(+2 more)")
        assert len(text.encode()) == drain.REASON_BYTES and text.endswith("x... (+2 more)")
        ours = drain.parse(text)
        assert ours is not None and (ours.prefix, ours.code, ours.node, ours.job) == (prefix, "slurm_query_failed",
                                                                                       node, job)  # fmt: skip


class TestPrefixes:
    """One short, fixed family: ``imex:`` a hook's, ``imexh:`` health's, ``imexn:`` NHC's check (NHC adds ``NHC: ``).

    ``sinfo -R`` prints 20 characters of a reason (design.md source slurm-drain-reason).
    """

    HOOK_CODES = sorted(
        {c.code for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.ImexctlError)}
    )

    def test_every_health_code_is_whole_in_sinfos_20_columns(self) -> None:
        assert all(len(f"{drain.HEALTH}{code}") <= 20 for code in health.CODES), health.CODES

    @pytest.mark.parametrize(
        ("prefix", "codes"),
        [("", HOOK_CODES), ("", list(health.CODES)), ("NHC: ", list(health.CODES))],
        ids=["hooks", "health", "nhc"],
    )
    def test_every_code_is_told_apart_in_20_columns(self, prefix: str, codes: list[str]) -> None:
        """Cut at 20 columns, no two codes read the same (hooks' longest, slurm_query_failed, loses 3 characters;
        under NHC, which writes 'NHC: ' first, health's codes keep 9, still told apart)."""
        family = {drain.PREFIX: "", drain.HEALTH: "", drain.NHC: ""}
        for own in family:
            shown = [f"{prefix}{own}{code}"[:20] for code in codes]
            assert len(set(shown)) == len(codes), sorted(shown)

    def test_one_pattern_classifies_the_family_and_nothing_else(self) -> None:
        """What a regex-based tool (NVSentinel's Slurm Drain Monitor: one regex per pattern, over the reason or
        each part of it) is given: every prefix of ours matches, no other tool's reason does."""
        for prefix in (drain.PREFIX, drain.HEALTH, drain.NHC):
            assert drain.PATTERN.search(f"{prefix}not_ready gb01: x"), prefix
        for other in ("Prolog error", "NHC: check_fs_mount: /scratch", "slurm-operator: Pod is terminating",
                      "imex-healthy? no: x", "noimex:not_ready gb01: x", "imex:NotACode gb01: x"):  # fmt: skip
            assert drain.PATTERN.search(other) is None, other


class TestParse:
    """A reason of ours is found by its prefix alone, wherever tags another tool added put it."""

    OURS = "imexh:stale_daemon gb01: IMEX daemon pid 7 of job 44, which no longer runs here"

    @pytest.mark.parametrize(
        "text",
        [
            pytest.param("{}", id="as-written"),
            pytest.param("[ticket 4711] {}", id="tag-before"),
            pytest.param("{} [RO:reboot-pending]", id="tag-after"),
            pytest.param("RO:maint; {}; RO:sel", id="delimited-both-sides"),
            pytest.param("NHC: {}", id="nhc-style-prefix"),
            pytest.param("  {}  ", id="blanks"),
        ],
    )
    def test_found_with_tags_added(self, text: str) -> None:
        ours = drain.parse(text.format(self.OURS))
        assert ours is not None and (ours.owner, ours.code, ours.node, ours.job) == ("health", "stale_daemon",
                                                                                     "gb01", None)  # fmt: skip
        assert ours.detail.startswith("IMEX daemon pid 7 of job 44, which no longer runs here")

    def test_each_owner_and_the_job(self) -> None:
        hook = drain.parse("imex:not_ready gb03 job 4242: peers gb05,gb07 unreachable")
        assert hook is not None and (hook.owner, hook.label, hook.job) == ("hook", "imex:not_ready", 4242)
        nhc = drain.parse("NHC: imexn:config_invalid gb03: /etc/imexctl/imexctl.conf:3: bad")
        assert nhc is not None and (nhc.owner, nhc.label, nhc.node) == ("nhc", "imexn:config_invalid", "gb03")
        legacy = drain.parse("imex-health:stock_unit gb03: nvidia-imex.service is active")
        assert legacy is not None and (legacy.owner, legacy.code) == ("health", "stock_unit")

    @pytest.mark.parametrize(
        "text",
        [
            "bad DIMM, ticket 4711",
            "noimexh:stale_daemon gb01: inside a word",
            "imex-healthy? no: a close name",
            "imexh:stale_daemon",  # no tray, no ': '
            "imexh: stale_daemon gb01: a blank before the code",
            "imexh:stale_daemon gb01 job 0: no job 0",
            "imexh:stale_daemon gb01 job 12345678901: more than a job id",
            "Prolog error",
        ],
    )
    def test_not_ours(self, text: str) -> None:
        assert drain.parse(text) is None

    def test_only_the_prefixes_asked_for(self) -> None:
        """health looks for its own: a hook's reason before it is skipped, NHC's is not health's."""
        text = "imex:not_ready gb01 job 7: x; " + self.OURS
        ours = drain.parse(text, (drain.HEALTH,))
        assert ours is not None and ours.code == "stale_daemon"
        assert drain.parse("NHC: imexn:stale_daemon gb01: x", (drain.HEALTH, drain.LEGACY_HEALTH)) is None


class TestProlog:
    def test_a_tray_whose_daemon_never_gets_ready_names_itself(self, host: FakeHost,
                                                              make_settings: Callable[..., Settings],
                                                              root: Path) -> None:  # fmt: skip
        """The broken tray drains itself with its code, before slurmd reports the failure."""
        host.ready_after = 10**6
        rt = _rt(_known(host), make_settings, readiness={"deadline_s": 2})
        env = _env(root)
        with capture_logs() as logs, pytest.raises(HealthTimeout):
            prolog(env, rt)
        assert _reason(host) == "imex:not_ready gb01 job 42: own daemon not ready (WAITING_FOR_PEERS)"
        (update,) = _updates(host)
        assert update[:4] == ("/usr/bin/scontrol", "update", "NodeName=gb01", "State=DRAIN")
        assert [e for e in host.envs if e[0] == update] == [(update, {"SLURM_CONF": env["SLURM_CONF"]})]
        events = [e["event"] for e in logs]
        assert events.index("prolog.done") < events.index("slurm.drained")

    def test_a_healthy_tray_that_fails_names_its_peers_by_node_name(self, host: FakeHost,
                                                                    make_settings: Callable[..., Settings],
                                                                    root: Path) -> None:  # fmt: skip
        """A peer that says it is not ready, the job still running: the reason names gb02, never 10.0.0.2."""
        host.domain = lambda hosts: (0, domain_json(hosts, status="DEGRADED", node_status={1: "WAITING_FOR_PEERS"}))
        host.slurm_jobs[42] = SlurmJob(42, "RUNNING", "gb[01-03]")
        rt = _rt(_known(host), make_settings, readiness={"deadline_s": 2})
        with pytest.raises(HealthTimeout):
            prolog(_env(root), rt)
        assert _reason(host) == "imex:not_ready gb01 job 42: peers gb02 not ready"

    def test_a_job_that_went_away_drains_nothing(self, host: FakeHost, make_settings: Callable[..., Settings],
                                                 root: Path) -> None:  # fmt: skip
        """Cancelled while the prologs waited: exit 0, and no reason is set (the node is not drained)."""
        host.domain = lambda hosts: (0, domain_json(hosts, status="DEGRADED", node_status={1: "UNAVAILABLE"},
                                                    conn_status="INVALID"))  # fmt: skip
        host.reach = {"10.0.0.2": "refused", "10.0.0.3": "refused"}
        host.slurm_jobs[42] = SlurmJob(42, "CANCELLED", "gb[01-03]")
        rt = _rt(_known(host), make_settings, readiness={"deadline_s": 2})
        assert prolog(_env(root), rt).job_ended == "CANCELLED"
        assert _reason(host) is None and _updates(host) == []

    def test_a_shared_job_is_skipped_without_a_drain(self, host: FakeHost, make_settings: Callable[..., Settings],
                                                     root: Path) -> None:  # fmt: skip
        """The job's request (it may share its trays) is no fault of the tray: nothing is asked of slurmctld."""
        rt = _rt(host, make_settings)
        assert prolog(_env(root) | {"SLURM_JOB_OVERSUBSCRIBE": "OK"}, rt).skipped
        assert host.calls == []

    def test_other_faults_of_the_tray_set_their_own_code(self, host: FakeHost,
                                                         make_settings: Callable[..., Settings],
                                                         root: Path) -> None:  # fmt: skip
        """A port taken on this tray by a local user's listener: ``imex:port_held`` naming the holder (issue 41:
        ``imex:domain_busy ... is in use (a stale IMEX daemon?)`` before, whoever held it)."""
        host.ports_in_use.add(("10.0.0.1", 61042))
        user = host.add_process(["python3", "-m", "http.server", "61042"], uid=1501)
        host.sockets = [TcpSocket("10.0.0.1", 61042, "LISTEN", 1501, 1, user, "imexlab")]
        rt = _rt(_known(host), make_settings)
        with pytest.raises(PortHeldError):
            prolog(_env(root), rt)
        assert _reason(host) == (
            f"imex:port_held gb01 job 42: SERVER_PORT gb01:61042 is held by pid {user.pid} (uid 1501 imexlab: python3 -m "
            "http.server 61042), not an IMEX daemon: a local user's; end it, and keep users off the [ports] ranges "
            "with the port guard, docs/security.md"
        )

    def test_off_or_outside_slurmd_nothing_is_asked(self, host: FakeHost, make_settings: Callable[..., Settings],
                                                    root: Path) -> None:  # fmt: skip
        """``[slurm] drain_reason = no``, or no SLURM_CONF (a prolog run by hand): Slurm's reason stands."""
        host.ready_after = 10**6
        for rt, env in (
            (_rt(host, make_settings, readiness={"deadline_s": 1}, slurm={"drain_reason": "no"}), _env(root)),
            (_rt(host, make_settings, readiness={"deadline_s": 1}), job_env(job_id=42, nodelist="gb[01-03]")),
        ):
            with pytest.raises(HealthTimeout):
                prolog(env, rt)
        assert _updates(host) == []

    @pytest.mark.parametrize("how", ["hangs", "refused"])
    def test_a_failure_to_set_it_changes_nothing_else(self, host: FakeHost, make_settings: Callable[..., Settings],
                                                      root: Path, how: str) -> None:  # fmt: skip
        """scontrol that hangs (bounded by query_timeout_s) or is refused: a warning, the same exit code."""
        host.ready_after = 10**6
        host.scontrol_hangs = how == "hangs"
        if how == "hangs":
            _known(host)  # else slurmctld refuses it: it does not know the node
        rt = _rt(host, make_settings, readiness={"deadline_s": 2}, slurm={"query_timeout_s": 1.5})
        with capture_logs() as logs, pytest.raises(HealthTimeout) as info:
            prolog(_env(root), rt)
        assert int(info.value.exit_code) == 75 and _reason(host) is None
        (failed,) = [e for e in logs if e["event"] == "slurm.drain_failed"]
        assert failed["log_level"] == "warning" and failed["drain_reason"].startswith("imex:not_ready gb01 job 42: ")
        assert ("no answer within 1.5s" if how == "hangs" else "exit 1: slurm_update error") in failed["problem"]
        assert host.now - 1000.0 <= 2 + 1.5 + 0.5


def test_the_epilog_of_a_lost_daemon_names_its_code(host: FakeHost, make_settings: Callable[..., Settings],
                                                     root: Path) -> None:  # fmt: skip
    """``[policy] lost_daemon = drain``: the epilog drains its node with ``imex:daemon_lost``, not 'Epilog error'."""
    rt = _rt(_known(host), make_settings, policy={"lost_daemon": "drain"})
    env = _env(root) | {"SLURM_JOB_NODELIST": "gb01", "SLURM_NODELIST": "gb01"}
    prolog(env, rt)
    for p in host.procs.values():
        p.alive = False
    with pytest.raises(DaemonLostError):
        epilog(env, rt)
    text = _reason(host) or ""
    assert text.startswith("imex:daemon_lost gb01 job 42: the IMEX daemon of job 42 ended before the job: not running")


class TestConfigThatDoesNotLoad:
    """Exit 78 before the hook reads anything else: the tray is drained with ``imex:config_invalid <tray> job <id>:
    <file>:<line>: ...``, not Slurm's ``Prolog error``; by the built-in settings, nothing of the file that failed."""

    @staticmethod
    def _main(config: Path, command: str, env: dict[str, str], host: FakeHost) -> int:
        from imexctl import cli

        return cli.main(["--config", str(config), command], env=env, host=host, gpu=FakeGpu())

    @pytest.mark.parametrize("command", ["prolog", "epilog"])
    def test_the_reason_names_the_file_and_line(self, root: Path, host: FakeHost, command: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
        bad = root / "imexctl.conf"
        bad.write_text("[slurm]\ndrain_reason = no\n[commands]\nscontrol = /opt/evil/scontrol\n[readiness]\nsoon = 1\n")
        env = _env(root)
        assert self._main(bad, command, env, _known(host)) == 78
        assert _reason(host) == f"imex:config_invalid gb01 job 42: {bad}:6: [readiness] soon: unknown key"
        # the built-in scontrol and timeout, SLURM_CONF as slurmd gave it: the file that failed counts for nothing
        assert _updates(host) == [("/usr/bin/scontrol", "update", "NodeName=gb01", "State=DRAIN",
                                   f"Reason={_reason(host)}")]  # fmt: skip
        assert host.envs == [(_updates(host)[0], {"SLURM_CONF": env["SLURM_CONF"]})]
        assert '"error_code": "config_invalid"' in capsys.readouterr().err  # the hook's own line, as before

    def test_outside_slurmd_or_for_cleanup_nothing_is_asked(self, root: Path, host: FakeHost) -> None:
        """No SLURM_CONF (a hook run by hand), or an admin's cleanup: exit 78 and Slurm is never asked."""
        bad = root / "imexctl.conf"
        bad.write_text("[readiness]\nsoon = 1\n")
        assert self._main(bad, "prolog", job_env(job_id=42, nodelist="gb[01-03]"), _known(host)) == 78
        assert self._main(bad, "cleanup", _env(root), host) == 78
        assert host.calls == []

    def test_an_unusable_job_id_leaves_the_reason_without_a_job(self, root: Path, host: FakeHost) -> None:
        bad = root / "imexctl.conf"
        bad.write_text("[readiness]\nsoon = 1\n")
        assert self._main(bad, "prolog", _env(root) | {"SLURM_JOB_ID": "42x"}, _known(host)) == 78
        assert (_reason(host) or "").startswith("imex:config_invalid gb01: ")

    def test_a_failed_drain_changes_nothing_else(self, root: Path, host: FakeHost,
                                                 capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
        """slurmctld refuses (it does not know the node): a warning, the same exit code."""
        bad = root / "imexctl.conf"
        bad.write_text("[readiness]\nsoon = 1\n")
        assert self._main(bad, "prolog", _env(root), host) == 78
        assert '"event": "slurm.drain_failed"' in capsys.readouterr().err

    def test_a_hook_not_run_as_root_names_itself(self, host: FakeHost, make_settings: Callable[..., Settings],
                                                 root: Path) -> None:  # fmt: skip
        """Exit 77 (slurmd runs the hooks as another user): ``imex:not_root``, with the config that loaded."""
        make_settings()
        host.euid_value = 1501
        assert self._main(root / "imexctl.conf", "prolog", _env(root), _known(host)) == 77
        assert _reason(host) == "imex:not_root gb01 job 42: imexctl prolog must run as root"
