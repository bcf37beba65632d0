"""imexconf: the job's complete config.cfg and nodes_config.cfg (design.md source imex-config, imex-nodes)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from imexctl.config.schema import AUTH_IMEX_KEYS, IMEX_KEYS, OWNED_IMEX_KEYS
from imexctl.imex.config import DEFAULTS, job_port, nodes_hash, render_config, render_nodes

RENDER_ARGS: dict[str, Any] = {
    "job_id": 42,
    "port": 61042,
    "cmd_port": 62042,
    "bind_ip": "10.0.0.1",
    "nodes_path": Path("/run/imexctl/jobs/42/nodes"),
    "log_file": Path("/var/log/nvidia-imex.log"),
    "overrides": {},
}


def render(overrides: Mapping[str, str] = {}) -> str:
    return render_config(**{**RENDER_ARGS, "overrides": overrides})


def assignments(text: str) -> list[list[str]]:
    """KEY=value lines split once at '=' (comment and blank lines left out)."""
    return [line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#")]


def as_dict(text: str) -> dict[str, str]:
    return dict(assignments(text))  # type: ignore[arg-type]


class TestRenderConfig:
    def test_every_owned_key_exactly_once(self) -> None:
        """Each key imexctl owns appears exactly once (the authentication keys: with TLS on), so no daemon
        default decides it."""
        tls = dict.fromkeys(AUTH_IMEX_KEYS, "1")
        keys = [k for k, _ in assignments(render_config(**{**RENDER_ARGS, "auth": tls}))]
        assert {k: keys.count(k) for k in OWNED_IMEX_KEYS} == dict.fromkeys(OWNED_IMEX_KEYS, 1)

    def test_authentication_is_off_by_default(self) -> None:
        """Without [auth] the file says IMEX_ENABLE_AUTH_ENCRYPTION=0 and names no key or mode."""
        cfg = as_dict(render())
        assert cfg["IMEX_ENABLE_AUTH_ENCRYPTION"] == "0"
        assert AUTH_IMEX_KEYS & set(cfg) == {"IMEX_ENABLE_AUTH_ENCRYPTION"}

    def test_no_key_twice(self) -> None:
        """No key is written twice, even with overrides for every overridable key."""
        keys = [k for k, _ in assignments(render(dict.fromkeys(IMEX_KEYS, "1")))]
        assert len(keys) == len(set(keys))

    def test_owned_values(self) -> None:
        """The owned keys carry the job's port, address, paths and a foreground daemon."""
        cfg = as_dict(render())
        assert cfg["SERVER_PORT"] == "61042" and cfg["BIND_INTERFACE_IP"] == "10.0.0.1"
        assert cfg["IMEX_NODE_CONFIG_FILE"] == "/run/imexctl/jobs/42/nodes"
        assert cfg["LOG_FILE_NAME"] == "/var/log/nvidia-imex.log"
        assert (cfg["DAEMONIZE"], cfg["IMEX_CMD_ENABLED"]) == ("0", "1")

    def test_command_service_on_the_trays_own_address(self) -> None:
        """-N asks every tray's command service over the network (kubernetes-sigs/dra-driver-nvidia-gpu
        PR #540): it listens on the tray's own address and the job's explicit port, with no Unix socket."""
        cfg = as_dict(render())
        assert (cfg["IMEX_CMD_ENABLED"], cfg["IMEX_CMD_PORT"]) == ("1", "62042")
        assert cfg["IMEX_CMD_BIND_INTERFACE_IP"] == cfg["BIND_INTERFACE_IP"] == "10.0.0.1"
        assert cfg["IMEX_CMD_UNIX_DOMAIN_PATH"] == ""

    def test_comments_only_on_their_own_lines(self) -> None:
        """Every line is a comment or KEY=value with no '#' in the value (trailing comments are unsafe)."""
        lines = render().splitlines()
        assert any(line.startswith("#") for line in lines)
        for line in lines:
            if not line.startswith("#"):
                key, sep, value = line.partition("=")
                assert sep and key.isupper() and key.replace("_", "").isalnum(), line
                assert "#" not in value, line

    def test_ends_with_one_newline(self) -> None:
        """The file ends with exactly one newline and has no blank lines."""
        text = render()
        assert text.endswith("\n") and "\n\n" not in text

    def test_defaults_written_when_not_overridden(self) -> None:
        """Every shipped default imexctl keeps is written, e.g. quorum NONE for a fresh per-job domain."""
        cfg = as_dict(render())
        assert {k: cfg[k] for k in DEFAULTS} == dict(DEFAULTS)
        assert cfg["IMEX_WAIT_FOR_QUORUM"] == "NONE"

    @pytest.mark.parametrize(
        ("key", "value"),
        [
            pytest.param("IMEX_WAIT_FOR_QUORUM", "RECOVERY", id="replace-default"),
            pytest.param("STATS_FILE_NAME", "/var/log/s.log", id="add-key"),
            pytest.param("NETWORK_INTERFACE", "ib0", id="empty-default"),
        ],
    )
    def test_override_applied(self, key: str, value: str) -> None:
        """An [imex] override replaces or adds its key, once."""
        text = render({key: value})
        assert as_dict(text)[key] == value
        assert [k for k, _ in assignments(text)].count(key) == 1

    def test_same_inputs_same_text(self) -> None:
        """Rendering is deterministic (override order does not matter)."""
        assert render({"LOG_LEVEL": "2", "LOG_USE_SYSLOG": "1"}) == render({"LOG_USE_SYSLOG": "1", "LOG_LEVEL": "2"})


class TestJobPort:
    @pytest.mark.parametrize("job_id", [1, 999, 1000, 1001, 123456789])
    def test_inside_range(self, job_id: int) -> None:
        """The port is always inside the configured range, bounds included."""
        assert 61000 <= job_port(job_id, (61000, 61999)) <= 61999

    def test_stable_for_a_job(self) -> None:
        """The port depends only on job id and range, so every tray of the job agrees."""
        assert job_port(42, (61000, 61999)) == job_port(42, (61000, 61999)) == 61042

    def test_consecutive_jobs_differ(self) -> None:
        """Consecutive jobs get different ports (a stale daemon of the previous job cannot answer)."""
        assert job_port(42, (61000, 61999)) != job_port(43, (61000, 61999))

    def test_single_port_range(self) -> None:
        """A one-port range always gives that port."""
        assert {job_port(j, (50000, 50000)) for j in range(1, 10)} == {50000}

    def test_wraps_around(self) -> None:
        """Job ids beyond the range size wrap around to the start."""
        assert job_port(1000, (61000, 61999)) == 61000 and job_port(1999, (61000, 61999)) == 61999


class TestRenderNodes:
    def test_one_address_per_line_with_trailing_newline(self) -> None:
        """Addresses are written one per line, in order, each ending in a newline, nothing else."""
        assert render_nodes(["10.0.0.2", "10.0.0.1", "fd00::3"]) == "10.0.0.2\n10.0.0.1\nfd00::3\n"

    def test_single_node(self) -> None:
        """A one-tray domain is one line."""
        assert render_nodes(["10.0.0.1"]) == "10.0.0.1\n"

    def test_hash_depends_on_order(self) -> None:
        """The logged hash changes with the order, since line position is the IMEX node id."""
        a, b = nodes_hash(["10.0.0.1", "10.0.0.2"]), nodes_hash(["10.0.0.2", "10.0.0.1"])
        assert a != b and len(a) == 16 and a == nodes_hash(("10.0.0.1", "10.0.0.2"))
