"""IMEX peer authentication (``[auth]``, imexctl/imex/peerauth.py): settings, file checks, config.cfg, daemon environment.

The same refusals run through the whole prolog, one corpus case each, in
tests/corpus/config.py (``AUTH``, run by tests/corpus/test_config.py, which also
checks that each leaves the tray clean).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable

import pytest
import structlog

from imexctl.config.settings import Settings
from imexctl.doctor import framework as doctor
from imexctl.doctor import run as doctor_run
from imexctl.hooks.prolog import prolog
from imexctl.hooks.runtime import Runtime
from imexctl.imex import peerauth
from imexctl.imex.config import render_config
from imexctl.imex.daemon import SystemdBackend
from imexctl.platform.errors import ConfigError, DaemonError, ExitCode
from imexctl.platform.host import SAFE_ENV, RealHost
from imexctl.sim.config import SimConfigError, parse_config_text
from tests.support.fakes import FakeGpu, FakeHost, job_env

REPO = Path(__file__).resolve().parents[2]
TLS_DIR = "etc/nvidia-imex/tls"
KEY, CRT, CA = f"{TLS_DIR}/tray.key", f"{TLS_DIR}/tray.crt", f"{TLS_DIR}/rack-ca.crt"
TLS_KEYS = {
    "server_key": "/" + KEY,
    "server_cert": "/" + CRT,
    "server_cert_auth": "/" + CA,
    "client_key": "/" + KEY,
    "client_cert": "/" + CRT,
    "client_cert_auth": "/" + CA,
}
TLS = {"enabled": "yes", **TLS_KEYS}
GSS = {"enabled": "yes", "mode": "GSS_AUTH_ENCRYPT"}


@pytest.fixture
def tls_files(root: Path) -> Path:
    """A tray's key (0600), certificate and rack CA (0644) in a root-only directory under ``root``."""
    (root / TLS_DIR).mkdir(parents=True, mode=0o700)
    for rel, mode in ((KEY, 0o600), (CRT, 0o644), (CA, 0o644)):
        (root / rel).write_text(f"-----BEGIN {rel}-----\nAA==\n-----END {rel}-----\n")
        os.chmod(root / rel, mode)
    return root


@pytest.fixture
def keytab(root: Path) -> Path:
    """The host keytab, root's, 0600."""
    path = root / "etc/krb5.keytab"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x05\x02keytab")
    path.chmod(0o600)
    return path


def config_cfg(root: Path, job_id: int = 42) -> dict[str, str]:
    text = (root / f"run/imexctl/jobs/{job_id}/config.cfg").read_text()
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))  # type: ignore[misc]


def run_prolog(settings: Settings, host: FakeHost) -> dict[str, Any]:
    return prolog(job_env(), Runtime(host, FakeGpu(), settings, structlog.get_logger()))


# ---------------------------------------------------------------- settings


