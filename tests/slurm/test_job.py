"""slurm: the job as slurmd's Prolog/Epilog environment describes it (design.md source slurm-env)."""

from __future__ import annotations

import os
import re

import pytest

from imexctl.platform.errors import EnvironmentError_, ExitCode, NodeListError
from imexctl.slurm.job import JobContext, constraint_features, node_name
from tests.support.fakes import JOB_GID, job_env


def env_without(*names: str, **extra: str) -> dict[str, str]:
    env = job_env(**extra)  # type: ignore[arg-type]
    for name in names:
        env.pop(name, None)
    return env


class TestNodeList:
    def test_job_nodelist_is_expanded_in_order(self) -> None:
        """SLURM_JOB_NODELIST is expanded in Slurm's order and the node's fields are read."""
        ctx = JobContext.from_env(job_env(job_id=42, nodelist="gb[03,01-02]", node="gb01", uid=1234), need_nodes=True)
        assert ctx.nodes == ("gb03", "gb01", "gb02")
        assert (ctx.job_id, ctx.node, ctx.uid, ctx.gid, ctx.user, ctx.partition) == (
            42,
            "gb01",
            1234,
            JOB_GID,
            "alice",
            "gpu",
        )

    def test_job_nodelist_is_preferred(self) -> None:
        """When both variables are set, SLURM_JOB_NODELIST wins."""
        env = job_env(nodelist="gb[01-02]", SLURM_NODELIST="gb[01-04]")
        assert JobContext.from_env(env, need_nodes=True).nodes == ("gb01", "gb02")

    def test_nodelist_fallback_for_slurm_22_05(self) -> None:
        """Without SLURM_JOB_NODELIST (Slurm 22.05), SLURM_NODELIST is used."""
        env = env_without("SLURM_JOB_NODELIST", SLURM_NODELIST="gb[01-03]")
        assert JobContext.from_env(env, need_nodes=True).nodes == ("gb01", "gb02", "gb03")

    def test_blank_job_nodelist_falls_back(self) -> None:
        """A blank SLURM_JOB_NODELIST counts as missing."""
        env = job_env(SLURM_JOB_NODELIST="  ", SLURM_NODELIST="gb01")
        assert JobContext.from_env(env, need_nodes=True).nodes == ("gb01",)

    @pytest.mark.parametrize(
        "env",
        [
            pytest.param(env_without("SLURM_JOB_NODELIST", "SLURM_NODELIST"), id="missing"),
            pytest.param(job_env(SLURM_JOB_NODELIST="", SLURM_NODELIST=""), id="empty"),
        ],
    )
    def test_no_node_list_is_an_error(self, env: dict[str, str]) -> None:
        """Without any node list the prolog fails naming both variables."""
        with pytest.raises(EnvironmentError_, match="neither SLURM_JOB_NODELIST nor SLURM_NODELIST is set"):
            JobContext.from_env(env, need_nodes=True)

    def test_separators_only_names_no_node(self) -> None:
        """A node list of separators only names no node and is refused."""
        with pytest.raises(EnvironmentError_, match=r"SLURM_JOB_NODELIST=', ,' names no node"):
            JobContext.from_env(job_env(nodelist=", ,"), need_nodes=True)

    @pytest.mark.parametrize(
        ("nodelist", "part"),
        [
            pytest.param("gb[01-", "gb[01-", id="unclosed"),
            pytest.param("gb01,gb[]", "[]", id="empty-brackets"),
            pytest.param("gb[03-01]", "03-01", id="reversed-range"),
        ],
    )
    def test_malformed_node_list_keeps_the_faulty_part(self, nodelist: str, part: str) -> None:
        """A malformed node list raises NodeListError (exit 65) that names the faulty part."""
        with pytest.raises(NodeListError) as info:
            JobContext.from_env(job_env(nodelist=nodelist, node="gb01"), need_nodes=True)
        assert info.value.part == part and info.value.nodelist == nodelist
        assert info.value.exit_code == ExitCode.DATAERR

    def test_duplicates_are_refused(self) -> None:
        """A node named twice would give IMEX two node ids for one tray and is refused."""
        with pytest.raises(EnvironmentError_, match="names gb01, gb02 more than once"):
            JobContext.from_env(job_env(nodelist="gb[01-02],gb02,gb01"), need_nodes=True)

    def test_own_node_must_be_in_the_list(self) -> None:
        """A node list without SLURMD_NODENAME is refused, naming the node and the variable."""
        message = r"this node 'gb09' \(SLURMD_NODENAME\) is not in SLURM_JOB_NODELIST"
        with pytest.raises(EnvironmentError_, match=message):
            JobContext.from_env(job_env(nodelist="gb[01-02]", node="gb09"), need_nodes=True)

    def test_epilog_does_not_read_the_node_list(self) -> None:
        """The epilog needs neither node list nor uid, so a broken list does not block teardown."""
        env = env_without("SLURM_JOB_UID", nodelist="gb[01-")
        ctx = JobContext.from_env(env, need_nodes=False)
        assert ctx.nodes == () and ctx.uid is None and ctx.job_id == 42


