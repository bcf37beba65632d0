"""``imexctl task-prolog`` and :mod:`imexctl.channels.job`: the job's channel as the job's user finds it.

Most tests use ``/dev/null`` (character device 1:3, root's) as the job's
channel and tell the code the caller is uid 0, so they run as any user; the
tests that need a real node owned by another uid, or a real unprivileged
caller, say why they skip.
"""

from __future__ import annotations

import io
import os
import pwd
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from imexctl import cli
from imexctl.channels import job as jobchannel
from imexctl.channels import taskprolog
from imexctl.config import settings
from imexctl.platform.errors import ConfigError
from tests.support.jobtree import Tree, tree
from tests.support.privileges import ROOT

REPO = Path(__file__).resolve().parents[2]
LAB_USER = "imexlab"
EXPORT = "export NVIDIA_IMEX_CHANNELS=3"


@pytest.fixture
def t() -> Iterator[Tree]:
    with tree() as made:
        yield made


def _lines(t: Tree, job_id: int | None, *, uid: int = 0, uid_map: jobchannel.UidMap = None, **env: str) -> list[str]:
    return taskprolog.lines(t.env(job_id, **env), uid=uid, uid_map=uid_map, read_map=False)


def _debug(t: Tree, job_id: int | None, **kw: object) -> str:
    out = _lines(t, job_id, IMEXCTL_TASK_PROLOG_DEBUG="1", **kw)  # type: ignore[arg-type]
    assert len(out) == 1 and out[0].startswith("print imexctl: no IMEX channel exported: "), out
    return out[0]


class TestExport:
    def test_job_with_a_channel_gets_its_minor(self, t: Tree) -> None:
        """A task of a job whose channel exists and is its user's gets exactly one export line."""
        t.add_job(77, uid=0, minor=3, channel_path="/dev/null")
        assert _lines(t, 77) == [EXPORT]

    def test_without_a_job_id_nothing_is_printed(self, t: Tree) -> None:
        """Outside a job (no SLURM_JOB_ID) nothing is printed; the debug line says why."""
        assert _lines(t, None) == []
        assert "SLURM_JOB_ID" in _debug(t, None)

    def test_job_without_a_domain_here_gets_nothing(self, t: Tree) -> None:
        """A job with no directory on this tray gets nothing."""
        t.add_job(78, uid=0, minor=3, channel_path="/dev/null")
        assert _lines(t, 77) == []
        assert "no imexctl domain for job 77" in _debug(t, 77)

    def test_tray_without_imexctl_state_gets_nothing(self, t: Tree) -> None:
        """A tray where no prolog ever ran (no run directory) gets nothing."""
        assert _lines(t, 77) == []
        assert "run directory" in _debug(t, 77)

    def test_another_users_job_gets_nothing(self, t: Tree) -> None:
        """A caller whose uid is not the job's gets nothing, even with the job's id in its environment."""
        t.add_job(77, uid=5000, minor=3, channel_path="/dev/null")
        assert _lines(t, 77) == []
        assert "belongs to uid 5000, not to uid 0" in _debug(t, 77)

    def test_job_without_a_channel_gets_nothing(self, t: Tree) -> None:
        """With ``[policy] channels = none`` the state has no channel: nothing is exported."""
        t.add_job(77, uid=0, minor=None)
        assert _lines(t, 77) == []
        assert "channels = none" in _debug(t, 77)

    def test_missing_channel_node_gets_nothing(self, t: Tree) -> None:
        """A recorded channel whose node is gone exports nothing (the TaskProlog never fails the task)."""
        t.add_job(77, uid=0, minor=3)
        assert _lines(t, 77) == []
        assert "is missing" in _debug(t, 77)

    def test_node_with_another_minor_gets_nothing(self, t: Tree) -> None:
        """A node whose minor is not the recorded one is not the job's channel."""
        t.add_job(77, uid=0, minor=4, channel_path="/dev/null")
        assert "has minor 3, not 4" in _debug(t, 77)

    def test_node_owned_by_another_uid_gets_nothing(self, t: Tree) -> None:
        """A node that is not the job user's (here root's /dev/null for uid 5) is not exported."""
        t.add_job(77, uid=5, minor=3, channel_path="/dev/null")
        assert _lines(t, 77, uid=5) == []
        assert "owned by uid 0, not by the job's uid 5" in _debug(t, 77, uid=5)

    def test_node_that_is_not_a_character_device_gets_nothing(self, t: Tree) -> None:
        """A regular file at the channel's path is refused."""
        t.add_job(77, uid=0, minor=3)
        t.channel_path(3).write_text("")
        assert "not a character device" in _debug(t, 77)

    def test_channel_reached_through_a_symlink_is_refused(self, t: Tree) -> None:
        """A symlink at the channel's path is not followed, even to the right node."""
        t.add_job(77, uid=0, minor=3)
        t.channel_path(3).symlink_to("/dev/null")
        assert "symbolic link" in _debug(t, 77)

    def test_het_component_domain_is_found_through_its_group_variable(self, t: Tree) -> None:
        """A het job's task sees the leader id; a per-component domain is found through SLURM_JOB_ID_HET_GROUP_1."""
        t.add_job(101, uid=0, minor=3, channel_path="/dev/null")
        assert _lines(t, 100, SLURM_JOB_ID_HET_GROUP_0="100", SLURM_JOB_ID_HET_GROUP_1="101") == [EXPORT]

    def test_het_component_domain_is_found_through_srun_pack_group_variable(self, t: Tree) -> None:
        """Tasks of an ``srun ... : ...`` het job see SLURM_JOB_ID_PACK_GROUP_<n> (the lab's 24.11): found too."""
        t.add_job(101, uid=0, minor=3, channel_path="/dev/null")
        assert _lines(t, 100, SLURM_JOB_ID_PACK_GROUP_0="100", SLURM_JOB_ID_PACK_GROUP_1="101") == [EXPORT]

    def test_remapped_root_caller_is_the_job_user(self, t: Tree) -> None:
        """Inside a user namespace that maps 0 to the job's uid (Pyxis --container-remap-root) uid 0 is the user."""
        t.add_job(77, uid=4242, minor=3, channel_path="/dev/null")
        # /dev/null is root's: through this map its owner reads as the job's uid, as a remapped node would
        assert _lines(t, 77, uid=0, uid_map=((0, 4242, 1),)) == [EXPORT]