class TestSettings:
    def test_off_by_default(self, make_settings: Callable[..., Settings]) -> None:
        """Without [auth] authentication is off and config.cfg gets only IMEX_ENABLE_AUTH_ENCRYPTION=0."""
        s = make_settings()
        assert s.auth.enabled == "no"
        assert peerauth.config_values(s.auth, s.paths.root) == {"IMEX_ENABLE_AUTH_ENCRYPTION": "0"}
        assert peerauth.files(s) == []

    @pytest.mark.parametrize(
        ("sections", "message"),
        [
            pytest.param(
                {"auth": {"server_key": "/k"}}, "[auth] server_key: is set but [auth] enabled = no", id="key-off"
            ),
            pytest.param(
                {"auth": {"enabled": "yes", **{k: v for k, v in TLS_KEYS.items() if k != "client_cert_auth"}}},
                "[auth] client_cert_auth: is required with mode = SSL_TLS",
                id="tls-without-client-ca",
            ),
            pytest.param({"auth": {"enabled": "yes"}}, "[auth] server_key: is required", id="tls-without-files"),
            pytest.param(
                {"auth": {**GSS, "client_cert": "/c"}},
                "[auth] client_cert: is a TLS setting, but mode = GSS_AUTH_ENCRYPT",
                id="tls-key-with-gss",
            ),
            pytest.param(
                {"imex": {"IMEX_GSS_SHUTDOWN_ON_FAILURE": "0"}},
                "[imex] IMEX_GSS_SHUTDOWN_ON_FAILURE: is a GSSAPI setting but [auth] enabled = no",
                id="gss-tuning-off",
            ),
            pytest.param(
                {"auth": TLS, "imex": {"IMEX_GSS_TIMEOUT_SEC": "30"}},
                "[imex] IMEX_GSS_TIMEOUT_SEC: is a GSSAPI setting, but [auth] mode = SSL_TLS",
                id="gss-tuning-with-tls",
            ),
            pytest.param(
                {"imex": {"IMEX_ENABLE_AUTH_ENCRYPTION": "1"}},
                "[imex] IMEX_ENABLE_AUTH_ENCRYPTION: is set by imexctl from [auth]",
                id="imex-enable",
            ),
            pytest.param(
                {"imex": {"IMEX_AUTH_SOURCE": "ENV_VAL"}},
                "[imex] IMEX_AUTH_SOURCE: is set by imexctl from [auth]",
                id="imex-source",
            ),
            pytest.param({"auth": {"mode": "TLS"}}, "[auth] mode: 'TLS' must be one of SSL_TLS", id="mode-spelling"),
            pytest.param(
                {"auth": {**TLS, "server_key": "etc/tray.key"}},
                "[auth] server_key: 'etc/tray.key' must be an absolute path",
                id="relative",
            ),
            pytest.param(
                {"auth": {**TLS, "security_target_override": "a b"}},
                "[auth] security_target_override: 'a b' must be a host name",
                id="override-blank",
            ),
        ],
    )
    def test_inconsistent_keys_are_refused_at_load(
        self, make_settings: Callable[..., Settings], sections: dict[str, dict[str, str]], message: str
    ) -> None:
        """Keys that do not fit enabled and mode are a config error (exit 78) naming section and key."""
        with pytest.raises(ConfigError) as err:
            make_settings(**sections)
        assert message in str(err.value) and "imexctl.conf: " in str(err.value)
        assert err.value.exit_code == ExitCode.CONFIG == 78

    def test_gss_tuning_keys_pass_with_a_gss_mode(self, make_settings: Callable[..., Settings]) -> None:
        """[imex] IMEX_GSS_* keys are accepted with a GSSAPI mode."""
        s = make_settings(auth=GSS, imex={"IMEX_GSS_SERVICE_NAME": "imex"})
        assert s.imex == {"IMEX_GSS_SERVICE_NAME": "imex"} and s.auth.mode == "GSS_AUTH_ENCRYPT"


# ---------------------------------------------------------------- the files


def _chmod(rel: str, mode: int) -> Callable[[Path], None]:
    return lambda root: os.chmod(root / rel, mode)


def _chown(rel: str) -> Callable[[Path], None]:
    return lambda root: os.chown(root / rel, 1000, -1)


def _replace(rel: str, kind: str) -> Callable[[Path], None]:
    def act(root: Path) -> None:
        path = root / rel
        path.rename(path.with_name("real"))
        if kind == "symlink":
            path.symlink_to(path.with_name("real"))
        elif kind == "fifo":
            os.mkfifo(path)
        elif kind == "dir":
            path.mkdir()

    return act