class TestIds:
    @pytest.mark.parametrize(
        ("value", "shown"),
        [
            pytest.param("4x2", "'4x2'", id="letters"),
            pytest.param("0", "'0'", id="zero"),
            pytest.param("-5", "'-5'", id="negative"),
            pytest.param("+5", "'+5'", id="plus"),
            pytest.param("４２", "'４２'", id="fullwidth-digits"),
            pytest.param("٤٢", "'٤٢'", id="arabic-indic-digits"),
            pytest.param("4.0", "'4.0'", id="float"),
        ],
    )
    def test_bad_job_id_is_named(self, value: str, shown: str) -> None:
        """A job id that is not a positive ASCII number is refused with variable and value."""
        with pytest.raises(EnvironmentError_, match=re.escape(f"SLURM_JOB_ID={shown} is not a valid number")):
            JobContext.from_env(job_env(SLURM_JOB_ID=value), need_nodes=True)

    def test_missing_job_id_is_an_error(self) -> None:
        """Without SLURM_JOB_ID and SLURM_JOBID the hook refuses to run."""
        with pytest.raises(EnvironmentError_, match="SLURM_JOB_ID is not set"):
            JobContext.from_env(env_without("SLURM_JOB_ID"), need_nodes=False)

    def test_legacy_jobid_variable_is_accepted(self) -> None:
        """SLURM_JOBID is used when SLURM_JOB_ID is absent."""
        assert JobContext.from_env(env_without("SLURM_JOB_ID", SLURM_JOBID="77"), need_nodes=False).job_id == 77

    def test_bad_legacy_jobid_names_the_legacy_variable(self) -> None:
        """A bad SLURM_JOBID fallback is reported under its own name."""
        with pytest.raises(EnvironmentError_, match="SLURM_JOBID='x' is not"):
            JobContext.from_env(env_without("SLURM_JOB_ID", SLURM_JOBID="x"), need_nodes=False)

    def test_surrounding_blanks_are_ignored(self) -> None:
        """Blanks around a number are stripped."""
        assert JobContext.from_env(job_env(SLURM_JOB_ID=" 42 "), need_nodes=False).job_id == 42

    def test_missing_uid_fails_the_prolog(self) -> None:
        """The prolog needs the job owner for the channel and refuses to run without it."""
        with pytest.raises(EnvironmentError_, match="SLURM_JOB_UID is not set"):
            JobContext.from_env(env_without("SLURM_JOB_UID"), need_nodes=True)

    def test_legacy_uid_variable_is_accepted(self) -> None:
        """SLURM_UID is used when SLURM_JOB_UID is absent."""
        assert JobContext.from_env(env_without("SLURM_JOB_UID", SLURM_UID="1500"), need_nodes=True).uid == 1500

    def test_root_uid_is_allowed(self) -> None:
        """uid 0 is a valid job owner."""
        assert JobContext.from_env(job_env(uid=0), need_nodes=True).uid == 0

    @pytest.mark.parametrize("name", ["SLURM_JOB_UID", "SLURM_JOB_GID"])
    def test_bad_uid_or_gid_is_named(self, name: str) -> None:
        """A uid or gid that is not a number is refused naming the variable."""
        with pytest.raises(EnvironmentError_, match=f"{name}='alice' is not a valid number"):
            JobContext.from_env(job_env(**{name: "alice"}), need_nodes=True)

    def test_missing_gid_is_none(self) -> None:
        """SLURM_JOB_GID is optional."""
        assert JobContext.from_env(env_without("SLURM_JOB_GID"), need_nodes=True).gid is None

    def test_which_run_of_the_job_this_is(self) -> None:
        """SLURM_JOB_RESTART_COUNT (22.05+) and SLURM_JOB_START_TIME (23.02+), from the credential, are read."""
        env = job_env(SLURM_JOB_RESTART_COUNT="2", SLURM_JOB_START_TIME="1796434004")
        ctx = JobContext.from_env(env, need_nodes=True)
        assert (ctx.restarts, ctx.start_time) == (2, 1796434004)
        ctx = JobContext.from_env(job_env(), need_nodes=True)
        assert (ctx.restarts, ctx.start_time) == (None, None)

    @pytest.mark.parametrize("value", ["", "-1", "two", "1.5", "9" * 21])
    def test_a_run_number_that_is_no_number_is_unknown_not_an_error(self, value: str) -> None:
        """Only a comparison of runs needs them: a malformed one is unknown, never a failed (draining) hook."""
        env = job_env(SLURM_JOB_RESTART_COUNT=value, SLURM_JOB_START_TIME=value)
        ctx = JobContext.from_env(env, need_nodes=True)
        assert (ctx.restarts, ctx.start_time) == (None, None)

    def test_missing_node_name_is_an_error(self) -> None:
        """Without SLURMD_NODENAME imexctl is not running as slurmd's hook and refuses."""
        with pytest.raises(EnvironmentError_, match="SLURMD_NODENAME is not set"):
            JobContext.from_env(env_without("SLURMD_NODENAME"), need_nodes=False)

    def test_environment_errors_exit_65(self) -> None:
        """A malformed job environment maps to exit code 65 (DATAERR)."""
        assert EnvironmentError_.exit_code == ExitCode.DATAERR == 65


