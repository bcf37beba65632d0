"""Container checks for ``imexctl doctor`` on sample toolkit, CDI and enroot configurations (tests/data/containers)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from imexctl.doctor import containers
from imexctl.doctor.framework import FAIL, OK, WARN, Check
from tests.support.privileges import needs_chown

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data" / "containers"
TOOLKIT_SAMPLES = sorted(p.name for p in (DATA / "toolkit").glob("*.toml"))


def _by_name(checks: list[Check]) -> dict[str, Check]:
    names = [c.name for c in checks]
    assert len(names) == len(set(names)), names
    return {c.name: c for c in checks}


def _statuses(checks: list[Check]) -> dict[str, str]:
    return {c.name: c.status for c in checks}


def _toolkit_root(tmp_path: Path, sample: str | None, *, installed: bool = True) -> Path:
    if installed:
        (tmp_path / "usr/bin").mkdir(parents=True)
        (tmp_path / "usr/bin/nvidia-ctk").write_text("")
    if sample is not None:
        (tmp_path / "etc/nvidia-container-runtime").mkdir(parents=True)
        shutil.copy(DATA / "toolkit" / sample, tmp_path / containers.TOOLKIT_CONFIG)
    return tmp_path


class TestToolkit:
    @pytest.mark.parametrize(
        ("sample", "requests", "creation"),
        [
            pytest.param("good.toml", OK, OK, id="good"),
            pytest.param("good-dotted.toml", OK, OK, id="dotted-keys"),
            pytest.param("good-no-kmods.toml", OK, OK, id="no-kmods"),
            pytest.param("risky-default.toml", WARN, WARN, id="default"),
            pytest.param("risky-false.toml", WARN, WARN, id="flags-false"),
            pytest.param("inline.toml", OK, OK, id="inline-table"),
            pytest.param("array-of-tables.toml", WARN, WARN, id="features-not-a-table"),
        ],
    )
    def test_imex_flags(self, tmp_path: Path, sample: str, requests: str, creation: str) -> None:
        """ignore-imex-channel-requests and disable-imex-channel-creation (or load-kmods off) decide OK or WARN."""
        checks = _by_name(containers.toolkit_checks(_toolkit_root(tmp_path, sample)))
        assert checks["containers.toolkit.config"].status == OK
        assert checks["containers.toolkit.imex_requests"].status == requests
        assert checks["containers.toolkit.imex_creation"].status == creation
        if requests == WARN:
            assert "ignore-imex-channel-requests = true" in checks["containers.toolkit.imex_requests"].fix

    def test_quoted_boolean_fails(self, tmp_path: Path) -> None:
        """``ignore-imex-channel-requests = "true"`` is a string: FAIL, naming the key and the fix."""
        checks = _by_name(containers.toolkit_checks(_toolkit_root(tmp_path, "invalid-string.toml")))
        check = checks["containers.toolkit.imex_requests"]
        assert check.status == FAIL and "'true' is not a boolean" in check.message and "no quotes" in check.fix
        assert checks["containers.toolkit.imex_creation"].status == OK

    def test_broken_toml_fails(self, tmp_path: Path) -> None:
        """A config the toolkit cannot parse is a FAIL; the flags are not judged."""
        checks = _by_name(containers.toolkit_checks(_toolkit_root(tmp_path, "invalid-syntax.toml")))
        assert checks["containers.toolkit.config"].status == FAIL
        assert "containers.toolkit.imex_requests" not in checks

    def test_missing_config_with_the_toolkit_installed_warns(self, tmp_path: Path) -> None:
        """No config.toml: the toolkit's defaults honour requests, so WARN with the nvidia-ctk line to write it."""
        checks = _by_name(containers.toolkit_checks(_toolkit_root(tmp_path, None)))
        check = checks["containers.toolkit.config"]
        assert check.status == WARN and "nvidia-ctk config --in-place --set features.ignore-imex" in check.fix

    def test_not_installed_is_ok(self, tmp_path: Path) -> None:
        """Without the toolkit's programs there is nothing to check, even if a config file lies around."""
        checks = containers.toolkit_checks(_toolkit_root(tmp_path, "risky-default.toml", installed=False))
        assert _statuses(checks) == {"containers.toolkit": OK}
        assert "not installed" in checks[0].message

    @pytest.mark.parametrize(
        ("output", "status"),
        [
            pytest.param("NVIDIA Container Toolkit CLI version 1.17.5\ncommit: 0123abc\n", OK, id="1.17.5"),
            pytest.param("NVIDIA Container Toolkit CLI version 1.20.0\n", OK, id="1.20.0"),
            pytest.param("NVIDIA Container Toolkit CLI version 1.17.4\n", WARN, id="1.17.4"),
            pytest.param("NVIDIA Container Toolkit CLI version 1.14.6\n", WARN, id="1.14.6"),
            pytest.param("NVIDIA Container Toolkit CLI version 1.14.5\n", OK, id="before-imex"),
            pytest.param("nvidia-ctk: command failed\n", WARN, id="no-version"),
        ],
    )
    def test_version(self, tmp_path: Path, output: str, status: str) -> None:
        """Toolkits from 1.14.6 to before 1.17.5 honour requests and cannot be told not to: WARN, upgrade."""
        checks = _by_name(containers.toolkit_checks(_toolkit_root(tmp_path, "good.toml"), version_output=output))
        assert checks["containers.toolkit.version"].status == status

    def test_unprivileged_env_setting_is_reported(self, tmp_path: Path) -> None:
        """accept-nvidia-visible-devices-envvar-when-unprivileged = false limits requests to privileged containers."""
        checks = _by_name(containers.toolkit_checks(_toolkit_root(tmp_path, "risky-false.toml")))
        assert "privileged containers only" in checks["containers.toolkit.unprivileged_env"].message