class TestStateFiles:
    @pytest.mark.parametrize(
        ("content", "reason"),
        [
            pytest.param("{", "not JSON", id="not-json"),
            pytest.param("[]", "lacks uid", id="not-an-object"),
            pytest.param('{"uid": "0", "channel_minor": 3, "channel_path": "/dev/null"}', "lacks uid", id="uid-string"),
            pytest.param('{"uid": true, "channel_minor": 3, "channel_path": "/dev/null"}', "boolean", id="uid-bool"),
            pytest.param('{"uid": 0, "channel_minor": -3, "channel_path": "/dev/null"}', "negative", id="minor-neg"),
            pytest.param('{"uid": 0, "channel_minor": 3, "channel_path": "dev/null"}', "not absolute", id="relative"),
        ],
    )
    def test_malformed_state_exports_nothing(self, t: Tree, content: str, reason: str) -> None:
        """A state.json the prolog would never write exports nothing and the debug line names the fault."""
        jd = t.add_job(77, uid=0, minor=3, channel_path="/dev/null")
        (jd / "state.json").write_text(content)
        assert reason in _debug(t, 77)

    def test_state_file_writable_by_others_is_refused(self, t: Tree) -> None:
        """A state.json that others may write could name any node: refused."""
        jd = t.add_job(77, uid=0, minor=3, channel_path="/dev/null")
        (jd / "state.json").chmod(0o666)
        assert "writable only by root" in _debug(t, 77)

    def test_job_directory_writable_by_others_is_refused(self, t: Tree) -> None:
        """A job directory that others may write is refused."""
        jd = t.add_job(77, uid=0, minor=3, channel_path="/dev/null")
        jd.chmod(0o777)
        assert "may be written by others" in _debug(t, 77)

    def test_state_file_symlink_is_not_followed(self, t: Tree) -> None:
        """A symlink in place of state.json is refused, not followed."""
        jd = t.add_job(77, uid=0, minor=3, channel_path="/dev/null")
        good = jd.parent / "elsewhere.json"
        (jd / "state.json").rename(good)
        (jd / "state.json").symlink_to(good)
        assert "symbolic link" in _debug(t, 77)

    def test_job_directory_symlink_is_not_followed(self, t: Tree) -> None:
        """A symlink in place of the job's directory is refused, not followed."""
        jd = t.add_job(78, uid=0, minor=3, channel_path="/dev/null")
        (jd.parent / "77").symlink_to(jd)
        assert "symbolic link" in _debug(t, 77)

    def test_state_written_by_the_prolog_is_world_readable(self, t: Tree) -> None:
        """The prolog's state.json is 0644 in 0755 directories, so the job's user can read it."""
        jd = t.add_job(77, uid=0, minor=3)
        assert oct((jd / "state.json").stat().st_mode & 0o777) == "0o644"
        for d in (jd, jd.parent, jd.parent.parent):
            assert oct(d.stat().st_mode & 0o777) == "0o755", d