class TestNodeName:
    @pytest.mark.parametrize("name", ["a/b", "a b", "gb[01-02]", "gb01,gb02", ".", "..", "gb\x01"])
    def test_a_name_that_cannot_stand_in_a_path_is_refused(self, name: str) -> None:
        """SLURMD_NODENAME must be usable for %n in [paths] root, with or without the host fallback."""
        for or_host in (False, True):
            with pytest.raises(EnvironmentError_, match="SLURMD_NODENAME=.* is not a node name"):
                node_name({"SLURMD_NODENAME": name}, or_host=or_host)

    def test_slurmd_nodename_wins_over_the_host_name(self) -> None:
        """SLURMD_NODENAME, blanks stripped, is the name with or without the fallback."""
        assert (
            node_name({"SLURMD_NODENAME": " gb07 "}) == node_name({"SLURMD_NODENAME": "gb07"}, or_host=True) == "gb07"
        )

    def test_without_slurmd_nodename(self) -> None:
        """Unset: '' (a hook then refuses), or this host's short name with ``or_host``."""
        assert node_name({}) == node_name({"SLURMD_NODENAME": " "}) == ""
        assert node_name({}, or_host=True) == os.uname().nodename.split(".", 1)[0]


class TestOversubscribe:
    @pytest.mark.parametrize(
        ("value", "shared"),
        [
            pytest.param("NO", False, id="NO"),
            pytest.param("TOPO", False, id="TOPO"),
            pytest.param(" topo ", False, id="lower-blank"),
            pytest.param("OK", True, id="OK"),
            pytest.param("YES", True, id="YES"),
            pytest.param("USER", True, id="USER"),
            pytest.param("MCS", True, id="MCS"),
            pytest.param("FORCE", True, id="FORCE"),
            pytest.param(None, None, id="absent"),
            pytest.param("", None, id="empty"),
        ],
    )
    def test_exclusivity(self, value: str | None, shared: bool | None) -> None:
        """NO and TOPO are exclusive, any other value shared, and absence (Slurm < 23.02) unknown."""
        env = job_env(SLURM_JOB_OVERSUBSCRIBE=value)
        assert JobContext.from_env(env, need_nodes=True).is_shared is shared