def _empty(rel: str) -> Callable[[Path], None]:
    return lambda root: (root / rel).write_bytes(b"")


ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: chown to another uid")
BREAKS = [
    pytest.param(
        _chmod(KEY, 0o640), ["[auth] server_key:", "[auth] client_key:", "mode 0640", "chmod 0600"], id="key-0640"
    ),
    pytest.param(_chmod(KEY, 0o604), ["[auth] server_key:", "readable or writable by group or others"], id="key-0604"),
    pytest.param(
        _chmod(CRT, 0o664), ["[auth] server_cert:", "is writable by group or others (mode 0664)"], id="crt-0664"
    ),
    pytest.param(_chmod(CA, 0o666), ["[auth] client_cert_auth:", "mode 0666"], id="ca-0666"),
    pytest.param(_chown(KEY), ["[auth] server_key:", "owned by uid 1000, not root"], id="key-owner", marks=ROOT_ONLY),
    pytest.param(_chown(CA), ["[auth] server_cert_auth:", "owned by uid 1000"], id="ca-owner", marks=ROOT_ONLY),
    pytest.param(_replace(KEY, "missing"), [f"[auth] server_key: {{root}}/{KEY}: does not exist"], id="key-missing"),
    pytest.param(_replace(CRT, "symlink"), ["[auth] client_cert:", "is a symbolic link (not followed)"], id="crt-link"),
    pytest.param(_replace(CA, "fifo"), ["[auth] server_cert_auth:", "is not a regular file"], id="ca-fifo"),
    pytest.param(_replace(KEY, "dir"), ["[auth] client_key:", "is not a regular file"], id="key-dir"),
    pytest.param(_empty(CA), ["[auth] client_cert_auth:", "is empty"], id="ca-empty"),
    pytest.param(
        _chmod(TLS_DIR, 0o777),
        [
            "[auth] server_key, server_cert, server_cert_auth, client_key, client_cert, client_cert_auth:",
            f"directory {{root}}/{TLS_DIR} must be owned by root",
            "mode 0777",
        ],
        id="dir-0777",
    ),
]


class TestFileChecks:
    def test_good_files_pass(self, tls_files: Path, make_settings: Callable[..., Settings]) -> None:
        """A 0600 key and 0644 certificates of root's in a root-only directory raise nothing."""
        s = make_settings(auth=TLS)
        assert peerauth.problems(s) == []
        assert [(f.key, f.secret) for f in peerauth.files(s)] == [
            ("server_key", True), ("server_cert", False), ("server_cert_auth", False),
            ("client_key", True), ("client_cert", False), ("client_cert_auth", False),
        ]  # fmt: skip
        assert peerauth.files(s)[0].path == tls_files / KEY

    @pytest.mark.parametrize(("breaks", "names"), BREAKS)
    def test_prolog_refuses_before_creating_anything(
        self,
        tls_files: Path,
        make_settings: Callable[..., Settings],
        host: FakeHost,
        breaks: Callable[[Path], None],
        names: list[str],
    ) -> None:
        """Each broken file fails the prolog with config_invalid (78) naming key, file and fault; nothing is left."""
        s = make_settings(auth=TLS)
        breaks(tls_files)
        with pytest.raises(ConfigError) as err:
            run_prolog(s, host)
        assert err.value.code == "config_invalid" and err.value.exit_code == 78
        assert str(err.value).startswith(f"{s.source}: [auth] ")
        for name in names:
            assert name.replace("{root}", str(tls_files)) in str(err.value)
        assert not (tls_files / "run").exists(), "the check runs before the node lock and the job directory"
        assert host.calls == [] and host.procs == {}

    def test_gss_needs_a_private_keytab(
        self, root: Path, keytab: Path, make_settings: Callable[..., Settings], host: FakeHost
    ) -> None:
        """A GSSAPI mode refuses a keytab that group or others may read, and names the mode and the file."""
        keytab.chmod(0o640)
        with pytest.raises(ConfigError, match=rf"\[auth\] mode = GSS_AUTH_ENCRYPT: keytab: {keytab}: is readable"):
            run_prolog(make_settings(auth=GSS), host)
        assert not (root / "run").exists()

    def test_gss_without_keytab(self, root: Path, make_settings: Callable[..., Settings], host: FakeHost) -> None:
        """A GSSAPI mode without /etc/krb5.keytab (under root) is refused."""
        with pytest.raises(ConfigError, match=r"keytab: .*/etc/krb5.keytab: does not exist"):
            run_prolog(make_settings(auth={"enabled": "yes", "mode": "GSS_AUTH_ONLY"}), host)

    def test_channel_only_tray_does_not_check(self, root: Path, make_settings: Callable[..., Settings]) -> None:
        """[policy] single_tray = channel starts no daemon, so missing key files do not stop the channel."""
        host = FakeHost(addresses={"gb01": ["10.0.0.1"]})
        s = make_settings(auth=TLS, policy={"single_tray": "channel", "fabric": "none"})
        env = job_env(nodelist="gb01")
        out = prolog(env, Runtime(host, FakeGpu(), s, structlog.get_logger()))
        assert out.setup.daemon is False