class TestConfig:
    def test_explicit_config_that_is_missing_exports_nothing(self, t: Tree) -> None:
        """$IMEXCTL_CONFIG naming a missing file exports nothing (the file must exist, as for every command)."""
        t.add_job(77, uid=0, minor=3, channel_path="/dev/null")
        assert "config file not found" in _debug(t, 77, IMEXCTL_CONFIG=str(t.base / "nope.conf"))

    def test_config_writable_by_others_is_refused(self, t: Tree) -> None:
        """A config anybody may write could move run_dir: refused like imexctl.config.settings refuses it."""
        t.add_job(77, uid=0, minor=3, channel_path="/dev/null")
        t.config.chmod(0o666)
        assert "owned by root" in _debug(t, 77)

    def test_node_name_fills_percent_n_in_root(self, t: Tree) -> None:
        """``root = .../%n`` takes SLURMD_NODENAME, as the prolog does."""
        (t.base / "n7").mkdir(mode=0o755)
        t.config.write_text(f"[paths]\nroot = {t.base}/%n\n")
        t.add_job(77, uid=0, minor=3, channel_path="/dev/null", paths=settings.load(t.config, node="n7").paths)
        assert _lines(t, 77, SLURMD_NODENAME="n7") == [EXPORT]
        assert _lines(t, 77, SLURMD_NODENAME="n8") == []
        assert "SLURMD_NODENAME='a/b' is not a node name: it cannot stand for %n" in _debug(
            t, 77, SLURMD_NODENAME="a/b"
        )

    @pytest.mark.parametrize(
        "text",
        [
            pytest.param("", id="empty"),
            pytest.param("[paths]\nrun_dir = /var/run//imexctl/\n", id="unnormalised"),
            pytest.param("[paths]\nroot = /srv/n/%n/\nproc_devices = /x/devices\n", id="percent-n"),
            pytest.param("[paths]\nroot = /\nrun_dir = /\n", id="run-dir-root"),
            pytest.param("[paths]\nroot = /srv\nrun_dir = /\n", id="run-dir-root-under-root"),
            pytest.param("[policy]\nchannels = none\n[paths]\nrun_dir   =   /r  \n", id="spaces"),
            pytest.param("# comment\n[paths]\n; other\nroot = /a\n  # indented\n", id="comments"),
        ],
    )
    def test_paths_are_what_settings_computes(self, tmp_path: Path, text: str) -> None:
        """run_dir and proc_devices agree with imexctl.config.settings.load for the same file."""
        cfg = tmp_path / "imexctl.conf"
        cfg.write_text(text)
        cfg.chmod(0o644)
        want = settings.load(cfg, node="gb01").paths
        got = jobchannel.read_paths({"IMEXCTL_CONFIG": str(cfg), "SLURMD_NODENAME": "gb01"})
        assert (got.run_dir, got.proc_devices) == (str(want.run_dir), str(want.proc_devices))

    @pytest.mark.parametrize(
        ("text", "why"),
        [
            pytest.param("[paths]\nroot: /a\n", "line 2: a ':' before the '='", id="colon"),
            pytest.param("[paths]\n  run_dir = /r\n", "line 2: indented", id="indented"),
            pytest.param("[paths]\nrun_dir = r\n", "[paths] run_dir: 'r' must be an absolute path", id="relative"),
        ],
    )
    def test_a_config_the_prolog_refuses_exports_nothing(self, t: Tree, text: str, why: str) -> None:
        """A file the prolog refuses (grammar or [paths]) exports nothing, and says why as the prolog would."""
        t.add_job(77, uid=0, minor=3, channel_path="/dev/null")
        t.config.write_text(text)
        with pytest.raises(ConfigError, match=re.escape(why)):
            settings.load(t.config, node="gb01")
        assert _lines(t, 77) == [] and why in _debug(t, 77)


