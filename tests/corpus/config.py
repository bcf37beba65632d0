"""Corpus family 3: the configuration (imexctl.conf, the hosts file, the topology sources), one case per id.

A case gives ``sections`` merged over the corpus defaults, or raw ``text``
for the config file (``{root}`` is the tray's root), plus ``files`` to plant
under the root, and a ``prepare`` step for what text cannot say (modes,
owners, symlinks, FIFOs).  It fails with ``config_invalid`` (78) naming
``names`` (``{root}`` filled in) unless ``ok`` is set: then the prolog succeeds and the epilog
leaves the tray clean.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Callable, Optional

from imexctl.config import schema

# (root, config) -> the config path to pass instead, or None
Prepare = Callable[[Path, Path], Optional[Path]]


@dataclasses.dataclass(frozen=True)
class ConfigCase:
    """One hostile or broken configuration and what imexctl must say about it."""

    id: str
    names: tuple[str, ...] = ()
    sections: Mapping[str, Mapping[str, str]] = dataclasses.field(default_factory=dict)
    text: str | None = None
    files: Mapping[str, bytes] = dataclasses.field(default_factory=dict)
    prepare: Prepare | None = None
    ok: bool = False
    root_only: bool = False  # prepare gives a file to another uid


def _key(section: str, key: str, value: str, why: str) -> ConfigCase:
    """``[section] key = value`` is refused with ``why``."""
    tail = "".join(c if c.isalnum() else "-" for c in value).strip("-")[:20] or "empty"
    return ConfigCase(f"{section}-{key}-{tail}", (f"[{section}] {key}: {value!r} {why}",), {section: {key: value}})


# ---------------------------------------------------------------- keys and sections

UNKNOWN = [
    *(ConfigCase(f"unknown-key-in-{s}", (f"[{s}] bogus_key: unknown key",), {s: {"bogus_key": "1"}})
      for s in schema.SCHEMA),
    ConfigCase("unknown-key-wrong-case", ("[daemon] Backend: unknown key",), {"daemon": {"Backend": "exec"}}),
    ConfigCase("unknown-key-typo", ("[readiness] deadline: unknown key",), {"readiness": {"deadline": "5"}}),
    ConfigCase("unknown-section", ("[bogus]: unknown section",), {"bogus": {"x": "1"}}),
    ConfigCase("unknown-section-wrong-case", ("[Daemon]: unknown section",), {"Daemon": {"backend": "exec"}}),
    ConfigCase("unknown-section-default", ("[DEFAULT] is not read",), {"DEFAULT": {"backend": "exec"}}),
    ConfigCase("unknown-section-trailing-blank", ("blanks or non-printing characters in a section name", "[imex ]"),
               {"imex ": {"LOG_LEVEL": "4"}}),
]  # fmt: skip

_FLOATS = [(s, k) for s, keys in schema.SCHEMA.items() for k in keys if k.endswith("_s")]
_CHOICES = {
    ("daemon", "backend"): "exec", ("policy", "jobs"): "all", ("policy", "shared"): "refuse",
    ("policy", "channels"): "job", ("policy", "fabric"): "nvml", ("policy", "fabric_limited"): "warn",
    ("readiness", "level"): "domain", ("readiness", "ctl_address"): "config", ("readiness", "blame_peers"): "no",
    ("resolve", "method"): "dns", ("log", "level"): "info", ("log", "syslog"): "no",
    ("policy", "single_tray"): "domain", ("slurm", "cap_deadline"): "yes", ("slurm", "check_cancelled"): "yes",
    ("slurm", "het_jobs"): "joint", ("slurm", "ask_sharing"): "yes", ("topology", "source"): "auto",
    ("auth", "enabled"): "no", ("auth", "mode"): "SSL_TLS", ("containers", "on_error"): "open",
    ("policy", "lost_daemon"): "warn", ("slurm", "drain_reason"): "yes",
}  # fmt: skip

WRONG_TYPES = [
    *(_key(s, k, "fast", "must be a number") for s, k in _FLOATS),
    *(_key(s, k, "1e9", "must be between") for s, k in _FLOATS),
    _key("readiness", "deadline_s", "nan", "must be between"),
    _key("readiness", "deadline_s", "inf", "must be between"),
    _key("readiness", "deadline_s", "-5", "must be between"),
    _key("readiness", "deadline_s", "", "must be a number"),
    _key("readiness", "deadline_s", "5 s", "must be a number"),
    *(_key(s, k, "maybe", "must be one of") for s, k in _CHOICES),
    *(_key(s, k, v.upper(), "must be one of") for (s, k), v in list(_CHOICES.items())[:4]),
    _key("policy", "channel_count", "0x10", "must be an integer"),
    _key("policy", "channel_count", "2.5", "must be an integer"),
    _key("policy", "channel_count", "1", "must be between 2 and 1048576"),
    _key("policy", "channel_count", "1048577", "must be between 2 and 1048576"),
    _key("policy", "channel_mode", "0755", "must be a subset of 0666"),
    _key("policy", "channel_mode", "4600", "must be a subset of 0666"),
    _key("policy", "channel_mode", "1666", "must be a subset of 0666"),
    _key("policy", "channel_mode", "rw", "must be an octal mode"),
    _key("policy", "channel_mode", "0x180", "must be an octal mode"),
    _key("policy", "channel_mode", "-1", "must be a subset of 0666"),
    *(_key("ports", k, v, why) for k in ("server_port_range", "cmd_port_range") for v, why in (
        ("abc", "must be LOW-HIGH"), ("1000-2000", "must satisfy 1024 <= LOW <= HIGH <= 65535"),
        ("65000-70000", "must satisfy 1024 <= LOW"), ("61999-61000", "must satisfy 1024 <= LOW <= HIGH"),
        ("61000-61999-62999", "must be LOW-HIGH"), ("61000 - x", "must be LOW-HIGH"))),
    _key("daemon", "unit", "a/b", "must be a plain name"),
    _key("daemon", "unit", "imex@x", "must be a plain name"),
    _key("daemon", "unit", "imex ctl", "must be a plain name"),
    _key("daemon", "unit", "", "must be a plain name"),
    _key("daemon", "unit", "unit\x00", "must be a plain name"),
    _key("daemon", "unit", "\x1b[2J", "must be a plain name"),
    _key("policy", "feature", "", "must be a plain name"),
    _key("policy", "feature", "imex/gpu", "must be a plain name"),
    _key("daemon", "stock_unit", "nvidia-imex", "must be a full unit name"),
    _key("daemon", "stock_unit", ".service", "must be a full unit name"),
    _key("topology", "yaml_topology", "racks/1", "must be a plain name"),
]  # fmt: skip

_PATHS = [(s, k) for s, keys in schema.SCHEMA.items() for k, (_, parse) in keys.items()
          if s in ("paths", "commands")]  # fmt: skip

RELATIVE_PATHS = [
    *(_key(s, k, "relative/path", "must be an absolute path") for s, k in _PATHS),
    _key("paths", "run_dir", "~/run", "must be an absolute path"),
    _key("paths", "run_dir", "./run/imexctl", "must be an absolute path"),
    _key("paths", "root", "%n", "must be an absolute path"),
    _key("paths", "run_dir", "%(root)s/run", "must be an absolute path"),
    _key("metrics", "textfile_dir", "var/lib/node_exporter", "must be an absolute path"),
    _key("commands", "nvidia_imex_ctl", "nvidia-imex-ctl", "must be an absolute path"),
    _key("paths", "proc_devices", "", "must be an absolute path"),
]  # fmt: skip

IMEX_KEYS = [
    *(ConfigCase(f"imex-owned-{k.lower().replace('_', '-')}", (f"[imex] {k}: is set by imexctl",), {"imex": {k: "1"}})
      for k in sorted(schema.OWNED_IMEX_KEYS)),
    ConfigCase("imex-unknown-key", ("[imex] FOO: unknown IMEX config.cfg key",), {"imex": {"FOO": "1"}}),
    ConfigCase("imex-owned-key-lower-case", ("[imex] server_port: unknown IMEX config.cfg key",),
               {"imex": {"server_port": "1"}}),
    ConfigCase("imex-conn-wait-timeout-myth", ("[imex] IMEX_CONN_WAIT_TIMEOUT: unknown",),
               {"imex": {"IMEX_CONN_WAIT_TIMEOUT": "70"}}),
    ConfigCase("imex-value-with-hash", ("[imex] LOG_LEVEL: value must be one line without '#'",),
               {"imex": {"LOG_LEVEL": "4 # info"}}),
    ConfigCase("imex-value-two-lines", ("line 3: indented: continuation lines are not read",),
               text="[imex]\nLOG_LEVEL = 4\n  SERVER_PORT=1\n"),
    ConfigCase("imex-allowed-key", sections={"imex": {"LOG_LEVEL": "2"}}, ok=True),
]  # fmt: skip

CROSS = [
    ConfigCase("partitions-policy-without-partitions", ("[policy] partitions: must list partitions",),
               {"policy": {"jobs": "partitions"}}),
    ConfigCase("poll-initial-above-max", ("[readiness] poll_initial_s: must not exceed poll_max_s",),
               {"readiness": {"poll_initial_s": "2", "poll_max_s": "1"}}),
    ConfigCase("port-ranges-overlap", ("[ports] cmd_port_range: must not overlap server_port_range",),
               {"ports": {"cmd_port_range": "61500-62500"}}),
    ConfigCase("port-ranges-equal", ("[ports] cmd_port_range: must not overlap",),
               {"ports": {"server_port_range": "61000-61999", "cmd_port_range": "61000-61999"}}),
    ConfigCase("topology-source-without-file", ("[topology] source: map needs [paths] topology_file",),
               {"topology": {"source": "map"}}),
    ConfigCase("topology-file-ignored-by-source-none", ("[paths] topology_file: is set but [topology] source = none",),
               {"paths": {"topology_file": "/etc/slurm/topology.conf"}, "topology": {"source": "none"}}),
    ConfigCase("topology-map-beside-a-map-source", ("[paths] topology_map: checks a topology_conf or topology_yaml",),
               {"paths": {"topology_file": "/m", "topology_map": "/m"}, "topology": {"source": "map"}}),
    ConfigCase("yaml-topology-without-yaml-source", ("[topology] yaml_topology: needs source = topology_yaml",),
               {"paths": {"topology_file": "/t"}, "topology": {"yaml_topology": "racks"}}),
]  # fmt: skip

# ---------------------------------------------------------------- the file itself


def _chmod(mode: int) -> Prepare:
    def prepare(root: Path, config: Path) -> None:
        os.chmod(config, mode)

    return prepare


def _chown(uid: int, gid: int) -> Prepare:
    def prepare(root: Path, config: Path) -> None:
        os.chown(config, uid, gid)

    return prepare


def _link_to_config(owner: int | None) -> Prepare:
    def prepare(root: Path, config: Path) -> Path:
        if owner is not None:
            os.chown(config, owner, owner)
        link = root / "link.conf"
        link.symlink_to(config)
        return link

    return prepare


def _special(kind: str) -> Prepare:
    def prepare(root: Path, config: Path) -> Path:
        path = root / f"{kind}.conf"
        if kind == "fifo":
            os.mkfifo(path, 0o644)
        elif kind == "directory":
            path.mkdir(mode=0o755)
        elif kind == "dangling":
            path.symlink_to(root / "nowhere.conf")
        elif kind == "loop":
            path.symlink_to(path)
        elif kind == "missing":
            pass
        else:
            return Path(kind)
        return path

    return prepare


def _append(data: bytes) -> Prepare:
    def prepare(root: Path, config: Path) -> None:
        with open(config, "ab") as f:
            f.write(data)

    return prepare


def _prepend(data: bytes) -> Prepare:
    def prepare(root: Path, config: Path) -> None:
        config.write_bytes(data + config.read_bytes())

    return prepare


def _utf16(root: Path, config: Path) -> None:
    config.write_bytes(config.read_text().encode("utf-16"))


_OWNER_RULE = "config file must be owned by root and not writable by group or others"

FILE = [
    ConfigCase("config-file-group-writable", (_OWNER_RULE, "mode 0664"), prepare=_chmod(0o664)),
    ConfigCase("config-file-world-writable", (_OWNER_RULE, "mode 0646"), prepare=_chmod(0o646)),
    ConfigCase("config-file-mode-0777", (_OWNER_RULE, "mode 0777"), prepare=_chmod(0o777)),
    ConfigCase("config-file-foreign-owner", (_OWNER_RULE, "owner uid 1000"), prepare=_chown(1000, 0), root_only=True),
    ConfigCase("config-file-nobody-owner", (_OWNER_RULE, "owner uid 65534"), prepare=_chown(65534, 65534),
               root_only=True),
    ConfigCase("config-file-foreign-group-not-writable", prepare=_chown(0, 1000), ok=True, root_only=True),
    ConfigCase("config-file-root-only-0600", prepare=_chmod(0o600), ok=True),
    ConfigCase("config-file-symlink-to-foreign-file", ("link.conf", _OWNER_RULE, "owner uid 1000"),
               prepare=_link_to_config(1000), root_only=True),
    ConfigCase("config-file-symlink-to-trusted-file", prepare=_link_to_config(None), ok=True),
    ConfigCase("config-file-dangling-symlink", ("dangling.conf: config file not found",), prepare=_special("dangling")),
    ConfigCase("config-file-symlink-loop", ("loop.conf: cannot read config file",), prepare=_special("loop")),
    ConfigCase("config-file-missing", ("missing.conf: config file not found",), prepare=_special("missing")),
    ConfigCase("config-file-fifo", ("fifo.conf: not a regular file",), prepare=_special("fifo")),
    ConfigCase("config-file-directory", ("directory.conf: cannot read config file: Is a directory",),
               prepare=_special("directory")),
    ConfigCase("config-file-dev-zero", ("/dev/zero: not a regular file",), prepare=_special("/dev/zero")),
    ConfigCase("config-file-dev-null", ("/dev/null: not a regular file",), prepare=_special("/dev/null")),
    ConfigCase("config-file-not-utf8", ("not UTF-8 text",), prepare=_append(b"# caf\xe9\n")),
    ConfigCase("config-file-utf16", ("not UTF-8 text",), prepare=_utf16),
    ConfigCase("config-ini-byte-order-mark", ("line 1: a byte order mark", "\\ufeff[paths]"),
               prepare=_prepend("\ufeff".encode())),
    ConfigCase("config-ini-no-section-header", ("line 1: a key before the first [section]", "backend = exec"),
               prepare=_prepend(b"backend = exec\n")),
    ConfigCase("config-ini-line-without-equals", ("not a [section], a comment or key = value", "just some words"),
               prepare=_append(b"just some words\n")),
    ConfigCase("config-ini-key-without-name", ("no key before the '='", "'= 5'"), prepare=_append(b"= 5\n")),
    ConfigCase("config-ini-unclosed-section", ("line 1: not a section header", "[paths"),
               text="[paths\nroot = /x\n"),
    ConfigCase("config-ini-duplicate-section", ("section [daemon] given again",),
               prepare=_append(b"[daemon]\nbackend = exec\n")),
    ConfigCase("config-ini-duplicate-key", ("line 5: [daemon] backend given again (first on line 4)",),
               text="[paths]\nroot = {root}\n[daemon]\nbackend = exec\nbackend = systemd\n"),
    ConfigCase("config-ini-continuation-line", ("line 5: indented: continuation lines are not read", "'  systemd'"),
               text="[paths]\nroot = {root}\n[daemon]\nbackend = exec\n  systemd\n"),
    ConfigCase("config-ini-colon", ("line 4: a ':' before the '='", "backend: exec"),
               text="[paths]\nroot = {root}\n[daemon]\nbackend: exec\n"),
    ConfigCase("config-ini-default-section", ("line 3: [DEFAULT] is not read",),
               text="[paths]\nroot = {root}\n[DEFAULT]\nbackend = exec\n"),
    ConfigCase("config-ini-crlf", text="[paths]\r\nroot = {root}\r\n[daemon]\r\nbackend = exec\r\n", ok=True),
    ConfigCase("config-ini-nul-byte", ("[daemon] unit: 'imex\\x00'",), {"daemon": {"unit": "imex\x00"}}),
    ConfigCase("config-ini-comments-and-blanks", text="# comment\n\n; other\n[paths]\nroot = {root}\n  # indented\n"
               "[daemon]\nbackend = exec\nkill_grace_s = 1\nstop_timeout_s = 1\n[readiness]\ndeadline_s = 5\n",
               ok=True),
    ConfigCase("config-file-one-megabyte-of-comments", prepare=_append(b"# padding padding padding\n" * 40_000),
               ok=True),
]  # fmt: skip

# ---------------------------------------------------------------- hosts file and topology file

_HOSTS = "etc/imexctl/hosts"
_TOPO = "etc/slurm/topology.conf"
_HOSTS_OK = b"10.0.0.1 gb01\n10.0.0.2 gb02\n"
_TOPO_OK = b"BlockName=rack1 Nodes=gb[01-18]\n"
_BY_HOSTS = {"resolve": {"method": "hosts_file"}}
_BY_TOPO = {"paths": {"topology_file": "/" + _TOPO}}
_YAML = "etc/slurm/topology.yaml"
_BY_YAML = {"paths": {"topology_file": "/" + _YAML}, "topology": {"source": "topology_yaml"}}
_MAP = "etc/slurm/nvlink.map"
_BY_MAP = {"paths": {"topology_file": "/" + _MAP}, "topology": {"source": "map"}}
_FAKE_KEY = b"11111111-1111-1111-1111-111111111111.7"  # the NVML key of FakeGpu's tray
_FILE_RULE = "must be owned by root and not writable by group or others"


def _file_mode(rel: str, mode: int) -> Prepare:
    def prepare(root: Path, config: Path) -> None:
        os.chmod(root / rel, mode)

    return prepare


def _file_owner(rel: str, uid: int) -> Prepare:
    def prepare(root: Path, config: Path) -> None:
        os.chown(root / rel, uid, -1)

    return prepare


def _file_replaced(rel: str, kind: str) -> Prepare:
    def prepare(root: Path, config: Path) -> None:
        path = root / rel
        real = path.with_name(path.name + ".real")
        path.rename(real)
        if kind == "symlink":
            path.symlink_to(real)
        elif kind == "fifo":
            os.mkfifo(path, 0o644)
        elif kind == "directory":
            path.mkdir()
        elif kind == "missing":
            pass

    return prepare


def _site_files(kind: str, rel: str, good: bytes, sections: Mapping[str, Mapping[str, str]]) -> list[ConfigCase]:
    def case(id_: str, names: tuple[str, ...], *, text: bytes = good, prepare: Prepare | None = None,
             ok: bool = False, root_only: bool = False) -> ConfigCase:  # fmt: skip
        return ConfigCase(f"{kind}-{id_}", names, sections, files={rel: text}, prepare=prepare, ok=ok,
                          root_only=root_only)  # fmt: skip

    what = "hosts file" if kind == "hosts-file" else "topology file"
    return [
        case("group-writable", (f"cannot read {what}", _FILE_RULE, "mode 0664"), prepare=_file_mode(rel, 0o664)),
        case("world-writable", (f"cannot read {what}", _FILE_RULE, "mode 0646"), prepare=_file_mode(rel, 0o646)),
        case(
            "foreign-owner",
            (f"cannot read {what}", _FILE_RULE, "owner uid 1000"),
            prepare=_file_owner(rel, 1000),
            root_only=True,
        ),
        case(
            "symlink",
            (f"cannot read {what}", "is a symbolic link (not followed)"),
            prepare=_file_replaced(rel, "symlink"),
        ),
        case("fifo", (f"cannot read {what}", "not a regular file"), prepare=_file_replaced(rel, "fifo")),
        case("directory", (f"cannot read {what}",), prepare=_file_replaced(rel, "directory")),
        case("missing", (f"cannot read {what}", "No such file or directory"), prepare=_file_replaced(rel, "missing")),
        case("not-utf8", (f"cannot read {what}", "not UTF-8"), text=good + b"# caf\xe9\n"),
        case("root-only-0600", (), prepare=_file_mode(rel, 0o600), ok=True),
    ]


HOSTS_FILE = [
    *_site_files("hosts-file", _HOSTS, _HOSTS_OK, _BY_HOSTS),
    ConfigCase("hosts-file-line-without-name", ("hosts:1: expected 'ADDRESS NAME...'", "'10.0.0.1'"), _BY_HOSTS,
               files={_HOSTS: b"10.0.0.1\n10.0.0.2 gb02\n"}),
    ConfigCase("hosts-file-name-first", ("hosts:1: expected 'ADDRESS NAME...'", "'gb01 10.0.0.1'"), _BY_HOSTS,
               files={_HOSTS: b"gb01 10.0.0.1\n10.0.0.2 gb02\n"}),
    ConfigCase("hosts-file-bad-address", ("hosts:1: expected 'ADDRESS NAME...'", "10.0.0.300"), _BY_HOSTS,
               files={_HOSTS: b"10.0.0.300 gb01\n10.0.0.2 gb02\n"}),
    ConfigCase("hosts-file-address-with-port", ("hosts:2: expected 'ADDRESS NAME...'",), _BY_HOSTS,
               files={_HOSTS: b"10.0.0.1 gb01\n10.0.0.2:22 gb02\n"}),
    ConfigCase("hosts-file-name-twice", ("hosts:3: gb02 has two addresses (10.0.0.2, 10.0.0.9)",), _BY_HOSTS,
               files={_HOSTS: b"10.0.0.1 gb01\n10.0.0.2 gb02\n10.0.0.9 gb02\n"}),
    ConfigCase("hosts-file-comments-and-aliases", sections=_BY_HOSTS, ok=True,
               files={_HOSTS: b"# rack 1\n10.0.0.1 gb01 gb01-ib  # first\n\n10.0.0.2\tgb02\n"}),
    ConfigCase("hosts-file-crlf", sections=_BY_HOSTS, ok=True, files={_HOSTS: b"10.0.0.1 gb01\r\n10.0.0.2 gb02\r\n"}),
]  # fmt: skip

TOPOLOGY_FILE = [
    *_site_files("topology-file", _TOPO, _TOPO_OK, _BY_TOPO),
    ConfigCase("topology-file-block-without-nodes", ("topology.conf:1: block line needs BlockName= and Nodes=",),
               _BY_TOPO, files={_TOPO: b"BlockName=rack1\n"}),
    ConfigCase("topology-file-nodes-without-block", ("block line needs BlockName= and Nodes=",), _BY_TOPO,
               files={_TOPO: b"BlockName= Nodes=gb[01-18]\n"}),
    ConfigCase("topology-file-bad-host-list", ("topology.conf:2:", "invalid node list", "'gb[10-'"), _BY_TOPO,
               files={_TOPO: b"BlockName=rack1 Nodes=gb[01-09]\nBlockName=rack2 Nodes=gb[10-\n"}),
    ConfigCase("topology-file-node-in-two-blocks", ("node gb09 is in blocks rack1 and rack2",), _BY_TOPO,
               files={_TOPO: b"BlockName=rack1 Nodes=gb[01-09]\nBlockName=rack2 Nodes=gb[09-18]\n"}),
    ConfigCase("topology-file-this-node-in-no-block", ("this node gb01 is in no BlockName= block",), _BY_TOPO,
               files={_TOPO: b"BlockName=rack2 Nodes=gb[10-18]\n"}),
    ConfigCase("topology-file-other-lines-ignored", sections=_BY_TOPO, ok=True,
               files={_TOPO: b"# racks\nSwitchName=s1 Nodes=gb[01-18]\nBlockSizes=18\n" + _TOPO_OK}),
    ConfigCase("topology-file-key-comment-matches-nvml", sections=_BY_TOPO, ok=True,
               files={_TOPO: b"BlockName=r1 Nodes=gb[01-18]  # imexctl-key: " + _FAKE_KEY + b"\n"}),
    ConfigCase("topology-file-bad-key-comment", ("topology.conf:1: bad imexctl-key: comment",), _BY_TOPO,
               files={_TOPO: b"BlockName=r1 Nodes=gb[01-18]  # imexctl-key: rack1\n"}),
    ConfigCase("topology-yaml-blocks", sections=_BY_YAML, ok=True,
               files={_YAML: b"- topology: nvl\n  block:\n    blocks:\n      - block: r1\n        nodes: gb[01-18]\n"}),
    ConfigCase("topology-yaml-anchor", ("topology.yaml:2: YAML that imexctl does not read",), _BY_YAML,
               files={_YAML: b"- topology: nvl\n  block: &b\n"}),
    ConfigCase("topology-yaml-two-block-topologies", ("set [topology] yaml_topology: 2 block topologies (a, b)",),
               _BY_YAML, files={_YAML: b"- topology: a\n  block:\n    blocks: []\n- topology: b\n  block:\n"
                                       b"    blocks: []\n"}),
    ConfigCase("topology-map-lines", sections=_BY_MAP, ok=True,
               files={_MAP: b"gb01 " + _FAKE_KEY + b"\ngb02 " + _FAKE_KEY + b"\nlogin1 -\n"}),
    ConfigCase("topology-map-line-without-key", ("nvlink.map:1: expected 'NODE KEY'",), _BY_MAP,
               files={_MAP: b"gb01\n"}),
    ConfigCase("topology-map-bad-key", ("nvlink.map:1: node gb01:", "is not a cluster UUID"), _BY_MAP,
               files={_MAP: b"gb01 rack1.7\n"}),
    ConfigCase("topology-check-map-without-this-node", ("this node gb01 is not in the NVLink domain map",),
               {"paths": {"topology_file": "/" + _TOPO, "topology_map": "/" + _MAP}},
               files={_TOPO: _TOPO_OK, _MAP: b"gb02 " + _FAKE_KEY + b"\n"}),
]  # fmt: skip

# ---------------------------------------------------------------- [auth]: IMEX peer authentication

_TLS_DIR = "etc/nvidia-imex/tls"
_TLS_KEY, _TLS_CRT, _TLS_CA = f"{_TLS_DIR}/tray.key", f"{_TLS_DIR}/tray.crt", f"{_TLS_DIR}/rack-ca.crt"
_TLS_FILES = {_TLS_KEY: b"-----BEGIN PRIVATE KEY-----\nAA==\n-----END PRIVATE KEY-----\n",
              _TLS_CRT: b"-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n",
              _TLS_CA: b"-----BEGIN CERTIFICATE-----\nAQ==\n-----END CERTIFICATE-----\n"}  # fmt: skip
_TLS_KEYS = {
    "server_key": "/" + _TLS_KEY,
    "server_cert": "/" + _TLS_CRT,
    "server_cert_auth": "/" + _TLS_CA,
    "client_key": "/" + _TLS_KEY,
    "client_cert": "/" + _TLS_CRT,
    "client_cert_auth": "/" + _TLS_CA,
}
_TLS = {"auth": {"enabled": "yes", **_TLS_KEYS}}
_GSS = {"auth": {"enabled": "yes", "mode": "GSS_AUTH_ENCRYPT"}}
_ALL_FILE_KEYS = "[auth] " + ", ".join(_TLS_KEYS)
_KEYTAB = "etc/krb5.keytab"


def _then(*steps: Prepare) -> Prepare:
    def prepare(root: Path, config: Path) -> None:
        for step in steps:
            step(root, config)

    return prepare


_KEY_PRIVATE = _file_mode(_TLS_KEY, 0o600)


def _tls(id_: str, names: tuple[str, ...], *steps: Prepare, ok: bool = False, root_only: bool = False,
         files: Mapping[str, bytes] = _TLS_FILES) -> ConfigCase:  # fmt: skip
    """A complete mode = SSL_TLS set-up (key 0600), then ``steps`` break it."""
    return ConfigCase(f"auth-tls-{id_}", names, _TLS, files=files, prepare=_then(_KEY_PRIVATE, *steps), ok=ok,
                      root_only=root_only)  # fmt: skip


def _auth_key(key: str, value: str, why: str) -> ConfigCase:
    return ConfigCase(f"auth-{key}-{'-'.join(value.split('/'))[-16:].strip('-')}", (f"[auth] {key}: {value!r} {why}",),
                      {"auth": {"enabled": "yes", **_TLS_KEYS, key: value}})  # fmt: skip


AUTH = [
    *(_auth_key(k, "tls/" + k, "must be an absolute path") for k in _TLS_KEYS),
    _auth_key("server_key", "/etc/my keys/tray.key", "must be a path without blanks, '#'"),
    _auth_key("client_cert", "/etc/tls/#tray.crt", "must be a path without blanks, '#'"),
    _auth_key("security_target_override", "rack 7", "must be a host name"),
    _auth_key("security_target_override", "rack7;id", "must be a host name"),
    *(ConfigCase(f"auth-{k}-without-enabled", (f"[auth] {k}: is set but [auth] enabled = no",),
                 {"auth": {k: "/" + _TLS_KEY}}) for k in _TLS_KEYS),
    ConfigCase("auth-target-override-without-enabled", ("[auth] security_target_override: is set but",),
               {"auth": {"security_target_override": "rack7"}}),
    *(ConfigCase(f"auth-tls-needs-{k}", (f"[auth] {k}: is required with mode = SSL_TLS",),
                 {"auth": {"enabled": "yes", **{o: v for o, v in _TLS_KEYS.items() if o != k}}}) for k in _TLS_KEYS),
    ConfigCase("auth-tls-key-with-gss-mode", ("[auth] server_key: is a TLS setting, but mode = GSS_AUTH_ONLY",),
               {"auth": {"enabled": "yes", "mode": "GSS_AUTH_ONLY", "server_key": "/" + _TLS_KEY}}),
    ConfigCase("auth-target-override-with-gss-mode", ("[auth] security_target_override: is a TLS setting",),
               {"auth": {**_GSS["auth"], "security_target_override": "rack7"}}),
    ConfigCase("auth-gss-key-without-auth", ("[imex] IMEX_GSS_TIMEOUT_SEC: is a GSSAPI setting but [auth] enabled",),
               {"imex": {"IMEX_GSS_TIMEOUT_SEC": "30"}}),
    ConfigCase("auth-gss-key-with-tls", ("[imex] IMEX_GSS_SERVICE_NAME: is a GSSAPI setting, but [auth] mode = SSL",),
               {**_TLS, "imex": {"IMEX_GSS_SERVICE_NAME": "imex"}}, files=_TLS_FILES, prepare=_KEY_PRIVATE),
    _tls("ok", (), ok=True),
    _tls("ok-key-0400", (), _file_mode(_TLS_KEY, 0o400), ok=True),
    _tls("key-group-readable", ("[auth] server_key:", f"{_TLS_KEY}: is readable or writable by group or others",
                                "mode 0640", "[auth] client_key:"), _file_mode(_TLS_KEY, 0o640)),
    _tls("key-world-readable", ("[auth] server_key:", "mode 0604"), _file_mode(_TLS_KEY, 0o604)),
    _tls("cert-group-writable", ("[auth] server_cert:", f"{_TLS_CRT}: is writable by group or others (mode 0664)"),
         _file_mode(_TLS_CRT, 0o664)),
    _tls("ca-world-writable", ("[auth] server_cert_auth:", f"{_TLS_CA}: is writable by group or others"),
         _file_mode(_TLS_CA, 0o646)),
    _tls("key-foreign-owner", ("[auth] server_key:", "is owned by uid 1000, not root"), _file_owner(_TLS_KEY, 1000),
         root_only=True),
    _tls("ca-foreign-owner", ("[auth] client_cert_auth:", "is owned by uid 1000, not root"),
         _file_owner(_TLS_CA, 1000), root_only=True),
    _tls("key-missing", ("[auth] server_key:", f"{_TLS_KEY}: does not exist"), _file_replaced(_TLS_KEY, "missing")),
    _tls("cert-symlink", ("[auth] server_cert:", "is a symbolic link (not followed)"),
         _file_replaced(_TLS_CRT, "symlink")),
    _tls("ca-fifo", ("[auth] server_cert_auth:", "is not a regular file"), _file_replaced(_TLS_CA, "fifo")),
    _tls("key-directory", ("[auth] client_key:", "is not a regular file"), _file_replaced(_TLS_KEY, "directory")),
    _tls("cert-empty", ("[auth] client_cert:", "is empty"), files={**_TLS_FILES, _TLS_CRT: b""}),
    _tls("directory-group-writable", (_ALL_FILE_KEYS + f": directory {{root}}/{_TLS_DIR} must be owned by root",
                                      "mode 0775", "whoever may write it can replace the files"),
         _file_mode(_TLS_DIR, 0o775)),
    _tls("directory-sticky-world-writable", (f"{_TLS_DIR} must be owned by root", "mode 1777"),
         _file_mode(_TLS_DIR, 0o1777)),
    ConfigCase("auth-gss-ok", sections=_GSS, files={_KEYTAB: b"\x05\x02keytab"},
               prepare=_file_mode(_KEYTAB, 0o600), ok=True),
    ConfigCase("auth-gss-keytab-missing", ("[auth] mode = GSS_AUTH_ENCRYPT: keytab:", "krb5.keytab: does not exist"),
               _GSS),
    ConfigCase("auth-gss-keytab-world-readable", ("keytab:", "krb5.keytab: is readable or writable by group or others",
                                                  "mode 0644"), _GSS, files={_KEYTAB: b"\x05\x02keytab"}),
    ConfigCase("auth-gss-only-keytab-foreign", ("[auth] mode = GSS_AUTH_ONLY: keytab:", "owned by uid 1000"),
               {"auth": {"enabled": "yes", "mode": "GSS_AUTH_ONLY"}}, files={_KEYTAB: b"\x05\x02keytab"},
               prepare=_then(_file_mode(_KEYTAB, 0o600), _file_owner(_KEYTAB, 1000)), root_only=True),
]  # fmt: skip

CASES = [*UNKNOWN, *WRONG_TYPES, *RELATIVE_PATHS, *IMEX_KEYS, *CROSS, *FILE, *HOSTS_FILE, *TOPOLOGY_FILE, *AUTH]


def merged(case: ConfigCase, root: Path) -> dict[str, dict[str, str]]:
    """The case's sections with ``{root}`` filled in."""
    return {s: {k: v.replace("{root}", str(root)) for k, v in kv.items()} for s, kv in case.sections.items()}
