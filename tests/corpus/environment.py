"""Corpus family 2: the job environment slurmd gives the hooks, one case per id.

Each case changes the environment of ``job_env()`` (job 42 of user alice,
uid 1000 and gid 100, on gb01 of ``gb[01-02]``, partition ``gpu``): a value of
``None`` removes the variable.  A case either fails with ``code`` naming
``names``, or succeeds (``code`` empty): then ``skipped`` is the skip reason
expected, or '' when the job gets its domain, with the channel owned by
``owner``.  ``config`` overrides sections of the tray's config; ``{root}`` in
a value is the tray's root.  Values listed in ``inert`` must reach no file and
no command line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

_DIGITS_5000 = "1" * 5000


@dataclasses.dataclass(frozen=True)
class EnvCase:
    """One hostile or broken job environment and what imexctl must do with it."""

    id: str
    changes: Mapping[str, str | None]
    code: str = ""
    exit_code: int = 0
    names: tuple[str, ...] = ()
    hook: str = "prolog"
    config: Mapping[str, Mapping[str, str]] = dataclasses.field(default_factory=dict)
    skipped: str = ""
    owner: tuple[int, int] = (1000, 100)
    inert: tuple[str, ...] = ()


def _bad(id_: str, var: str, value: str | None, *names: str, hook: str = "prolog") -> EnvCase:
    """A case that must exit 65 (job_env_invalid) naming ``names`` (default: the variable)."""
    return EnvCase(id_, {var: value}, "job_env_invalid", 65, names or (var,), hook=hook)


_BAD_IDS = [
    ("empty", "", "SLURM_JOB_ID is not set"),
    ("blank", "   ", "SLURM_JOB_ID is not set"),
    ("zero", "0", "SLURM_JOB_ID='0'"),
    ("negative", "-42", "SLURM_JOB_ID='-42'"),
    ("unicode-minus", "\u221242", "SLURM_JOB_ID='\u221242'"),
    ("plus", "+42", "SLURM_JOB_ID='+42'"),
    ("letters", "abc", "SLURM_JOB_ID='abc'"),
    ("hex", "0x2a", "SLURM_JOB_ID='0x2a'"),
    ("float", "42.0", "SLURM_JOB_ID='42.0'"),
    ("exponent", "4e1", "SLURM_JOB_ID='4e1'"),
    ("two-numbers", "42 43", "SLURM_JOB_ID='42 43'"),
    ("two-lines", "42\n43", "SLURM_JOB_ID='42\\n43'"),
    ("shell-semicolon", "42;reboot", "SLURM_JOB_ID='42;reboot'"),
    ("shell-subst", "$(id -u)", "SLURM_JOB_ID='$(id -u)'"),
    ("shell-backtick", "`id`", "SLURM_JOB_ID='`id`'"),
    ("path-dotdot", "../42", "SLURM_JOB_ID='../42'"),
    ("path-inside", "42/../43", "SLURM_JOB_ID='42/../43'"),
    ("nul", "4\x002", "SLURM_JOB_ID='4\\x002'"),
    ("fullwidth-digits", "\uff14\uff12", "SLURM_JOB_ID='\uff14\uff12'"),
    ("arabic-indic-digits", "\u0664\u0662", "SLURM_JOB_ID='\u0664\u0662'"),
    ("above-uint32", str(2**32), f"SLURM_JOB_ID='{2**32}'"),
    ("twenty-digits", "9" * 20, "SLURM_JOB_ID='" + "9" * 20 + "'"),
    ("5000-digits", _DIGITS_5000, "(5000 chars)"),
]

JOB_IDS = [_bad(f"job-id-{name}", "SLURM_JOB_ID", value, shown) for name, value, shown in _BAD_IDS] + [
    EnvCase("job-id-missing", {"SLURM_JOB_ID": None}, "job_env_invalid", 65, ("SLURM_JOB_ID is not set",)),
    EnvCase("job-id-legacy-variable", {"SLURM_JOB_ID": None, "SLURM_JOBID": "42"}),
    EnvCase("job-id-legacy-variable-bad", {"SLURM_JOB_ID": None, "SLURM_JOBID": "x"}, "job_env_invalid", 65,
            ("SLURM_JOBID='x'",)),
    EnvCase("job-id-leading-zeros", {"SLURM_JOB_ID": "00042"}),
    EnvCase("job-id-uint32-max", {"SLURM_JOB_ID": str(2**32 - 1)}),
]  # fmt: skip

EPILOG_JOB_IDS = [
    _bad(f"epilog-job-id-{name}", "SLURM_JOB_ID", value, shown, hook="epilog")
    for name, value, shown in _BAD_IDS
    if name in ("empty", "negative", "letters", "shell-subst", "path-dotdot", "above-uint32", "5000-digits")
] + [EnvCase("epilog-job-id-missing", {"SLURM_JOB_ID": None}, "job_env_invalid", 65, ("SLURM_JOB_ID is not set",),
             hook="epilog")]  # fmt: skip

_BAD_OWNER_IDS = [
    ("negative", "-1"),
    ("letters", "alice"),
    ("float", "1000.0"),
    ("blank-inside", "10 00"),
    ("arabic-indic-digits", "\u0661\u0660\u0660\u0660"),
    ("uint32-max-is-no-change", str(2**32 - 1)),
    ("above-uint32", str(2**32)),
    ("twenty-digits", "9" * 20),
    ("5000-digits", _DIGITS_5000),
]

OWNERS = [
    *(_bad(f"uid-{name}", "SLURM_JOB_UID", value) for name, value in _BAD_OWNER_IDS),
    *(_bad(f"gid-{name}", "SLURM_JOB_GID", value) for name, value in _BAD_OWNER_IDS),
    EnvCase("uid-missing", {"SLURM_JOB_UID": None}, "job_env_invalid", 65, ("SLURM_JOB_UID is not set",)),
    EnvCase("uid-empty", {"SLURM_JOB_UID": ""}, "job_env_invalid", 65, ("SLURM_JOB_UID is not set",)),
    EnvCase("uid-legacy-variable", {"SLURM_JOB_UID": None, "SLURM_UID": "1500"}, owner=(1500, 100)),
    EnvCase("uid-legacy-variable-bad", {"SLURM_JOB_UID": None, "SLURM_UID": "-3"}, "job_env_invalid", 65,
            ("SLURM_UID='-3'",)),
    EnvCase("uid-root", {"SLURM_JOB_UID": "0", "SLURM_JOB_GID": "0"}, owner=(0, 0)),
    EnvCase("uid-largest", {"SLURM_JOB_UID": str(2**32 - 2)}, owner=(2**32 - 2, 100)),
    EnvCase("gid-missing", {"SLURM_JOB_GID": None}, owner=(1000, 0)),
    EnvCase("gid-empty", {"SLURM_JOB_GID": ""}, owner=(1000, 0)),
    EnvCase("epilog-uid-missing", {"SLURM_JOB_UID": None}, hook="epilog"),
    EnvCase("epilog-uid-letters", {"SLURM_JOB_UID": "alice"}, "job_env_invalid", 65, ("SLURM_JOB_UID='alice'",),
            hook="epilog"),
    # the numeric uid decides the channel's owner, whatever the name says
    EnvCase("user-says-root-uid-1000", {"SLURM_JOB_USER": "root"}, owner=(1000, 100)),
    EnvCase("user-says-bob-uid-1000", {"SLURM_JOB_USER": "bob"}, owner=(1000, 100)),
    EnvCase("user-says-alice-uid-0", {"SLURM_JOB_UID": "0"}, owner=(0, 100)),
    EnvCase("user-missing", {"SLURM_JOB_USER": None}),
    EnvCase("user-path", {"SLURM_JOB_USER": "../../root"}, inert=("../../root",)),
    EnvCase("user-shell", {"SLURM_JOB_USER": "alice;reboot"}, inert=("alice;reboot",)),
    EnvCase("user-escape-sequence", {"SLURM_JOB_USER": "\x1b]0;pwned\x07"}, "job_env_invalid", 65,
            ("SLURM_JOB_USER", "non-printing")),
    EnvCase("user-newline", {"SLURM_JOB_USER": "alice\nroot"}, "job_env_invalid", 65,
            ("SLURM_JOB_USER='alice\\nroot'",)),
    EnvCase("epilog-user-escape-sequence", {"SLURM_JOB_USER": "\x1b[2J"}, hook="epilog"),
]  # fmt: skip

_PARTITIONS = {"policy": {"jobs": "partitions", "partitions": "gpu"}}
_FEATURE = {"policy": {"jobs": "feature", "feature": "imex"}}


def _skip_partition(id_: str, value: str | None) -> EnvCase:
    return EnvCase(id_, {"SLURM_JOB_PARTITION": value}, config=_PARTITIONS, skipped="is not in [policy] partitions")


def _skip_feature(id_: str, value: str | None) -> EnvCase:
    return EnvCase(id_, {"SLURM_JOB_CONSTRAINTS": value}, config=_FEATURE, skipped="did not request feature 'imex'")


POLICY = [
    EnvCase("partition-gpu-runs", {}, config=_PARTITIONS),
    _skip_partition("partition-shell-semicolon", "gpu;reboot"),
    _skip_partition("partition-shell-subst", "$(reboot)"),
    _skip_partition("partition-path-dotdot", "../../etc"),
    _skip_partition("partition-path-inside", "gpu/../gpu"),
    _skip_partition("partition-two-names", "gpu,debug"),
    _skip_partition("partition-newline", "gpu\nreboot"),
    _skip_partition("partition-empty", ""),
    _skip_partition("partition-missing", None),
    _skip_partition("partition-nul", "gpu\x00"),
    EnvCase("partition-shell-ignored-when-jobs-all", {"SLURM_JOB_PARTITION": "gpu;reboot"}, inert=("reboot",)),
    EnvCase("partition-path-ignored-when-jobs-all", {"SLURM_JOB_PARTITION": "../../etc/passwd"},
            inert=("etc/passwd",)),
    EnvCase("constraint-imex-runs", {"SLURM_JOB_CONSTRAINTS": "imex"}, config=_FEATURE),
    EnvCase("constraint-or", {"SLURM_JOB_CONSTRAINTS": "gpu|imex"}, config=_FEATURE),
    EnvCase("constraint-count", {"SLURM_JOB_CONSTRAINTS": "imex*2"}, config=_FEATURE),
    EnvCase("constraint-brackets", {"SLURM_JOB_CONSTRAINTS": "[imex|gpu]"}, config=_FEATURE),
    EnvCase("constraint-shell-subst-is-not-run", {"SLURM_JOB_CONSTRAINTS": "imex&$(reboot)"}, config=_FEATURE,
            inert=("reboot",)),
    EnvCase("constraint-newline-is-a-blank", {"SLURM_JOB_CONSTRAINTS": "imex\nreboot"}, config=_FEATURE,
            inert=("reboot",)),
    _skip_feature("constraint-path", "/etc/imex"),
    _skip_feature("constraint-backticks", "`imex`"),
    _skip_feature("constraint-semicolon", "imex;reboot"),
    _skip_feature("constraint-other-feature", "gpu"),
    _skip_feature("constraint-empty", ""),
    _skip_feature("constraint-missing", None),
    _skip_feature("constraint-case", "IMEX"),
]  # fmt: skip


def _shared(id_: str, value: str, var: str = "SLURM_JOB_OVERSUBSCRIBE", **more: str) -> EnvCase:
    """A job that may share its trays: skipped by default (exit 0, no drain), the variable named."""
    return EnvCase(id_, {var: value, **more}, skipped=f"{var}=")


def _refused(id_: str, value: str) -> EnvCase:
    """The same job with ``[policy] shared = refuse``: the prolog fails and Slurm drains the tray."""
    names = ("SLURM_JOB_OVERSUBSCRIBE=", "--exclusive", "shared = refuse")
    return EnvCase(
        id_, {"SLURM_JOB_OVERSUBSCRIBE": value}, "domain_busy", 69, names, config={"policy": {"shared": "refuse"}}
    )


SHARING = [
    _shared("oversubscribe-yes", "YES"),
    _shared("oversubscribe-ok", "OK"),
    _shared("oversubscribe-force", "FORCE"),
    _shared("oversubscribe-user", "USER"),
    _shared("oversubscribe-mcs", "MCS"),
    _shared("oversubscribe-garbage", "yes;reboot"),
    _shared("oversubscribe-no-with-junk", "NO NO"),
    _shared("exclusive-no", "NO", "SLURM_JOB_EXCLUSIVE", SLURM_JOB_OVERSUBSCRIBE="NO"),
    _shared("exclusive-user", "USER", "SLURM_JOB_EXCLUSIVE", SLURM_JOB_OVERSUBSCRIBE="NO"),
    _shared("exclusive-mcs", "MCS", "SLURM_JOB_EXCLUSIVE", SLURM_JOB_OVERSUBSCRIBE="NO"),
    _shared("exclusive-garbage", "NODE;reboot", "SLURM_JOB_EXCLUSIVE"),
    _shared("exclusive-node-oversubscribe-yes", "YES", SLURM_JOB_EXCLUSIVE="NODE"),
    _refused("oversubscribe-yes-refused", "YES"),
    _refused("oversubscribe-ok-refused", "OK"),
    EnvCase("oversubscribe-no", {"SLURM_JOB_OVERSUBSCRIBE": "NO"}),
    EnvCase("oversubscribe-no-lower-case", {"SLURM_JOB_OVERSUBSCRIBE": "no"}),
    EnvCase("oversubscribe-topo-blanks", {"SLURM_JOB_OVERSUBSCRIBE": " TOPO "}),
    EnvCase("exclusive-node", {"SLURM_JOB_EXCLUSIVE": "NODE", "SLURM_JOB_OVERSUBSCRIBE": "NO"}),
    EnvCase("exclusive-topo-lower-case", {"SLURM_JOB_EXCLUSIVE": " topo ", "SLURM_JOB_OVERSUBSCRIBE": "NO"}),
]  # fmt: skip

NODE_NAMES = [
    EnvCase("node-name-missing", {"SLURMD_NODENAME": None}, "job_env_invalid", 65, ("SLURMD_NODENAME is not set",)),
    EnvCase("node-name-empty", {"SLURMD_NODENAME": ""}, "job_env_invalid", 65, ("SLURMD_NODENAME is not set",)),
    EnvCase("node-name-not-in-list", {"SLURMD_NODENAME": "gb07"}, "job_env_invalid", 65, ("'gb07'", "is not in")),
    EnvCase("node-name-case", {"SLURMD_NODENAME": "GB01"}, "job_env_invalid", 65, ("'GB01'", "is not in")),
    EnvCase("node-name-short-padding", {"SLURMD_NODENAME": "gb1"}, "job_env_invalid", 65, ("'gb1'", "is not in")),
    _bad("node-name-dotdot", "SLURMD_NODENAME", "..", "SLURMD_NODENAME='..' is not a node name"),
    _bad("node-name-path", "SLURMD_NODENAME", "../gb01", "SLURMD_NODENAME='../gb01'"),
    _bad("node-name-slash", "SLURMD_NODENAME", "gb01/x", "SLURMD_NODENAME='gb01/x'"),
    _bad("node-name-blank-inside", "SLURMD_NODENAME", "gb 01", "SLURMD_NODENAME='gb 01'"),
    _bad("node-name-nul", "SLURMD_NODENAME", "gb01\x00", "SLURMD_NODENAME='gb01\\x00'"),
    _bad("node-name-escape", "SLURMD_NODENAME", "\x1b[2J", "SLURMD_NODENAME='\\x1b[2J'"),
    _bad("node-name-hostlist", "SLURMD_NODENAME", "gb[01-02]", "SLURMD_NODENAME='gb[01-02]'"),
    _bad("epilog-node-name-path", "SLURMD_NODENAME", "../../etc", "SLURMD_NODENAME='../../etc'", hook="epilog"),
    EnvCase("epilog-node-name-missing", {"SLURMD_NODENAME": None}, "job_env_invalid", 65,
            ("SLURMD_NODENAME is not set",), hook="epilog"),
    EnvCase("node-name-path-with-root-percent-n", {"SLURMD_NODENAME": "../../../tmp/evil"}, "job_env_invalid", 65,
            ("SLURMD_NODENAME='../../../tmp/evil'",), config={"paths": {"root": "{root}/trays/%n"}}),
    EnvCase("epilog-node-name-path-with-root-percent-n", {"SLURMD_NODENAME": "../x"}, "job_env_invalid", 65,
            ("SLURMD_NODENAME='../x'",), hook="epilog", config={"paths": {"root": "{root}/trays/%n"}}),
    EnvCase("epilog-without-node-list", {"SLURM_JOB_NODELIST": None, "SLURM_NODELIST": None}, hook="epilog"),
    EnvCase("epilog-with-broken-node-list", {"SLURM_JOB_NODELIST": "gb[01-", "SLURM_NODELIST": "]"}, hook="epilog"),
]  # fmt: skip

CASES = [*JOB_IDS, *EPILOG_JOB_IDS, *OWNERS, *POLICY, *SHARING, *NODE_NAMES]