class TestCdi:
    def test_spec_listing_channels_warns(self, tmp_path: Path) -> None:
        """A static CDI spec with IMEX channel nodes is a WARN naming the file; the GPU spec is fine."""
        shutil.copytree(DATA / "cdi", tmp_path, dirs_exist_ok=True)
        (check,) = containers.cdi_checks(tmp_path)
        assert check.status == WARN and check.message.endswith("etc/cdi/nvidia-imex.yaml")

    def test_no_specs_is_ok(self, tmp_path: Path) -> None:
        """No CDI directory at all: OK."""
        assert _statuses(containers.cdi_checks(tmp_path)) == {"containers.cdi": OK}

    def test_symlinked_spec_directory_is_not_followed(self, tmp_path: Path) -> None:
        """``var/run`` as a symlink (to the real /run on a tray) is not followed out of the checked root."""
        shutil.copytree(DATA / "cdi", tmp_path / "elsewhere")
        (tmp_path / "var").mkdir()
        (tmp_path / "var" / "run").symlink_to(tmp_path / "elsewhere" / "etc")
        assert _statuses(containers.cdi_checks(tmp_path)) == {"containers.cdi": OK}


def _enroot_root(tmp_path: Path, sample: str, *, hook: bool) -> Path:
    root = tmp_path / "root"
    shutil.copytree(DATA / sample, root)
    hooks = root / "etc/enroot/hooks.d"
    if hook:
        shutil.copy(REPO / "hooks" / "enroot" / "99-imexctl.sh", hooks / "99-imexctl.sh")
    for p in hooks.iterdir():
        os.chmod(p, 0o755)
        if os.geteuid() == 0:
            os.chown(p, 0, 0)
    return root


