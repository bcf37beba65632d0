"""``[resolve] method = slurm_conf``: tray addresses from slurm.conf's NodeAddr, and this tray's own address (issue 22)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
import structlog

from imexctl.config.settings import Settings
from imexctl.hooks import members
from imexctl.hooks.prolog import prolog
from imexctl.hooks.runtime import Runtime
from imexctl.platform.errors import ConfigError, ResolveError
from imexctl.platform.host import RealHost
from imexctl.slurm import conf as slurmconf
from imexctl.slurm import nodeaddr
from tests.support.fakes import FakeGpu, FakeHost, job_env


def _conf(tmp_path: Path, text: str) -> slurmconf.SlurmConf:
    path = tmp_path / "slurm.conf"
    path.write_text(text)
    return slurmconf.read(path)


class TestAddresses:
    @pytest.mark.parametrize(
        ("text", "want"),
        [
            pytest.param(
                "NodeName=gb[01-03] NodeAddr=10.0.0.[1-3] CPUs=144\n",
                {"gb01": "10.0.0.1", "gb02": "10.0.0.2", "gb03": "10.0.0.3"},
                id="host-lists-paired",
            ),
            pytest.param(
                "NodeName=gb[01-02] NodeAddr=10.0.[0-1].5\n",
                {"gb01": "10.0.0.5", "gb02": "10.0.1.5"},
                id="range-inside",
            ),
            pytest.param("nodename=gb07 nodeaddr=10.1.2.3\n", {"gb07": "10.1.2.3"}, id="keys-any-case"),
            pytest.param("NodeName=gb01 NodeHostname=tray-a\n", {"gb01": "tray-a"}, id="nodehostname-fallback"),
            pytest.param("NodeName=gb[01-02] CPUs=4\n", {"gb01": "gb01", "gb02": "gb02"}, id="no-addr-is-the-name"),
            pytest.param(
                "NodeName=DEFAULT CPUs=144\nNodeName=gb01 NodeAddr=10.0.0.1\n",
                {"gb01": "10.0.0.1"},
                id="default-skipped",
            ),
            pytest.param(
                "NodeName=gb01 NodeAddr=10.0.0.1 \\\n  CPUs=4\nNodeName=gb02,gb03 NodeAddr=10.0.0.2,10.0.0.3\n",
                {"gb01": "10.0.0.1", "gb02": "10.0.0.2", "gb03": "10.0.0.3"},
                id="continuation-and-commas",
            ),
        ],
    )
    def test_node_lines(self, tmp_path: Path, text: str, want: dict[str, str]) -> None:
        """NodeName and NodeAddr host lists expand and pair in order, as Slurm does."""
        assert nodeaddr.addresses(_conf(tmp_path, "ClusterName=x\n" + text)) == want

    def test_an_included_file_counts(self, tmp_path: Path) -> None:
        """Node lines in an Include'd file are read too."""
        (tmp_path / "nodes.conf").write_text("NodeName=gb01 NodeAddr=10.0.0.9\n")
        assert nodeaddr.read(_conf(tmp_path, "Include nodes.conf\n").path) == {"gb01": "10.0.0.9"}

    @pytest.mark.parametrize(
        ("text", "match"),
        [
            pytest.param("NodeName=gb[01-03] NodeAddr=10.0.0.[1-2]\n", "names 3 nodes but NodeAddr", id="count"),
            pytest.param("NodeName=gb01 NodeAddr=10.0.0.1\nNodeName=gb01 NodeAddr=10.0.0.2\n", "twice", id="dup"),
            pytest.param("NodeName=gb[01-02 NodeAddr=10.0.0.1\n", "NodeName=gb\\[01-02", id="bad-list"),
        ],
    )
    def test_inconsistent_node_lines_are_config_errors(self, tmp_path: Path, text: str, match: str) -> None:
        """Counts that do not pair, a node defined twice, a bad host list: ConfigError naming it."""
        with pytest.raises(ConfigError, match=match):
            nodeaddr.addresses(_conf(tmp_path, text))


class TestConfPath:
    def test_the_jobs_slurm_conf_wins(self, tmp_path: Path) -> None:
        """$SLURM_CONF from the job's environment is the file slurmd uses."""
        assert nodeaddr.conf_path("/etc/slurm/slurm.conf", tmp_path) == Path("/etc/slurm/slurm.conf")

    @pytest.mark.parametrize("cache", nodeaddr.CONFIGLESS)
    def test_configless_caches_under_root(self, tmp_path: Path, cache: str) -> None:
        """Without $SLURM_CONF, slurmd's configless copy is read (under [paths] root)."""
        path = tmp_path / cache.lstrip("/")
        path.parent.mkdir(parents=True)
        path.write_text("")
        assert nodeaddr.conf_path("", tmp_path) == path

    def test_nothing_found_says_so(self, tmp_path: Path) -> None:
        """No $SLURM_CONF and no cache: a ConfigError naming both places and the other method."""
        with pytest.raises(ConfigError, match="no configless copy.*method = dns"):
            nodeaddr.conf_path("", tmp_path)