# What slurmd puts in the prolog's environment for each kind of job, release by release, and whether the job
# may share its trays. Read from SchedMD/slurm: src/plugins/prep/script/prep_script_slurmd.c _build_env(), and
# in src/common/slurm_protocol_defs.c job_share_string()/get_job_share_value() (23.02-25.11; TOPO from 24.05),
# job_oversubscribe_string()/get_job_oversubscribe_value() and job_exclusive_display_string()/
# get_job_exclusive_display_value() (26.05, commit e3e8abb8), with the changes slurmctld's
# _resolve_shared_status() makes before the credential is built (an OverSubscribe=EXCLUSIVE partition makes
# the job whole-node; FORCE:n with n > 1 makes it shared). 22.05 sets neither variable. Tags read:
# slurm-22-05-8-1, slurm-23-02-8-1, slurm-24-11-5-1, slurm-25-11-7-1, slurm-26-05-3-1. The rows that
# tests/lab/test_exclusive.py submits were also seen under real slurmds (24.11.5, 26.05.5).
# Each row: (job, SLURM_JOB_OVERSUBSCRIBE, SLURM_JOB_EXCLUSIVE, may share its trays); None: not set.
_NOT_SET = None
RELEASES: dict[str, list[tuple[str, str | None, str | None, bool | None]]] = {
    "22.05": [
        ("plain job, partition OverSubscribe=NO", _NOT_SET, _NOT_SET, None),
        ("--exclusive", _NOT_SET, _NOT_SET, None),
        ("--oversubscribe", _NOT_SET, _NOT_SET, None),
    ],
    "23.02-25.11": [
        ("plain job, partition OverSubscribe=NO", "OK", _NOT_SET, True),
        ("plain job, partition OverSubscribe=YES", "OK", _NOT_SET, True),
        ("--exclusive", "NO", _NOT_SET, False),
        ("partition OverSubscribe=EXCLUSIVE", "NO", _NOT_SET, False),
        ("select/linear, plain job", "NO", _NOT_SET, False),
        ("--exclusive=user, or a partition with ExclusiveUser=YES", "USER", _NOT_SET, True),
        ("--exclusive=mcs", "MCS", _NOT_SET, True),
        ("--exclusive=topo (24.05+), or a partition with ExclusiveTopo=YES", "TOPO", _NOT_SET, False),
        ("--oversubscribe", "YES", _NOT_SET, True),
        ("partition OverSubscribe=FORCE:4, any job", "YES", _NOT_SET, True),
    ],
    "26.05": [
        ("plain job, partition OverSubscribe=NO", "NO", "NO", True),
        ("plain job, partition OverSubscribe=YES or FORCE:1", "OK", "NO", True),
        ("--exclusive", "NO", "NODE", False),
        ("partition OverSubscribe=EXCLUSIVE", "NO", "NODE", False),
        ("select/linear, plain job", "NO", "NODE", False),
        ("--exclusive=user", "NO", "USER", True),
        ("--exclusive=user, in a partition OverSubscribe=YES", "OK", "USER", True),
        ("--exclusive=user, --exclusive as well (whole node wins)", "NO", "NODE", False),
        ("--exclusive=mcs", "NO", "MCS", True),
        ("--exclusive=topo, or --exclusive in a partition with ExclusiveTopo=YES", "NO", "TOPO", False),
        ("--oversubscribe", "YES", "NO", True),
        ("partition OverSubscribe=FORCE:4, even with --exclusive", "YES", "NO", True),
        ("partition Exclusive=NODE (replaces OverSubscribe=EXCLUSIVE), any job", "NO", "NODE", False),
        ("partition Exclusive=TOPO", "NO", "TOPO", False),
        ("partition Exclusive=USER", "NO", "USER", True),
        # SLURM_JOB_OVERSUBSCRIBE says other jobs may be let in (YES: the job asked; OK: its partition allows
        # it): read as shared whatever SLURM_JOB_EXCLUSIVE says, so no domain rests on a word that lets others
        # in. Not seen from 26.05.0-26.05.3's slurmctld for a scheduled job: --oversubscribe gives EXCLUSIVE=NO
        # (get_job_exclusive_display_value), and a whole-node job gets share_res=0, so OVERSUBSCRIBE=NO
        # (node_scheduler.c _resolve_shared_status); a job_submit plugin or a later release may differ.
        ("EXCLUSIVE=NODE with OVERSUBSCRIBE=YES", "YES", "NODE", True),
        ("EXCLUSIVE=NODE with OVERSUBSCRIBE=OK", "OK", "NODE", True),
        ("EXCLUSIVE=TOPO with OVERSUBSCRIBE=OK", "OK", "TOPO", True),
    ],
}