class TestEnroot:
    @needs_chown
    def test_good_setup(self, tmp_path: Path) -> None:
        """enroot 4.1.2 with imexctl's hook installed root:root 0755 after the stock hooks: all OK."""
        checks = _by_name(containers.enroot_checks(_enroot_root(tmp_path, "enroot-good", hook=True)))
        assert set(_statuses(list(checks.values())).values()) == {OK}, checks
        assert "enroot 4.1.2" in checks["containers.enroot"].message
        assert "the host's /dev" in checks["containers.enroot"].message

    def test_risky_setup(self, tmp_path: Path) -> None:
        """Old enroot, ENROOT_RESTRICT_DEV, no imexctl hook, a site hook and a fixed channel: each is a WARN."""
        checks = _by_name(containers.enroot_checks(_enroot_root(tmp_path, "enroot-risky", hook=False)))
        assert _statuses(list(checks.values())) == {
            "containers.enroot": OK,
            "containers.enroot.hook": WARN,
            "containers.enroot.other_hooks": WARN,
            "containers.enroot.environment": WARN,
        }
        assert "a fresh /dev" in checks["containers.enroot"].message
        assert "no channel at all" in checks["containers.enroot.hook"].message
        assert "install -o root -g root -m 0755 hooks/enroot/99-imexctl.sh" in checks["containers.enroot.hook"].fix
        assert "50-site-gpu.sh" in checks["containers.enroot.other_hooks"].message
        assert "90-imex.env" in checks["containers.enroot.environment"].message

    def test_missing_hook_on_a_recent_enroot_names_the_channels_containers_see(self, tmp_path: Path) -> None:
        """Without the hook on enroot 4.x containers see every channel node: WARN says so."""
        checks = _by_name(containers.enroot_checks(_enroot_root(tmp_path, "enroot-good", hook=False)))
        assert checks["containers.enroot.hook"].status == WARN
        assert "every channel node" in checks["containers.enroot.hook"].message

    def test_hook_writable_by_others_fails(self, tmp_path: Path) -> None:
        """A hook others may write runs their code in every user's container start: FAIL."""
        root = _enroot_root(tmp_path, "enroot-good", hook=True)
        os.chmod(root / "etc/enroot/hooks.d/99-imexctl.sh", 0o777)
        check = _by_name(containers.enroot_checks(root))["containers.enroot.hook"]
        assert check.status == FAIL and "chmod 0755" in check.fix

    @needs_chown
    def test_hook_not_executable_for_users_warns(self, tmp_path: Path) -> None:
        """enroot runs hooks as the user: a hook users cannot read and execute is skipped, so WARN."""
        root = _enroot_root(tmp_path, "enroot-good", hook=True)
        os.chmod(root / "etc/enroot/hooks.d/99-imexctl.sh", 0o700)
        check = _by_name(containers.enroot_checks(root))["containers.enroot.hook"]
        assert check.status == WARN and "enroot skips it" in check.message

    @needs_chown
    def test_hook_sorting_before_the_dev_hooks_warns(self, tmp_path: Path) -> None:
        """Renamed to run before 98-nvidia.sh, the hook's work would be undone: WARN."""
        root = _enroot_root(tmp_path, "enroot-good", hook=True)
        hooks = root / "etc/enroot/hooks.d"
        (hooks / "99-imexctl.sh").rename(hooks / "50-imexctl.sh")
        check = _by_name(containers.enroot_checks(root))["containers.enroot.hook"]
        assert check.status == WARN and "98-nvidia.sh" in check.message

    @needs_chown
    def test_an_older_hook_that_execs_the_interpreter_warns(self, tmp_path: Path) -> None:
        """The pre-fail-safe hook (exec python -m imexctl.channels.enroot) stops every start when imexctl breaks: WARN."""
        root = _enroot_root(tmp_path, "enroot-good", hook=True)
        hook = root / "etc/enroot/hooks.d/99-imexctl.sh"
        hook.write_text(
            "#!/bin/sh\n[ -x /opt/imexctl/bin/python ] || exit 0\nexec /opt/imexctl/bin/python -I -m imexctl.channels.enroot\n"
        )
        check = _by_name(containers.enroot_checks(root))["containers.enroot.hook"]
        assert check.status == WARN and "older copy that stops every container start" in check.message
        assert check.fix.startswith("install -o root -g root -m 0755 hooks/enroot/99-imexctl.sh ")

    @needs_chown
    def test_sysconf_path_from_enroot_conf_is_followed(self, tmp_path: Path) -> None:
        """ENROOT_SYSCONF_PATH in enroot.conf moves hooks.d: the hook is looked for there."""
        root = _enroot_root(tmp_path, "enroot-good", hook=True)
        (root / "opt/enroot").mkdir(parents=True)
        shutil.move(str(root / "etc/enroot/hooks.d"), str(root / "opt/enroot/hooks.d"))
        (root / "etc/enroot/enroot.conf").write_text("ENROOT_SYSCONF_PATH=/opt/enroot\n")
        check = _by_name(containers.enroot_checks(root))["containers.enroot.hook"]
        assert check.status == OK and "/opt/enroot/hooks.d/99-imexctl.sh" in check.message

    @needs_chown
    def test_hook_linked_to_the_packaged_file_is_ok(self, tmp_path: Path) -> None:
        """A link to the packages' /usr/share/imexctl/hooks/enroot/99-imexctl.sh (root's, 0755) is fine."""
        root = _enroot_root(tmp_path, "enroot-good", hook=False)
        shared = root / "usr/share/imexctl/hooks/enroot"
        shared.mkdir(parents=True)
        shutil.copy(REPO / "hooks" / "enroot" / "99-imexctl.sh", shared / "99-imexctl.sh")
        os.chmod(shared / "99-imexctl.sh", 0o755)
        (root / "etc/enroot/hooks.d/99-imexctl.sh").symlink_to("/usr/share/imexctl/hooks/enroot/99-imexctl.sh")
        check = _by_name(containers.enroot_checks(root))["containers.enroot.hook"]
        assert check.status == OK, check
        os.chmod(shared, 0o777)
        check = _by_name(containers.enroot_checks(root))["containers.enroot.hook"]
        assert check.status == FAIL and str(shared) in check.message

    def test_not_installed_is_ok(self, tmp_path: Path) -> None:
        """No /usr/bin/enroot: nothing to check."""
        assert _statuses(containers.enroot_checks(tmp_path)) == {"containers.enroot": OK}

    @pytest.mark.parametrize(
        ("value", "set_"),
        [
            ("yes", True),
            ("y", True),
            ("1", True),
            ("no", False),
            ("n", False),
            ("false", False),
            ("F", False),
            ("", False),
        ],
    )
    def test_enroot_flag_values(self, value: str, set_: bool) -> None:
        """enroot unsets ENROOT_* values that read as no/false (enroot.in config::fini)."""
        assert containers._enroot_flag(value) is set_


class TestChannel0:
    def test_channel0_warns(self, tmp_path: Path) -> None:
        """channel0 in the channel directory is a WARN naming the module option."""
        (tmp_path / "channel0").write_text("")
        (check,) = containers.channel_checks(tmp_path)
        assert check.status == WARN and "NVreg_CreateImexChannel0" in check.fix

    def test_no_channel0_is_ok(self, tmp_path: Path) -> None:
        """Only per-job channels: OK."""
        (tmp_path / "channel5").write_text("")
        assert _statuses(containers.channel_checks(tmp_path)) == {"containers.channel0": OK}


def test_run_all_on_an_empty_root_is_all_ok(tmp_path: Path) -> None:
    """A tray without toolkit, CDI specs, enroot or channel0: every check OK, each name once."""
    checks = containers.run_all(tmp_path)
    assert {c.status for c in checks} == {OK}
    assert [c.name for c in checks] == [
        "containers.toolkit",
        "containers.cdi",
        "containers.enroot",
        "containers.channel0",
    ]