# ---------------------------------------------------------------- config.cfg


class TestConfigWritten:
    def test_tls(self, tls_files: Path, make_settings: Callable[..., Settings], host: FakeHost) -> None:
        """SSL_TLS writes the mode, IMEX_AUTH_SOURCE=FILE and the six files under [paths] root."""
        run_prolog(make_settings(auth={**TLS, "security_target_override": "imex.rack7"}), host)
        cfg = config_cfg(tls_files)
        assert {
            k: v for k, v in cfg.items() if "AUTH" in k or k.startswith(("IMEX_SERVER", "IMEX_CLIENT", "IMEX_SEC"))
        } == {
            "IMEX_ENABLE_AUTH_ENCRYPTION": "1",
            "IMEX_AUTH_ENCRYPTION_MODE": "SSL_TLS",
            "IMEX_AUTH_SOURCE": "FILE",
            "IMEX_SERVER_KEY": f"{tls_files}/{KEY}",
            "IMEX_SERVER_CERT": f"{tls_files}/{CRT}",
            "IMEX_SERVER_CERT_AUTH": f"{tls_files}/{CA}",
            "IMEX_CLIENT_KEY": f"{tls_files}/{KEY}",
            "IMEX_CLIENT_CERT": f"{tls_files}/{CRT}",
            "IMEX_CLIENT_CERT_AUTH": f"{tls_files}/{CA}",
            "IMEX_SECURITY_TARGET_OVERRIDE": "imex.rack7",
        }

    def test_gss(self, root: Path, keytab: Path, make_settings: Callable[..., Settings], host: FakeHost) -> None:
        """A GSSAPI mode writes the mode and [imex]'s GSSAPI keys, and no TLS key or source."""
        run_prolog(make_settings(auth=GSS, imex={"IMEX_GSS_TIMEOUT_SEC": "30"}), host)
        cfg = config_cfg(root)
        assert cfg["IMEX_ENABLE_AUTH_ENCRYPTION"] == "1" and cfg["IMEX_AUTH_ENCRYPTION_MODE"] == "GSS_AUTH_ENCRYPT"
        assert cfg["IMEX_GSS_TIMEOUT_SEC"] == "30"
        assert not {"IMEX_AUTH_SOURCE", "IMEX_SERVER_KEY", "IMEX_CLIENT_CERT_AUTH"} & set(cfg)

    def test_off(self, root: Path, make_settings: Callable[..., Settings], host: FakeHost) -> None:
        """Off: IMEX_ENABLE_AUTH_ENCRYPTION=0 and nothing else about authentication."""
        run_prolog(make_settings(), host)
        cfg = config_cfg(root)
        assert cfg["IMEX_ENABLE_AUTH_ENCRYPTION"] == "0"
        assert [k for k in cfg if "AUTH" in k or "GSS" in k] == ["IMEX_ENABLE_AUTH_ENCRYPTION"]

    def test_simulator_accepts_what_imexctl_writes(
        self, tls_files: Path, make_settings: Callable[..., Settings]
    ) -> None:
        """The simulator parses a TLS config of imexctl's without unknown keys and records the mode."""
        s = make_settings(auth=TLS)
        text = render_config(
            job_id=42,
            port=61042,
            cmd_port=62042,
            bind_ip="10.0.0.1",
            nodes_path=tls_files / "nodes",
            log_file=tls_files / "imex.log",
            overrides={},
            auth=peerauth.config_values(s.auth, s.paths.root),
        )
        sim = parse_config_text(text)
        assert sim.auth_mode == "SSL_TLS" and sim.unknown_keys == ()


