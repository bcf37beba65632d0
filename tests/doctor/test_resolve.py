"""doctor's resolve.self and resolve.nodes: names resolved as the prolog resolves them (issue 22)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest
import structlog

from imexctl.cli import main
from imexctl.config.settings import Settings
from imexctl.doctor import framework as doctor
from imexctl.doctor import resolve as resolvecheck
from imexctl.hooks.runtime import Runtime
from tests.support.fakes import FakeGpu, FakeHost


def _checks(
    make_settings: Callable[..., Settings],
    host: FakeHost,
    *,
    nodes: str = "",
    slurm_conf: Path | None = None,
    **kw: Any,
) -> dict[str, doctor.Check]:
    rt = Runtime(host, FakeGpu(), make_settings(**kw), structlog.get_logger())
    ctx = doctor.Context(rt, {}, "gb01", slurm_conf, nodes=nodes)
    return {c.name: c for c in resolvecheck.checks(ctx)}


class TestSelf:
    def test_own_name_on_a_local_interface_is_ok(self, make_settings: Any, host: FakeHost) -> None:
        """dns: gb01 is 10.0.0.1, an address of this tray."""
        check = _checks(make_settings, host)["resolve.self"]
        assert check.status == doctor.OK and "gb01 is 10.0.0.1" in check.message

    def test_loopback_only_fails_with_the_127_0_1_1_hint(self, make_settings: Any, host: FakeHost) -> None:
        """dns: the DGX OS /etc/hosts line (own name -> 127.0.1.1) fails, naming the fix."""
        host.addresses["gb01"] = ["127.0.1.1"]
        check = _checks(make_settings, host)["resolve.self"]
        assert check.status == doctor.FAIL and "127.0.1.1 in /etc/hosts" in check.message

    def test_an_address_of_another_machine_fails(self, make_settings: Any, host: FakeHost) -> None:
        """The name resolves, but to an address on none of this tray's interfaces."""
        host.local_addresses = {"10.0.0.2"}
        check = _checks(make_settings, host)["resolve.self"]
        assert check.status == doctor.FAIL and "10.0.0.1" in check.message and "none of its interfaces" in check.message

    def test_several_ipv4_addresses_fail(self, make_settings: Any, host: FakeHost) -> None:
        """dns: two IPv4 addresses are ambiguous (trays could pick differently)."""
        host.addresses["gb01"] = ["10.0.0.1", "10.1.0.1"]
        assert _checks(make_settings, host)["resolve.self"].status == doctor.FAIL

    def test_slurm_conf_method_reads_node_addr(self, make_settings: Any, host: FakeHost, tmp_path: Path) -> None:
        """slurm_conf: this tray's NodeAddr from --slurm-conf; the resolver is not asked."""
        conf = tmp_path / "slurm.conf"
        conf.write_text("NodeName=gb[01-02] NodeAddr=10.7.0.[1-2]\n")
        host.addresses.clear()
        check = _checks(make_settings, host, slurm_conf=conf, resolve={"method": "slurm_conf"})["resolve.self"]
        assert check.status == doctor.OK and "10.7.0.1" in check.message

    def test_slurm_conf_method_without_a_slurm_conf_fails(self, make_settings: Any, host: FakeHost) -> None:
        """slurm_conf with no slurm.conf anywhere under the root: FAIL saying where it looked."""
        check = _checks(make_settings, host, resolve={"method": "slurm_conf"})["resolve.self"]
        assert check.status == doctor.FAIL and "configless" in check.message


class TestNodes:
    def test_a_clean_rack_is_ok_with_its_nodes_hash(self, make_settings: Any, host: FakeHost) -> None:
        """18 names, 18 distinct addresses: OK with the hash every tray's prolog would log."""
        check = _checks(make_settings, host, nodes="gb[01-18]")["resolve.nodes"]
        assert check.status == doctor.OK and "gb[01-18]: 18 distinct addresses; nodes file hash" in check.message

    def test_failures_and_duplicates_are_named(self, make_settings: Any, host: FakeHost) -> None:
        """A name that does not resolve and two names sharing an address are each reported."""
        del host.addresses["gb03"]
        host.addresses["gb04"] = ["10.0.0.2"]
        check = _checks(make_settings, host, nodes="gb[01-04]")["resolve.nodes"]
        assert check.status == doctor.FAIL and check.message.startswith("2 problem(s)")
        assert "gb03: " in check.message and "gb[02,04] all resolve to 10.0.0.2" in check.message

    def test_a_bad_host_list_fails(self, make_settings: Any, host: FakeHost) -> None:
        """--nodes must be a Slurm host list."""
        check = _checks(make_settings, host, nodes="gb[01-")["resolve.nodes"]
        assert check.status == doctor.FAIL and "--nodes gb[01-" in check.message

    def test_without_nodes_there_is_no_rack_check(self, make_settings: Any, host: FakeHost) -> None:
        """Plain doctor checks only this tray's name."""
        assert list(_checks(make_settings, host)) == ["resolve.self"]


def test_cli_doctor_nodes(make_settings: Any, host: FakeHost, capsys: pytest.CaptureFixture[str]) -> None:
    """imexctl doctor --nodes LIST --json reports resolve.nodes among the checks."""
    cfg = str(make_settings().source)
    del host.addresses["gb02"]
    main(["--config", cfg, "doctor", "--json", "--nodes", "gb[01-02]"], env={"SLURMD_NODENAME": "gb01"}, host=host,
         gpu=FakeGpu())  # fmt: skip
    data = {c["name"]: c for c in json.loads(capsys.readouterr().out)["data"]}
    assert data["resolve.self"]["status"] == "OK" and data["resolve.nodes"]["status"] == "FAIL"
    assert "gb02" in data["resolve.nodes"]["message"]