class TestJobIds:
    @pytest.mark.parametrize(
        ("env", "ids"),
        [
            pytest.param({"SLURM_JOB_ID": "7"}, (7,), id="plain"),
            pytest.param({"SLURM_JOBID": "7"}, (7,), id="old-name"),
            pytest.param({"SLURM_JOB_ID": "7", "SLURM_HET_JOB_ID": "7"}, (7,), id="het-leader-once"),
            pytest.param(
                {"SLURM_JOB_ID": "7", "SLURM_JOB_ID_HET_GROUP_10": "9", "SLURM_JOB_ID_HET_GROUP_2": "8"},
                (7, 8, 9),
                id="het-groups-in-number-order",
            ),
            pytest.param(
                {"SLURM_JOB_ID": "7", "SLURM_JOB_ID_PACK_GROUP_1": "8", "SLURM_JOB_ID_PACK_GROUP_0": "7"},
                (7, 8),
                id="srun-het-pack-groups",
            ),
            pytest.param(
                {"SLURM_JOB_ID": "7", "SLURM_JOB_ID_PACK_GROUP_1": "9", "SLURM_JOB_ID_HET_GROUP_1": "8"},
                (7, 8, 9),
                id="het-before-pack-in-one-group",
            ),
            pytest.param({"SLURM_JOB_ID_PACK_GROUP_\u0661": "8"}, (), id="non-ascii-group-number"),
            pytest.param({"SLURM_JOB_ID": "0"}, (), id="zero"),
            pytest.param({"SLURM_JOB_ID": "4294967296"}, (), id="too-big"),
            pytest.param({"SLURM_JOB_ID": " 7"}, (), id="blank"),
            pytest.param({"SLURM_JOB_ID": "\u0667"}, (), id="non-ascii-digit"),
            pytest.param({"SLURM_JOB_ID_HET_GROUP_x": "8"}, (), id="bad-group-name"),
        ],
    )
    def test_candidates(self, env: dict[str, str], ids: tuple[int, ...]) -> None:
        """Job ids come from SLURM_JOB_ID, then the het group variables; malformed values are skipped."""
        assert jobchannel.candidate_job_ids(env) == ids

    @pytest.mark.parametrize(
        ("uid", "uid_map", "host"),
        [
            pytest.param(5, None, 5, id="no-map"),
            pytest.param(5, ((0, 0, 4294967295),), 5, id="identity"),
            pytest.param(0, ((0, 1501, 1),), 1501, id="remap-root"),
            pytest.param(1501, ((1501, 1501, 1),), 1501, id="map-current-user"),
            pytest.param(65534, ((1501, 1501, 1),), None, id="unmapped"),
            pytest.param(12, ((0, 100, 10), (10, 500, 5)), 502, id="second-range"),
        ],
    )
    def test_host_uid(self, uid: int, uid_map: jobchannel.UidMap, host: int | None) -> None:
        """A uid seen inside a user namespace maps to its host uid through uid_map; unmapped is None."""
        assert jobchannel.to_host_uid(uid, uid_map) == host

    def test_uid_map_file_is_parsed(self, tmp_path: Path) -> None:
        """uid_map lines are read as (inside, outside, count); junk lines are skipped."""
        f = tmp_path / "uid_map"
        f.write_text("         0       1501          1\njunk\n")
        assert jobchannel.read_uid_map(str(f)) == ((0, 1501, 1),)
        assert jobchannel.read_uid_map(str(tmp_path / "none")) is None


