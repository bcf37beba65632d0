"""settings: the INI schema, its error messages, file permissions, config discovery and path rebasing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from imexctl.config import schema, settings
from imexctl.config.schema import OWNED_IMEX_KEYS, SCHEMA
from imexctl.config.settings import load
from imexctl.platform.errors import ConfigError
from tests.support.privileges import needs_chown


def conf(tmp_path: Path, text: str, *, mode: int = 0o644, name: str = "imexctl.conf") -> Path:
    """Write a config file (owned by the test's uid, root) with ``mode``."""
    path = tmp_path / name
    path.write_text(text)
    os.chmod(path, mode)
    return path


class TestDefaults:
    def test_no_file_gives_every_default(self) -> None:
        """Without a file every key has its schema default and there is no source."""
        s = load(None, node="gb01")
        assert s.source is None and s.imex == {}
        assert s.daemon.backend == "systemd"
        assert s.readiness.deadline_s == 60.0
        assert s.policy.channel_mode == 0o600
        assert s.ports.server_port_range == (61000, 61999)
        assert s.policy.partitions == ()
        assert s.paths.run_dir == Path("/run/imexctl") and s.paths.topology_file is None

    def test_every_default_passes_its_own_parser(self) -> None:
        """Each schema default parses, so a missing key can never fail validation."""
        for keys in SCHEMA.values():
            for default, parse in keys.values():
                parse(default)  # raises ValueError on a bad default

    def test_missing_default_file_is_all_defaults(self, tmp_path: Path) -> None:
        """A missing file that is not required (the default path) gives the defaults."""
        s = load(tmp_path / "absent.conf", node="gb01", required=False)
        assert s.source is None and s.log.level == "info"

    def test_missing_explicit_file_is_an_error(self, tmp_path: Path) -> None:
        """A missing file that was asked for is a ConfigError naming it."""
        with pytest.raises(ConfigError, match=r"absent\.conf: config file not found"):
            load(tmp_path / "absent.conf", node="gb01", required=True)

    def test_values_from_file_are_parsed(self, tmp_path: Path) -> None:
        """Values from the file override defaults and are converted to their types."""
        path = conf(
            tmp_path,
            "[readiness]\ndeadline_s = 90\nlevel = local\n[policy]\npartitions = nvl72, gb200 ,\nchannel_mode = 0660\n",
        )
        s = load(path, node="gb01")
        assert s.source == path
        assert s.readiness.deadline_s == 90.0 and s.readiness.level == "local"
        assert s.policy.partitions == ("nvl72", "gb200")
        assert s.policy.channel_mode == 0o660

    def test_replace_overrides_parsed_values_only(self) -> None:
        """Settings.replace returns a copy with section__key changed and refuses unknown names."""
        s = load(None, node="gb01")
        t = s.replace(readiness__deadline_s=3.0)
        assert t.readiness.deadline_s == 3.0 and s.readiness.deadline_s == 60.0
        with pytest.raises(KeyError):
            s.replace(readiness__nope=1)


class TestSchemaErrors:
    def test_unknown_section(self, tmp_path: Path) -> None:
        """An unknown section is refused with file and section named."""
        path = conf(tmp_path, "[deamon]\nbackend = exec\n")
        with pytest.raises(ConfigError, match=rf"^{path}: \[deamon\]: unknown section"):
            load(path, node="gb01")

    def test_default_section_is_not_special(self, tmp_path: Path) -> None:
        """[DEFAULT] is refused on its line, not inherited by the rest."""
        path = conf(tmp_path, "[DEFAULT]\nlevel = debug\n")
        with pytest.raises(ConfigError, match=rf"^{path}: line 1: \[DEFAULT\] is not read"):
            load(path, node="gb01")

    def test_unknown_key_names_file_section_and_key(self, tmp_path: Path) -> None:
        """An unknown key is refused with file, section and key in the message."""
        path = conf(tmp_path, "[readiness]\ndeadline = 30\n")
        with pytest.raises(ConfigError, match=rf"^{path}: \[readiness\] deadline: unknown key$"):
            load(path, node="gb01")

    def test_keys_are_case_sensitive(self, tmp_path: Path) -> None:
        """A key in the wrong case is unknown rather than silently matched."""
        path = conf(tmp_path, "[daemon]\nBackend = exec\n")
        with pytest.raises(ConfigError, match=r"\[daemon\] Backend: unknown key"):
            load(path, node="gb01")

    def test_duplicate_key_is_refused(self, tmp_path: Path) -> None:
        """A key given twice in one section is an error naming the file."""
        path = conf(tmp_path, "[daemon]\nbackend = exec\nbackend = systemd\n")
        with pytest.raises(ConfigError, match=rf"^{path}: line 3: \[daemon\] backend given again"):
            load(path, node="gb01")

    def test_not_ini_is_refused(self, tmp_path: Path) -> None:
        """Text without a section header is an error naming the file."""
        path = conf(tmp_path, "backend = exec\n")
        with pytest.raises(ConfigError, match=rf"^{path}: "):
            load(path, node="gb01")

    @pytest.mark.parametrize(
        ("section", "key", "value", "reason"),
        [
            pytest.param("readiness", "deadline_s", "soon", "must be a number", id="float-type"),
            pytest.param("readiness", "deadline_s", "0", "must be between 0.1 and 3600", id="float-low"),
            pytest.param("readiness", "deadline_s", "nan", "must be between", id="float-nan"),
            pytest.param("readiness", "deadline_s", "60 # seconds", "must be a number", id="inline-comment"),
            pytest.param("policy", "channel_count", "1.5", "must be an integer", id="int-type"),
            pytest.param("policy", "channel_count", "1", "must be between 2 and 1048576", id="int-low"),
            pytest.param("policy", "channel_count", "1048577", "must be between 2 and 1048576", id="int-high"),
            pytest.param("daemon", "backend", "docker", "must be one of systemd, exec", id="choice"),
            pytest.param("readiness", "level", "LOCAL", "must be one of local, domain", id="choice-case"),
            pytest.param("policy", "channel_mode", "rw", "octal mode", id="mode-type"),
            pytest.param("policy", "channel_mode", "0777", "subset of 0666", id="mode-exec"),
            pytest.param("policy", "channel_mode", "4600", "subset of 0666", id="mode-setuid"),
            pytest.param("ports", "server_port_range", "a-b", "LOW-HIGH", id="range-type"),
            pytest.param("ports", "server_port_range", "62000-61000", "1024 <= LOW <= HIGH", id="range-reversed"),
            pytest.param("ports", "server_port_range", "80-90", "1024 <= LOW", id="range-privileged"),
            pytest.param("ports", "server_port_range", "61000-70000", "<= 65535", id="range-high"),
            pytest.param("paths", "run_dir", "run/imexctl", "absolute path", id="relative-path"),
            pytest.param("paths", "proc_devices", "", "absolute path", id="empty-required-path"),
            pytest.param("daemon", "unit", "imex/ctl", "plain name", id="name-slash"),
            pytest.param("daemon", "unit", "imexctl-imex@", "plain name", id="name-at"),
        ],
    )
    def test_bad_value_names_section_key_and_value(
        self, tmp_path: Path, section: str, key: str, value: str, reason: str
    ) -> None:
        """A value of the wrong type, range or choice is refused naming file, section, key and the value."""
        path = conf(tmp_path, f"[{section}]\n{key} = {value}\n")
        with pytest.raises(ConfigError) as info:
            load(path, node="gb01")
        message = str(info.value)
        assert message.startswith(f"{path}: [{section}] {key}: {value.strip()!r} ")
        assert reason in message

    def test_stock_unit_must_be_a_full_service_name(self, tmp_path: Path) -> None:
        """A stock unit without '.service' is refused: systemctl reports units only by their full name."""
        path = conf(tmp_path, "[daemon]\nstock_unit = nvidia-imex\n")
        with pytest.raises(ConfigError, match=r"\[daemon\] stock_unit: 'nvidia-imex' .*\.service"):
            load(path, node="gb01")

    def test_poll_initial_above_max_is_refused(self, tmp_path: Path) -> None:
        """A first poll interval longer than the maximum is refused."""
        path = conf(tmp_path, "[readiness]\npoll_initial_s = 2\npoll_max_s = 1\n")
        with pytest.raises(ConfigError, match=r"\[readiness\] poll_initial_s: must not exceed poll_max_s"):
            load(path, node="gb01")

    def test_partitions_policy_needs_partitions(self, tmp_path: Path) -> None:
        """jobs = partitions without a partition list is refused."""
        path = conf(tmp_path, "[policy]\njobs = partitions\n")
        with pytest.raises(ConfigError, match=r"\[policy\] partitions: must list partitions"):
            load(path, node="gb01")


class TestImexSection:
    @pytest.mark.parametrize("key", sorted(OWNED_IMEX_KEYS))
    def test_owned_key_cannot_be_overridden(self, tmp_path: Path, key: str) -> None:
        """Every key imexctl sets itself is refused in [imex]."""
        path = conf(tmp_path, f"[imex]\n{key} = 1\n")
        with pytest.raises(ConfigError, match=rf"\[imex\] {key}: is set by imexctl"):
            load(path, node="gb01")

    def test_unknown_key_is_refused(self, tmp_path: Path) -> None:
        """A key that is not an IMEX config.cfg key is refused (typos do not pass silently)."""
        path = conf(tmp_path, "[imex]\nIMEX_WAIT_FOR_QUORUMS = NONE\n")
        with pytest.raises(ConfigError, match=r"\[imex\] IMEX_WAIT_FOR_QUORUMS: unknown IMEX config.cfg key"):
            load(path, node="gb01")

    def test_lowercase_key_is_unknown(self, tmp_path: Path) -> None:
        """IMEX keys are upper case; a lower-case spelling is refused."""
        path = conf(tmp_path, "[imex]\nlog_level = 2\n")
        with pytest.raises(ConfigError, match="unknown IMEX config.cfg key"):
            load(path, node="gb01")

    def test_valid_keys_pass_through_verbatim(self, tmp_path: Path) -> None:
        """Known IMEX keys are kept as stripped strings."""
        path = conf(tmp_path, "[imex]\nLOG_LEVEL = 2\nIMEX_NODE_DISCONNECTED_GRACE_TIME = 60\n")
        assert load(path, node="gb01").imex == {"LOG_LEVEL": "2", "IMEX_NODE_DISCONNECTED_GRACE_TIME": "60"}

    def test_value_with_hash_is_refused(self, tmp_path: Path) -> None:
        """A value containing '#' (an inline comment) is refused: the daemon may not strip it."""
        path = conf(tmp_path, "[imex]\nLOG_LEVEL = 2 # quiet\n")
        with pytest.raises(ConfigError, match=r"\[imex\] LOG_LEVEL: value must be one line without '#'"):
            load(path, node="gb01")

    def test_multiline_value_is_refused(self, tmp_path: Path) -> None:
        """A continuation line would inject a second key into config.cfg and is refused."""
        path = conf(tmp_path, "[imex]\nLOG_LEVEL = 2\n  SERVER_PORT=1\n")
        with pytest.raises(ConfigError, match=rf"^{path}: line 3: indented: continuation lines are not read"):
            load(path, node="gb01")


class TestFilePermissions:
    @pytest.mark.parametrize(
        "mode", [pytest.param(0o664, id="group-writable"), pytest.param(0o646, id="world-writable")]
    )
    def test_writable_by_others_is_refused(self, tmp_path: Path, mode: int) -> None:
        """A config anyone but root may write is refused, with owner and mode in the message."""
        path = conf(tmp_path, "[log]\nlevel = debug\n", mode=mode)
        with pytest.raises(ConfigError) as info:
            load(path, node="gb01")
        assert str(info.value) == (
            f"{path}: config file must be owned by root and not writable by group or "
            f"others (owner uid {os.geteuid()}, mode {mode:04o})"
        )

    @needs_chown
    def test_owned_by_other_uid_is_refused(self, tmp_path: Path) -> None:
        """A config owned by an unprivileged uid is refused even with a safe mode."""
        path = conf(tmp_path, "[log]\nlevel = debug\n")
        os.chown(path, 65534, 65534)
        with pytest.raises(ConfigError, match=r"must be owned by root .*owner uid 65534, mode 0644"):
            load(path, node="gb01")

    @needs_chown
    def test_owned_by_the_invoking_uid_is_accepted(self, tmp_path: Path) -> None:
        """A non-root caller may read a config it owns itself (status as that user)."""
        path = conf(tmp_path, "[log]\nlevel = debug\n")
        os.chown(path, 65534, 65534)
        assert load(path, node="gb01", euid=65534).log.level == "debug"

    def test_read_only_for_others_is_accepted(self, tmp_path: Path) -> None:
        """A root-owned 0600 file is fine."""
        path = conf(tmp_path, "[log]\nlevel = debug\n", mode=0o600)
        assert load(path, node="gb01").log.level == "debug"

    def test_directory_is_refused(self, tmp_path: Path) -> None:
        """A directory in place of the config file is a ConfigError."""
        (tmp_path / "d").mkdir()
        with pytest.raises(ConfigError, match="cannot read config file"):
            load(tmp_path / "d", node="gb01")

    def test_not_utf8_is_refused(self, tmp_path: Path) -> None:
        """A config that is not UTF-8 text is a ConfigError."""
        path = tmp_path / "c.conf"
        path.write_bytes(b"[log]\nlevel = \xff\n")
        os.chmod(path, 0o644)
        with pytest.raises(ConfigError, match="not UTF-8"):
            load(path, node="gb01")


class TestConfigDirectory:
    """The directory holding the config file is root's too: whoever may write it can replace the file."""

    @pytest.mark.parametrize(
        "mode", [pytest.param(0o777, id="0777"), pytest.param(0o775, id="0775"), pytest.param(0o1777, id="sticky-1777")]
    )
    def test_writable_by_others_is_refused(self, tmp_path: Path, mode: int) -> None:
        """A good file in a group- or world-writable directory is refused, naming the directory."""
        d = tmp_path / "etc"
        d.mkdir()
        path = conf(d, "[log]\nlevel = debug\n")
        os.chmod(d, mode)
        with pytest.raises(ConfigError) as info:
            load(path, node="gb01")
        assert str(info.value) == (
            f"{path}: config directory {d} must be owned by root and not writable by group or others "
            f"(owner uid {os.geteuid()}, mode {mode:04o})"
        )

    @needs_chown
    def test_owned_by_another_uid_is_refused(self, tmp_path: Path) -> None:
        """A 0755 directory that another uid owns is refused."""
        d = tmp_path / "etc"
        d.mkdir(mode=0o755)
        path = conf(d, "[log]\nlevel = debug\n")
        os.chown(d, 1501, 1501)
        with pytest.raises(
            ConfigError, match=rf"config directory {d} must be owned by root .*owner uid 1501, mode 0755"
        ):
            load(path, node="gb01")

    def test_symlinked_directory_is_judged_by_where_it_leads(self, tmp_path: Path) -> None:
        """A symlink in place of the directory is followed like a symlinked config file: the
        directory it leads to must pass (a world-writable one is refused and named)."""
        real = tmp_path / "real"
        real.mkdir(mode=0o755)
        conf(real, "[log]\nlevel = debug\n")
        (tmp_path / "etc").symlink_to(real)
        assert load(tmp_path / "etc" / "imexctl.conf", node="gb01").log.level == "debug"
        os.chmod(real, 0o777)
        with pytest.raises(ConfigError, match=f"config directory {real} must be owned by root"):
            load(tmp_path / "etc" / "imexctl.conf", node="gb01")

    def test_symlinked_file_into_a_writable_directory_is_refused(self, tmp_path: Path) -> None:
        """A link in a good directory to a good file in a world-writable one: the file's directory decides."""
        shared = tmp_path / "shared"
        shared.mkdir()
        target = conf(shared, "[log]\nlevel = debug\n")
        os.chmod(shared, 0o777)
        etc = tmp_path / "etc"
        etc.mkdir(mode=0o755)
        (etc / "imexctl.conf").symlink_to(target)
        with pytest.raises(ConfigError, match=f"config directory {shared} must be owned by root .*mode 0777"):
            load(etc / "imexctl.conf", node="gb01")

    def test_missing_default_file_checks_nothing(self, tmp_path: Path) -> None:
        """No file, no check: a missing default config in a writable directory is simply the defaults."""
        os.chmod(tmp_path, 0o777)
        assert load(tmp_path / "imexctl.conf", node="gb01", required=False).source is None


class TestPaths:
    def test_paths_are_rebased_under_root(self, tmp_path: Path) -> None:
        """Every path setting lands under [paths] root."""
        path = conf(tmp_path, "[paths]\nroot = /srv/n1\ntopology_file = /etc/slurm/topology.conf\n")
        p = load(path, node="gb01").paths
        assert p.root == Path("/srv/n1")
        assert p.run_dir == Path("/srv/n1/run/imexctl")
        assert p.channel_dir == Path("/srv/n1/dev/nvidia-caps-imex-channels")
        assert p.proc_devices == Path("/srv/n1/proc/devices")
        assert p.log_file == Path("/srv/n1/var/log/imexctl.log")
        assert p.imex_log_file == Path("/srv/n1/var/log/nvidia-imex.log")
        assert p.hosts_file == Path("/srv/n1/etc/imexctl/hosts")
        assert p.topology_file == Path("/srv/n1/etc/slurm/topology.conf")
        assert p.jobs_dir == Path("/srv/n1/run/imexctl/jobs") and p.job(7).path == Path("/srv/n1/run/imexctl/jobs/7")
        assert p.job(7).config == Path("/srv/n1/run/imexctl/jobs/7/config.cfg") and p.job(7).job_id == 7
        assert p.lock_file == Path("/srv/n1/run/imexctl/lock")

    def test_percent_n_in_root_is_the_node_name(self, tmp_path: Path) -> None:
        """%n in [paths] root becomes this node's name, so one config serves many simulated trays."""
        path = conf(tmp_path, "[paths]\nroot = /srv/sim/%n/root\n")
        p = load(path, node="gb07").paths
        assert p.root == Path("/srv/sim/gb07/root") and p.run_dir == Path("/srv/sim/gb07/root/run/imexctl")

    def test_paths_are_normalised(self, tmp_path: Path) -> None:
        """Dot segments and doubled slashes in a path setting are normalised."""
        path = conf(tmp_path, "[paths]\nrun_dir = /run/./x//imexctl/\n")
        assert load(path, node="gb01").paths.run_dir == Path("/run/x/imexctl")

    def test_empty_log_file_disables_it(self, tmp_path: Path) -> None:
        """An empty log_file means no log file."""
        path = conf(tmp_path, "[paths]\nlog_file =\n")
        assert load(path, node="gb01").paths.log_file is None


class TestTopology:
    def test_auto_is_topology_conf_with_a_file_and_none_without(self, tmp_path: Path) -> None:
        """source = auto (default): today's rule, a topology_file is a topology.conf; none without one."""
        assert load(None, node="gb01").topology.source == "none"
        path = conf(tmp_path, "[paths]\ntopology_file = /etc/slurm/topology.conf\n")
        s = load(path, node="gb01")
        assert s.topology.source == "topology_conf" and s.paths.topology_file == Path("/etc/slurm/topology.conf")

    def test_map_file_is_rebased_under_root(self, tmp_path: Path) -> None:
        """[paths] topology_map lands under root like every path."""
        text = (
            "[paths]\nroot = /srv/n1\ntopology_file = /t.yaml\ntopology_map = /m\n[topology]\nsource = topology_yaml\n"
        )
        s = load(conf(tmp_path, text), node="gb01")
        assert (s.paths.topology_file, s.paths.topology_map) == (Path("/srv/n1/t.yaml"), Path("/srv/n1/m"))

    @pytest.mark.parametrize(
        ("text", "match"),
        [
            pytest.param(
                "[topology]\nsource = map\n", r"\[topology\] source: map needs \[paths\] topology_file", id="no-file"
            ),
            pytest.param(
                "[paths]\ntopology_file = /t\n[topology]\nsource = none\n",
                r"\[paths\] topology_file: is set but \[topology\] source = none would ignore it",
                id="none-with-file",
            ),
            pytest.param(
                "[paths]\ntopology_file = /t\ntopology_map = /m\n[topology]\nsource = map\n",
                r"\[paths\] topology_map: checks a topology_conf or topology_yaml source, not map",
                id="map-twice",
            ),
            pytest.param(
                "[paths]\ntopology_map = /m\n", r"\[paths\] topology_map: checks .* not none", id="map-without-source"
            ),
            pytest.param(
                "[paths]\ntopology_file = /t\n[topology]\nyaml_topology = racks\n",
                r"\[topology\] yaml_topology: needs source = topology_yaml",
                id="yaml-name-without-yaml",
            ),
            pytest.param(
                "[topology]\nsource = slurm\n", r"\[topology\] source: 'slurm' must be one of auto", id="value"
            ),
        ],
    )
    def test_contradictions_are_config_errors(self, tmp_path: Path, text: str, match: str) -> None:
        """A source without its file, a file no source reads, a map beside a map: each names its key."""
        with pytest.raises(ConfigError, match=match):
            load(conf(tmp_path, text), node="gb01")


def test_schema_sections_are_documented_names() -> None:
    """The schema has exactly the sections the configuration reference describes."""
    assert list(schema.SCHEMA) == [
        "paths",
        "commands",
        "daemon",
        "policy",
        "readiness",
        "slurm",
        "ports",
        "resolve",
        "topology",
        "log",
        "metrics",
        "auth",
        "containers",
    ]


def test_section_dataclasses_have_exactly_the_schema_keys() -> None:
    """Each section's frozen dataclass has schema.SCHEMA's keys as its fields, in the same order."""
    for name, cls in settings.SECTIONS.items():
        assert list(cls._fields) == list(SCHEMA[name]), name