class TestResolve:
    def test_addresses_as_written_names_by_dns(self) -> None:
        """An IP NodeAddr is taken as written; a name (or no NodeAddr) is resolved as dns does."""
        host = FakeHost(addresses={"tray-b": ["10.0.0.2"], "gb03": ["10.0.0.3", "::1"]})
        table = {"gb01": "10.0.0.1", "gb02": "tray-b"}
        got = members.resolve_all(
            ["gb01", "gb02", "gb03"], method="slurm_conf", host=host, hosts_file=Path("/x"), node_addrs=table
        )
        assert got == ("10.0.0.1", "10.0.0.2", "10.0.0.3")

    @pytest.mark.parametrize("addr", ["127.0.1.1", "0.0.0.0", "224.0.0.1", "fd00::1"])
    def test_unusable_node_addr_is_refused_with_the_fix(self, addr: str) -> None:
        """Loopback, unspecified, multicast or IPv6 NodeAddr: refused, saying to set NodeAddr."""
        with pytest.raises(ResolveError, match=f"gb01: NodeAddr {addr} in slurm.conf.*set NodeAddr"):
            members.resolve_all(
                ["gb01"], method="slurm_conf", host=FakeHost(), hosts_file=Path("/x"), node_addrs={"gb01": addr}
            )

    def test_dns_names_the_127_0_1_1_trap(self) -> None:
        """dns: a name that maps only to loopback (DGX OS's 127.0.1.1) says how to fix it."""
        host = FakeHost(addresses={"gb01": ["127.0.1.1"]})
        with pytest.raises(ResolveError, match="127.0.1.1 in /etc/hosts.*method = slurm_conf"):
            members.resolve_all(["gb01"], method="dns", host=host, hosts_file=Path("/x"))


class TestProlog:
    def _rt(self, make_settings: Callable[..., Settings], host: FakeHost, **sections: Any) -> Runtime:
        return Runtime(host, FakeGpu(), make_settings(**sections), structlog.get_logger())

    def test_nodes_file_from_node_addr(
        self, make_settings: Callable[..., Settings], host: FakeHost, tmp_path: Path, root: Path
    ) -> None:
        """method = slurm_conf: the nodes file holds each tray's NodeAddr from the job's slurm.conf."""
        conf = tmp_path / "slurm.conf"
        conf.write_text("NodeName=gb[01-02] NodeAddr=10.9.0.[11-12]\n")
        host.addresses.clear()  # nothing comes from the resolver
        rt = self._rt(make_settings, host, resolve={"method": "slurm_conf"})
        assert prolog(job_env(job_id=42, SLURM_CONF=str(conf)), rt).ok
        assert (root / "run/imexctl/jobs/42/nodes_config.cfg").read_text() == "10.9.0.11\n10.9.0.12\n"

    @pytest.mark.parametrize("method", ["dns", "slurm_conf"])
    def test_own_address_not_local_fails_before_anything_starts(
        self, make_settings: Callable[..., Settings], host: FakeHost, tmp_path: Path, method: str
    ) -> None:
        """This tray's address on none of its interfaces: resolve_failed (69) with the fix, no daemon started."""
        conf = tmp_path / "slurm.conf"
        conf.write_text("NodeName=gb[01-02] NodeAddr=10.0.0.[1-2]\n")
        host.local_addresses = {"10.0.0.99"}
        rt = self._rt(make_settings, host, resolve={"method": method})
        fix = "NodeAddr= in slurm.conf" if method == "slurm_conf" else "127.0.1.1"
        with pytest.raises(ResolveError, match=f"gb01 resolves to 10.0.0.1.*none of its interfaces.*{fix}"):
            prolog(job_env(job_id=42, SLURM_CONF=str(conf)), rt)
        assert not [c for c in host.calls if c[0] == "spawn"] and ResolveError.exit_code == 69


def test_real_host_knows_its_own_addresses() -> None:
    """Loopback binds; a TEST-NET address (RFC 5737) is on no interface here."""
    assert RealHost().is_local_address("127.0.0.1")
    assert not RealHost().is_local_address("192.0.2.1")