class TestRun:
    def test_run_prints_the_lines_and_exits_0(self, t: Tree) -> None:
        """run() writes the export line to its output and returns 0."""
        t.add_job(77, uid=os.getuid(), minor=3, channel_path="/dev/null")
        out = io.StringIO()
        assert taskprolog.run(t.env(77), out=out) == 0
        assert out.getvalue() == (f"{EXPORT}\n" if os.getuid() == 0 else "")

    def test_a_bug_exits_0_with_nothing_printed(self) -> None:
        """An exception inside the TaskProlog still returns 0 and prints nothing (debug: one print line)."""

        class Broken(dict):  # type: ignore[type-arg]
            def get(self, key: str, default: object = None) -> object:
                if key == taskprolog.DEBUG_VARIABLE:
                    return super().get(key, default)
                raise RuntimeError("boom")

        out = io.StringIO()
        assert taskprolog.run(Broken(), out=out) == 0
        assert out.getvalue() == ""
        out = io.StringIO()
        assert taskprolog.run(Broken({taskprolog.DEBUG_VARIABLE: "1"}), out=out) == 0
        assert out.getvalue() == "print imexctl: task-prolog failed unexpectedly\n"

    def test_a_closed_output_exits_0(self, t: Tree) -> None:
        """slurmd closing the pipe does not turn into an exit code."""
        t.add_job(77, uid=os.getuid(), minor=3, channel_path="/dev/null")
        out = io.StringIO()
        out.close()
        assert taskprolog.run(t.env(77), out=out) == 0

    def test_cli_subcommand_prints_the_same(self, t: Tree, capsys: pytest.CaptureFixture[str]) -> None:
        """``imexctl --config FILE task-prolog`` prints what the module prints, and nothing on stderr."""
        t.add_job(77, uid=os.getuid(), minor=3, channel_path="/dev/null")
        env = t.env(77)
        del env["IMEXCTL_CONFIG"]
        assert cli.main(["--config", str(t.config), "task-prolog"], env=env) == 0
        out, err = capsys.readouterr()
        assert (out, err) == ((f"{EXPORT}\n" if os.getuid() == 0 else ""), "")


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=False, cwd="/"
    )