class TestExclusivityByRelease:
    @pytest.mark.parametrize(
        ("release", "job", "oversubscribe", "exclusive", "shared"),
        [pytest.param(rel, *row, id=f"{rel}:{row[0]}") for rel, rows in RELEASES.items() for row in rows],
    )
    def test_release_table(
        self, release: str, job: str, oversubscribe: str | None, exclusive: str | None, shared: bool | None
    ) -> None:
        """Each release's encoding of each kind of job is read as that release means it."""
        values = {"SLURM_JOB_OVERSUBSCRIBE": oversubscribe, "SLURM_JOB_EXCLUSIVE": exclusive}
        env = job_env(**values)  # None: not set
        ctx = JobContext.from_env(env, need_nodes=True)
        assert ctx.is_shared is shared, f"Slurm {release}, {job}: {ctx.sharing}"

    def test_sharing_names_what_was_read(self) -> None:
        """The reason given to the user names the variables it was decided from."""
        ctx = JobContext.from_env(job_env(SLURM_JOB_OVERSUBSCRIBE="NO", SLURM_JOB_EXCLUSIVE="user"), need_nodes=True)
        assert ctx.sharing == "SLURM_JOB_EXCLUSIVE=USER SLURM_JOB_OVERSUBSCRIBE=NO"
        assert JobContext.from_env(job_env(SLURM_JOB_OVERSUBSCRIBE=None), need_nodes=True).sharing.startswith("neither")

    def test_qos_and_sluid_are_kept_printable(self) -> None:
        """SLURM_JOB_QOS (26.05) and SLURM_JOB_SLUID (25.11) are read for the log, cut and made printable."""
        ctx = JobContext.from_env(job_env(SLURM_JOB_QOS=" normal\x1b ", SLURM_JOB_SLUID="s" * 100), need_nodes=True)
        assert (ctx.qos, ctx.sluid) == ("normal?", "s" * 64)


class TestConstraintFeatures:
    @pytest.mark.parametrize(
        ("expr", "features"),
        [
            pytest.param("", frozenset(), id="empty"),
            pytest.param("imex", {"imex"}, id="single"),
            pytest.param("imex&gpu", {"imex", "gpu"}, id="and"),
            pytest.param("imex|gpu", {"imex", "gpu"}, id="or"),
            pytest.param("[rackA|rackB]", {"rackA", "rackB"}, id="matching-or"),
            pytest.param("imex*2", {"imex"}, id="count"),
            pytest.param("[rackA*2&rackB*4]", {"rackA", "rackB"}, id="counts-in-brackets"),
            pytest.param("(imex|a)&b,c", {"imex", "a", "b", "c"}, id="parens-and-comma"),
            pytest.param("imexx&gpu", {"imexx", "gpu"}, id="no-substring-match"),
        ],
    )
    def test_parse(self, expr: str, features: frozenset[str]) -> None:
        """Feature names are extracted from a --constraint expression; operators and counts dropped."""
        assert constraint_features(expr) == frozenset(features)

    def test_constraints_are_read_from_the_environment(self) -> None:
        """SLURM_JOB_CONSTRAINTS is carried verbatim on the context."""
        ctx = JobContext.from_env(job_env(SLURM_JOB_CONSTRAINTS="imex&gpu"), need_nodes=True)
        assert constraint_features(ctx.constraints) == {"imex", "gpu"}