# ---------------------------------------------------------------- the simulator


class TestSimulator:
    @pytest.mark.parametrize(
        ("lines", "message"),
        [
            pytest.param("IMEX_ENABLE_AUTH_ENCRYPTION=1\n", "IMEX_AUTH_ENCRYPTION_MODE=''", id="no-mode"),
            pytest.param(
                "IMEX_ENABLE_AUTH_ENCRYPTION=1\nIMEX_AUTH_ENCRYPTION_MODE=TLS\n", "'TLS' is not one of", id="mode"
            ),
            pytest.param(
                "IMEX_ENABLE_AUTH_ENCRYPTION=1\nIMEX_AUTH_ENCRYPTION_MODE=SSL_TLS\n",
                "IMEX_AUTH_SOURCE=''",
                id="no-source",
            ),
            pytest.param(
                "IMEX_ENABLE_AUTH_ENCRYPTION=1\nIMEX_AUTH_ENCRYPTION_MODE=SSL_TLS\nIMEX_AUTH_SOURCE=VAULT\n",
                "IMEX_AUTH_SOURCE='VAULT' is not one of FILE, ENV_PATH, ENV_VAL",
                id="source",
            ),
            pytest.param("IMEX_ENABLE_AUTH_ENCRYPTION=yes\n", "is not an integer", id="enable-word"),
        ],
    )
    def test_refuses_what_the_shipped_file_says_prevents_initialization(self, lines: str, message: str) -> None:
        """An empty or unexpected mode (auth on) or source (SSL_TLS) stops the simulated daemon."""
        with pytest.raises(SimConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            parse_config_text(lines)

    @pytest.mark.parametrize(
        ("lines", "mode"),
        [
            pytest.param("IMEX_ENABLE_AUTH_ENCRYPTION=0\nIMEX_AUTH_ENCRYPTION_MODE=BOGUS\n", "", id="off-ignores"),
            pytest.param(
                "IMEX_ENABLE_AUTH_ENCRYPTION=1\nIMEX_AUTH_ENCRYPTION_MODE=GSS_AUTH_ONLY\n", "GSS_AUTH_ONLY", id="gss"
            ),
            pytest.param(
                "IMEX_ENABLE_AUTH_ENCRYPTION=1\nIMEX_AUTH_ENCRYPTION_MODE=SSL_TLS\nIMEX_AUTH_SOURCE=ENV_PATH\n",
                "SSL_TLS",
                id="tls-env-path",
            ),
        ],
    )
    def test_accepts_consistent_settings(self, lines: str, mode: str) -> None:
        """Consistent settings start; authentication off ignores the other keys."""
        assert parse_config_text(lines).auth_mode == mode


# ---------------------------------------------------------------- the daemon's environment


def _unit_environment() -> dict[str, str]:
    text = (REPO / "systemd/imexctl-imex@.service").read_text()
    pairs = [line.split("=", 1)[1] for line in text.splitlines() if line.startswith("Environment=")]
    return dict(p.split("=", 1) for p in pairs)


class TestDaemonEnvironment:
    def test_unit_sets_the_stock_units_keytab(self) -> None:
        """The shipped unit sets exactly KRB5_CLIENT_KTNAME=/etc/krb5.keytab, as nvidia-imex.service does."""
        assert _unit_environment() == {"KRB5_CLIENT_KTNAME": "/etc/krb5.keytab"} == dict(peerauth.DAEMON_ENV)

    def test_exec_backend_passes_the_units_environment(
        self, root: Path, keytab: Path, make_settings: Callable[..., Settings], host: FakeHost
    ) -> None:
        """The exec backend starts the daemon with what the unit's Environment= sets."""
        run_prolog(make_settings(auth=GSS), host)
        assert [env for _, env in host.spawn_envs] == [_unit_environment()]

    def test_real_host_adds_the_environment_to_the_safe_one(self, tmp_path: Path) -> None:
        """RealHost.spawn_detached gives the child PATH, LANG and the extra variables, nothing else."""
        log = tmp_path / "env.log"
        RealHost().spawn_detached(("/usr/bin/env",), log_path=log, env=peerauth.DAEMON_ENV)
        deadline = time.monotonic() + 10
        while "KRB5" not in (log.read_text() if log.exists() else "") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sorted(log.read_text().splitlines()) == sorted(
            f"{k}={v}" for k, v in {**SAFE_ENV, **peerauth.DAEMON_ENV}.items()
        )

    def _systemd(self, make_settings: Callable[..., Settings], auth: dict[str, str]) -> Settings:
        return make_settings(auth=auth, daemon={"backend": "systemd"})

    def test_gss_refuses_a_unit_without_the_keytab_variable(
        self, root: Path, keytab: Path, make_settings: Callable[..., Settings]
    ) -> None:
        """With a GSSAPI mode, a unit whose Environment lacks KRB5_CLIENT_KTNAME is not started."""
        host = FakeHost(
            unit_env="LANG=C", unit_exec=f"/usr/bin/nvidia-imex -c {root}/run/imexctl/jobs/{{job}}/config.cfg"
        )
        s = self._systemd(make_settings, GSS)
        with pytest.raises(DaemonError, match=r"imexctl-imex@42.service: Environment lacks KRB5_CLIENT_KTNAME="):
            SystemdBackend(host, s).start(s.paths.job(42))
        assert [c[1] for c in host.calls] == ["show"]

    def test_gss_starts_the_shipped_unit(
        self, root: Path, keytab: Path, make_settings: Callable[..., Settings]
    ) -> None:
        """With a GSSAPI mode, the shipped unit's Environment passes and the unit is started."""
        host = FakeHost(unit_exec=f"/usr/bin/nvidia-imex -c {root}/run/imexctl/jobs/{{job}}/config.cfg")
        s = self._systemd(make_settings, GSS)
        SystemdBackend(host, s).start(s.paths.job(42))
        assert ("/usr/bin/systemctl", "start", "--", "imexctl-imex@42.service") in host.calls

    def test_tls_does_not_need_the_variable(self, tls_files: Path, make_settings: Callable[..., Settings]) -> None:
        """SSL_TLS does not depend on the unit's Environment."""
        host = FakeHost(
            unit_env="", unit_exec=f"/usr/bin/nvidia-imex -c {tls_files}/run/imexctl/jobs/{{job}}/config.cfg"
        )
        s = self._systemd(make_settings, TLS)
        SystemdBackend(host, s).start(s.paths.job(42))
        assert ("/usr/bin/systemctl", "start", "--", "imexctl-imex@42.service") in host.calls


# ---------------------------------------------------------------- imexctl doctor


def _auth_check(s: Settings) -> doctor.Check:
    ctx = doctor.Context(Runtime(FakeHost(), FakeGpu(), s, structlog.get_logger()), {}, "gb01")
    return next(c for c in doctor_run.run(ctx) if c.name == "imexctl.auth")


class TestDoctor:
    def test_off_is_ok(self, make_settings: Callable[..., Settings]) -> None:
        """Authentication off is reported OK, saying so."""
        check = _auth_check(make_settings())
        assert (check.status, check.message) == ("OK", "peer authentication off ([auth] enabled = no)")

    def test_good_files_are_ok(self, tls_files: Path, make_settings: Callable[..., Settings]) -> None:
        """Good TLS files are OK and listed."""
        check = _auth_check(make_settings(auth=TLS))
        assert check.status == "OK" and f"{tls_files}/{KEY}" in check.message

    def test_bad_key_fails_like_the_prolog(self, tls_files: Path, make_settings: Callable[..., Settings]) -> None:
        """A key others may read is a FAIL with the prolog's words and a fix."""
        os.chmod(tls_files / KEY, 0o644)
        s = make_settings(auth=TLS)
        check = _auth_check(s)
        assert check.status == "FAIL" and check.fix
        assert peerauth.problems(s)[0] in check.message and "exits 78" in check.message