def test_module_imports_nothing_heavy(t: Tree) -> None:
    """A whole TaskProlog run imports no logging, settings, subprocess or third-party module."""
    t.add_job(77, uid=os.getuid(), minor=3, channel_path="/dev/null")
    code = (
        f"import sys; sys.path.insert(0, {str(REPO)!r}); before = set(sys.modules)\n"
        f"from imexctl.channels import taskprolog; taskprolog.lines({t.env(77)!r})\n"
        "print(' '.join(sorted(set(sys.modules) - before)))"
    )
    done = _python(code, {"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    new = set(done.stdout.split())
    heavy = {"structlog", "psutil", "pynvml", "tenacity", "logging", "subprocess", "dataclasses", "typing", "pathlib"}
    heavy |= {
        "imexctl.config.settings",
        "imexctl.cli",
        "imexctl.platform.log",
        "imexctl.platform.logsetup",
        "imexctl.platform.errors",
        "imexctl.platform.fsutil",
        "tempfile",
    }
    assert not new & heavy, sorted(new & heavy)
    assert {"imexctl.channels.taskprolog", "imexctl.channels.job"} <= new


def _lab_user_uid() -> int | None:
    try:
        return pwd.getpwnam(LAB_USER).pw_uid
    except KeyError:
        return None


needs_root_and_lab_user = pytest.mark.skipif(
    not ROOT or _lab_user_uid() is None,
    reason=f"needs root: a channel node owned by the unprivileged user {LAB_USER} (mknod, chown) "
    f"and switching to that user (runuser); {LAB_USER} is made by '.ci/setup test'",
)


def _as_lab_user(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    argv = ["/usr/sbin/runuser", "-u", LAB_USER, "--", sys.executable, "-m", "imexctl.channels.taskprolog"]
    full = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1", **env}
    return subprocess.run(argv, env=full, capture_output=True, text=True, timeout=60, check=False, cwd="/")


@needs_root_and_lab_user
class TestAsTheJobUser:
    def test_job_user_sees_the_minor_of_its_root_made_channel(self, t: Tree) -> None:
        """Run as the job's real (unprivileged) uid against root's files, the task gets its channel number."""
        uid = _lab_user_uid()
        assert uid is not None
        t.add_job(77, uid=uid, minor=77)
        t.mknod(77, uid=uid)
        done = _as_lab_user(t.env(77))
        assert (done.returncode, done.stdout, done.stderr) == (0, "export NVIDIA_IMEX_CHANNELS=77\n", "")

    def test_job_without_a_domain_sees_nothing(self, t: Tree) -> None:
        """A job of the same user without a domain here gets no line, exit 0, empty stderr."""
        uid = _lab_user_uid()
        assert uid is not None
        t.add_job(77, uid=uid, minor=77)
        t.mknod(77, uid=uid)
        done = _as_lab_user(t.env(78))
        assert (done.returncode, done.stdout, done.stderr) == (0, "", "")

    def test_files_made_under_slurmds_strict_umask_still_give_the_channel(self) -> None:
        """The prolog's directories made under umask 027 (slurmd's at some sites): the task still gets its channel.

        Issue 33: they came out 0750 and the TaskProlog exported nothing.
        """
        uid = _lab_user_uid()
        assert uid is not None
        old = os.umask(0o027)
        try:
            with tree() as made:
                made.add_job(77, uid=uid, minor=77)
                made.mknod(77, uid=uid)
                os.umask(old)
                done = _as_lab_user(made.env(77))
        finally:
            os.umask(old)
        assert (done.returncode, done.stdout, done.stderr) == (0, "export NVIDIA_IMEX_CHANNELS=77\n", "")

    def test_a_run_directory_the_job_user_cannot_read_is_said_in_the_first_task(self, t: Tree) -> None:
        """Run directory 0750: the first task prints why it got no channel (a fault of the tray); the others nothing."""
        uid = _lab_user_uid()
        assert uid is not None
        t.add_job(77, uid=uid, minor=77)
        t.mknod(77, uid=uid)
        t.paths.run_dir.chmod(0o750)
        first = _as_lab_user(t.env(77, SLURM_PROCID="0"))
        assert first.returncode == 0 and first.stderr == ""
        assert first.stdout.startswith("print imexctl: cannot tell this job's IMEX channel on this node: ")
        assert "Permission denied" in first.stdout and first.stdout.count("\n") == 1
        other = _as_lab_user(t.env(77, SLURM_PROCID="1"))
        assert (other.returncode, other.stdout, other.stderr) == (0, "", "")

    def test_another_users_channel_is_not_exported(self, t: Tree) -> None:
        """The job id of another user's job (channel owned by root here) exports nothing."""
        t.add_job(77, uid=0, minor=77)
        t.mknod(77, uid=0)
        done = _as_lab_user(t.env(77, IMEXCTL_TASK_PROLOG_DEBUG="1"))
        assert done.returncode == 0 and done.stderr == ""
        assert done.stdout.startswith("print imexctl: no IMEX channel exported: job 77 belongs to uid 0")


class TestHookScript:
    """hooks/task-prolog: a wrapper that cannot fail the task, run against a recording stub interpreter."""

    STUB = (
        "#!/bin/sh\n"
        'printf "%s\\n" "$@" > {record}\n'
        'echo "export EVIL=1 (from stderr)" >&2\n'
        "echo export NVIDIA_IMEX_CHANNELS=9\n"
        "exit {code}\n"
    )

    def _install(self, tmp_path: Path, code: int, *, with_python: bool = True) -> tuple[Path, Path]:
        record, stub = tmp_path / "argv", tmp_path / "python"
        if with_python:
            stub.write_text(self.STUB.format(record=record, code=code))
            stub.chmod(0o755)
        text = (REPO / "hooks" / "task-prolog").read_text()
        assert text.count("/opt/imexctl/bin/python") == 2
        hook = tmp_path / "task-prolog"
        hook.write_text(text.replace("/opt/imexctl/bin/python", str(stub)))
        hook.chmod(0o755)
        return hook, record

    def _run(self, hook: Path, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(hook)], env=env, capture_output=True, text=True, timeout=30, check=False)

    def test_runs_the_module_isolated_and_passes_stdout_only(self, tmp_path: Path) -> None:
        """The hook runs ``python -I -m imexctl.channels.taskprolog``; stdout passes, stderr never reaches slurmd."""
        hook, record = self._install(tmp_path, 0)
        done = self._run(hook)
        assert (done.returncode, done.stdout, done.stderr) == (0, "export NVIDIA_IMEX_CHANNELS=9\n", "")
        assert record.read_text().split() == ["-I", "-m", "imexctl.channels.taskprolog"]

    def test_a_failing_interpreter_still_exits_0(self, tmp_path: Path) -> None:
        """Whatever the interpreter exits with, the TaskProlog exits 0 (a non-zero exit cancels the task)."""
        hook, _ = self._install(tmp_path, 1)
        assert self._run(hook).returncode == 0

    @pytest.mark.parametrize("with_python", [True, False], ids=["imexctl", "no-imexctl"])
    def test_the_enroot_hooks_warning_is_printed_once_per_tray(self, tmp_path: Path, with_python: bool) -> None:
        """IMEXCTL_ENROOT_HOOK_WARNING (from the container's environment) becomes one print line, for local task 0."""
        hook, _ = self._install(tmp_path, 0, with_python=with_python)
        warning = r"job 77: channel /dev/x\n is missing; the container starts"
        export = "export NVIDIA_IMEX_CHANNELS=9\n" if with_python else ""
        for localid in ("0", None):
            env = {"IMEXCTL_ENROOT_HOOK_WARNING": warning, **({"SLURM_LOCALID": localid} if localid else {})}
            done = self._run(hook, **env)
            assert (done.returncode, done.stderr) == (0, "")
            assert done.stdout == f"print imexctl: enroot hook: {warning}\n{export}"
        done = self._run(hook, IMEXCTL_ENROOT_HOOK_WARNING=warning, SLURM_LOCALID="1")
        assert (done.returncode, done.stdout) == (0, export)

    def test_a_warning_of_more_than_one_line_is_not_printed(self, tmp_path: Path) -> None:
        """A value with a newline could forge export lines: it is dropped, the task still starts."""
        hook, _ = self._install(tmp_path, 0, with_python=False)
        done = self._run(hook, IMEXCTL_ENROOT_HOOK_WARNING="x\nexport LD_PRELOAD=/tmp/evil.so")
        assert (done.returncode, done.stdout, done.stderr) == (0, "", "")

    def test_without_imexctl_installed_it_prints_nothing(self, tmp_path: Path) -> None:
        """Where imexctl is absent (inside a Pyxis container) the hook prints nothing and exits 0."""
        hook, record = self._install(tmp_path, 0, with_python=False)
        done = self._run(hook)
        assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
        assert not record.exists()


def test_state_json_keys_read_here_are_written_by_the_prolog() -> None:
    """The keys this module reads from state.json are fields of nodestate.JobState."""
    from imexctl.hooks.state import JobState

    fields = set(JobState._fields)
    assert {"uid", "channel_minor", "channel_path"} <= fields
