"""What slurmctld says about a job, read from real answers of Slurm 22.05, 24.11 and 26.05 (tests/data/slurm/).

The answers were recorded from the lab (tests/lab/answers.py) for a plain job, a job whose every
user-set field forges slurmctld's fields, a het job and an array. imexctl's reader must give the
facts slurmctld holds (cross-checked with each version's JSON), the same for the hostile job as for
an honest one, and FakeHost's squeue must print what the real one printed.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Callable

import pytest

from imexctl.config.settings import Settings
from imexctl.platform.errors import SlurmQueryError
from imexctl.platform.host import Completed
from imexctl.slurm import slurmctld
from imexctl.slurm.slurmctld import JobRecord
from tests.support.fakes import FakeHost, SlurmJob

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"
VERSIONS = ("22.05", "24.11", "26.05")


def recorded(version: str) -> dict[str, Any]:
    return dict(json.loads((DATA / f"{version}.json").read_text()))


def answer(version: str, what: str, command: str) -> dict[str, Any]:
    """One recorded answer: ``command`` is ``squeue`` (imexctl's question), ``show -o``, ``scontrol --json``
    or ``squeue --json``."""
    for a in recorded(version)["answers"]:
        argv = a["argv"]
        kind = {("squeue", False): "squeue", ("scontrol", False): "show -o", ("scontrol", True): "scontrol --json",
                ("squeue", True): "squeue --json"}[(argv[0], "--json" in argv)]  # fmt: skip
        if a["what"] == what and kind == command:
            return dict(a)
    raise KeyError((version, what, command))


@dataclasses.dataclass
class Replay:
    """A host that answers imexctl's one question with what the real squeue printed, and refuses anything else."""

    version: str
    #: answer with what was printed at this moment (the same question is recorded while running and ended)
    moment: str = "running"
    calls: list[tuple[str, ...]] = dataclasses.field(default_factory=list)

    def run(self, argv: Sequence[str], *, timeout_s: float, env: Mapping[str, str] | None = None) -> Completed:
        self.calls.append(tuple(argv))
        for a in recorded(self.version)["answers"]:
            if a["what"].endswith(("job", self.moment)) and a["argv"][0] == "squeue" and env == a["env"] and \
                    a["argv"][1:] == list(argv[1:]):  # fmt: skip
                return Completed(tuple(argv), a["rc"], a["stdout"], a["stderr"])
        raise AssertionError(f"no recorded answer for {list(argv)} with {env}")


def ask(version: str, job_id: int, settings: Settings, moment: str = "running") -> JobRecord:
    return slurmctld.ask_job(job_id, Replay(version, moment), settings, "")  # type: ignore[arg-type]


#: what OverSubscribe says of a plain job in a partition with OverSubscribe=NO: 26.05 no longer says OK
SHARED_WORD = {"22.05": "OK", "24.11": "OK", "26.05": "NO"}


def json_job(version: str, what: str, job_id: int) -> dict[str, Any]:
    """The job's record in the JSON that version prints: ``scontrol --json`` (24.11+), 22.05's ``squeue --json``."""
    a = answer(version, what, "squeue --json" if version == "22.05" else "scontrol --json")
    return dict(next(j for j in json.loads(a["stdout"])["jobs"] if j["job_id"] == job_id))


def number(value: Any) -> int:
    """A JSON number as 22.05 (plain) and 24.11+ (``{"set", "infinite", "number"}``) print it."""
    return int(value["number"] if isinstance(value, dict) else value)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_hostile_job_reads_as_slurmctld_holds_it(version: str, make_settings: Callable[..., Settings]) -> None:
    """Name, comment, paths and command forge JobState, NodeList, OverSubscribe...: the record is the real one."""
    jobs = recorded(version)["jobs"]
    hostile = ask(version, jobs["hostile"]["job_id"], make_settings())
    truth = json_job(version, "hostile running", jobs["hostile"]["job_id"])
    state = truth["job_state"] if version == "22.05" else truth["job_state"][0]
    assert hostile == JobRecord(jobs["hostile"]["job_id"], state, ("node3", "node4"), SHARED_WORD[version],
                                number(truth["start_time"]), truth["restart_cnt"], None, None)  # fmt: skip
    assert (state, truth["nodes"]) == ("RUNNING", "node[3-4]")
    plain = ask(version, jobs["plain"]["job_id"], make_settings())
    assert (plain.state, plain.trays, plain.oversubscribe, plain.restarts) == ("RUNNING", ("node1", "node2"), "NO", 0)


@pytest.mark.parametrize("version", VERSIONS)
def test_scontrols_text_is_what_the_hostile_job_forged(version: str) -> None:
    """Why slurmctld's text is not read: the last JobState, NodeList and OverSubscribe of scontrol show job -o
    are the user's, and a newline in the comment starts a line that looks like another job's record."""
    job = recorded(version)["jobs"]["hostile"]["job_id"]
    text = answer(version, "hostile running", "show -o")["stdout"]
    last: dict[str, str] = {}
    for key, _, value in (t.partition("=") for t in text.split() if "=" in t):
        last[key] = value
    assert (last["JobState"], last["NodeList"], last["OverSubscribe"]) == ("CANCELLED", "gb[01-18]", "NO")
    assert text.startswith(f"JobId={job} ") and "\nx JobId=999 JobState=CANCELLED" in text


@pytest.mark.parametrize("version", VERSIONS)
def test_het_components_from_the_leader_and_one_component(version: str,
                                                          make_settings: Callable[..., Settings]) -> None:  # fmt: skip
    """The leader's id lists both components (each with its nodes); a component's id lists itself."""
    leader = recorded(version)["jobs"]["het"]["job_id"]
    host = Replay(version)
    nodes = slurmctld.het_nodes(leader, host, make_settings(), "")  # type: ignore[arg-type]
    assert nodes == ((0, "node1"), (0, "node2"), (1, "node3"), (1, "node4"))
    component = ask(version, leader + 1, make_settings())
    assert (component.het_job_id, component.het_job_offset, component.trays) == (leader, 1, ("node3", "node4"))
    assert ask(version, leader, make_settings()).het_job_offset == 0


@pytest.mark.parametrize("version", VERSIONS)
def test_an_arrays_own_id_lists_every_task_and_only_its_task_is_taken(version: str,
                                                                      make_settings: Callable[..., Settings]) -> None:  # fmt: skip
    """slurmctld answers the array's own id (its last task) with every task; the record is that task's alone."""
    first = recorded(version)["jobs"]["array"]["job_id"]
    lines = answer(version, "array job id running", "squeue")["stdout"].splitlines()
    assert len(lines) == 4, lines
    own = ask(version, first, make_settings())
    assert own.job_id == first and len(own.trays) == 1 and own.state == "RUNNING"
    assert ask(version, first + 1, make_settings()).job_id == first + 1


@pytest.mark.parametrize("version", VERSIONS)
def test_an_unknown_job_is_cannot_tell(version: str, make_settings: Callable[..., Settings]) -> None:
    """squeue exits 1 'Invalid job id specified': never a job that ended, never one that shares."""
    with pytest.raises(slurmctld.UnknownJob, match="Invalid job id specified"):
        ask(version, 99999, make_settings())
    assert slurmctld.job_record(99999, Replay(version), make_settings(), "") is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("rc", "stdout", "stderr"),
    [
        (1, "", "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n"),
        (1, "", "slurm_load_jobs error: Invalid job id specified\nand more\n"),
        (2, "", "slurm_load_jobs error: Invalid job id specified\n"),
        (1, "7|RUNNING|", "slurm_load_jobs error: Invalid job id specified\n"),
    ],
    ids=["unreachable", "more-lines", "other-exit", "with-output"],
)
def test_only_squeues_exact_unknown_job_answer_is_unknown(rc: int, stdout: str, stderr: str,
                                                          make_settings: Callable[..., Settings]) -> None:  # fmt: skip
    """Anything but the recorded whole answer (exit 1, that one line, nothing printed) is "cannot tell" only."""

    class Host:
        def run(self, argv: Sequence[str], *, timeout_s: float, env: Mapping[str, str] | None = None) -> Completed:
            return Completed(tuple(argv), rc, stdout, stderr)

    with pytest.raises(SlurmQueryError) as raised:
        slurmctld.ask_job(7, Host(), make_settings(), "")  # type: ignore[arg-type]
    assert not isinstance(raised.value, slurmctld.UnknownJob)


@pytest.mark.parametrize("version", VERSIONS)
def test_an_ended_job_is_still_listed(version: str, make_settings: Callable[..., Settings]) -> None:
    """--states=all: a completed job is listed as COMPLETED (without it squeue hides it: 'cannot tell')."""
    job = recorded(version)["jobs"]["hostile"]["job_id"]
    done = ask(version, job, make_settings(), moment="completed")
    assert (done.state, done.wants_to_start, done.trays) == ("COMPLETED", False, ("node3", "node4"))
    assert answer(version, "hostile completed", "squeue --json")["json_job_ids"] in ([], None, [1, 2])


def test_why_not_json() -> None:
    """22.05's scontrol has no --json and its squeue --json lists every job whatever --jobs says; 24.11's and
    26.05's JSON say nothing like OverSubscribe=OK (``shared`` is empty for a job that may share)."""
    assert "unrecognized option '--json'" in answer("22.05", "plain running", "scontrol --json")["stderr"]
    dumped = answer("22.05", "unknown job", "squeue --json")
    assert dumped["argv"][-1] == "--jobs=99999" and len(dumped["json_job_ids"]) == 8
    for version in ("24.11", "26.05"):
        hostile = json_job(version, "hostile running", recorded(version)["jobs"]["hostile"]["job_id"])
        assert hostile["shared"] == [] and "oversubscribe" not in hostile and isinstance(hostile["job_state"], list)


def _fake_job(version: str, what: str, line: str) -> SlurmJob:
    """The job as FakeHost's slurmctld holds it, from the facts in that version's JSON (not from squeue)."""
    job_id = int(line.split("|", 1)[0])
    kind = answer(version, what, "squeue --json" if version == "22.05" else "scontrol --json")
    if kind["stdout"] is None:  # only the ids were kept: the facts of the same job in another answer
        kind = answer(version, "het leader running" if "het" in what else "hostile running",
                      "squeue --json" if version == "22.05" else "scontrol --json")  # fmt: skip
    jobs = {j["job_id"]: j for j in json.loads(kind["stdout"])["jobs"]}
    truth = jobs.get(job_id)
    if truth is None:  # an array task: its facts are in its own squeue line only
        fields = line.split("|")
        return SlurmJob(job_id, fields[1], fields[2], fields[3], int(fields[4]), int(fields[5]))
    state = truth["job_state"] if version == "22.05" else truth["job_state"][-1]
    het = number(truth["het_job_id"])
    return SlurmJob(job_id, state if "completed" not in what else "COMPLETED", truth["nodes"], line.split("|")[3],
                    number(truth["start_time"]), truth["restart_cnt"], het, number(truth["het_job_offset"]))  # fmt: skip


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("what", ["plain running", "hostile running", "hostile completed", "het leader running",
                                  "het component running"])  # fmt: skip
def test_fake_squeue_prints_what_the_real_one_printed(version: str, what: str) -> None:
    """FakeHost's slurmctld, given the facts of the JSON answer, prints imexctl's question's answer byte for byte."""
    real = answer(version, what, "squeue")
    host = FakeHost()
    for line in real["stdout"].splitlines():
        job = _fake_job(version, what, line)
        host.slurm_jobs[job.job_id] = job
    done = host.run(real["argv"], timeout_s=3, env=real["env"])
    assert (done.returncode, sorted(done.stdout.splitlines())) == (real["rc"], sorted(real["stdout"].splitlines()))


class TestParse:
    """The answer's form, field by field: anything unexpected is 'cannot tell'."""

    GOOD = "42|RUNNING|gb[01-02]|NO|1796434531|0|N/A|N/A|"

    @pytest.mark.parametrize(
        ("line", "problem"),
        [
            ("42|RUNNING|gb[01-02]|NO|1796434531|0|N/A|N/A", "not 8 fields"),
            ("42|RUNNING|gb[01-02]|NO|1796434531|0|N/A|N/A|x|", "not 8 fields"),
            ("42|RUNNING|gb[01-02]|NO|1796434531|0|N/A|", "not 8 fields"),
            ("42 |RUNNING|gb[01-02]|NO|1796434531|0|N/A|N/A|", "JobId '42 '"),
            ("0|RUNNING|gb[01-02]|NO|1796434531|0|N/A|N/A|", "JobId '0'"),
            ("4294967296|RUNNING|gb[01-02]|NO|1|0|N/A|N/A|", "JobId '4294967296'"),
            ("42|running|gb[01-02]|NO|1796434531|0|N/A|N/A|", "job state 'running'"),
            ("42||gb[01-02]|NO|1796434531|0|N/A|N/A|", "job state ''"),
            ("42|RUNNING|gb[01-02]|N O|1796434531|0|N/A|N/A|", "OverSubscribe 'N O'"),
            ("42|RUNNING|gb[01-02]|NO|2026-12-05T01:34:53|0|N/A|N/A|", "StartTime '2026-12-05T01:34:53'"),
            ("42|RUNNING|gb[01-02]|NO|1796434531|-1|N/A|N/A|", "RestartCnt '-1'"),
            ("42|RUNNING|gb[01-02]|NO|1796434531|0|40|N/A|", "HetJobId '40' with HetJobOffset 'N/A'"),
            ("42|RUNNING|gb[01-02]|NO|1796434531|0|x|y|", "HetJobId 'x'"),
        ],
    )
    def test_a_malformed_line_names_what_is_wrong(self, line: str, problem: str) -> None:
        with pytest.raises(SlurmQueryError, match=problem.replace("[", r"\[")):
            slurmctld.parse_answer(line + "\n")

    @pytest.mark.parametrize(("text", "start"), [("N/A", None), ("Unknown", None), ("None", None), ("0", 0)])
    def test_no_start_time(self, text: str, start: int | None) -> None:
        (line,) = slurmctld.parse_answer(f"42|PENDING|||{text}|1|N/A|N/A|\n".replace("|||", "||NO|"))
        assert (line.start_time, line.nodes, line.restarts) == (start, "", 1)

    def test_a_job_listed_twice_or_not_at_all(self, host: FakeHost, make_settings: Callable[..., Settings]) -> None:
        host.slurm_jobs[41] = SlurmJob(41, nodes="gb01", array_job_id=42)
        with pytest.raises(SlurmQueryError, match="listed job 42 0 times"):
            slurmctld.ask_job(42, host, make_settings(), "")
        assert slurmctld.ask_job(41, host, make_settings(), "").trays == ("gb01",)

    def test_a_bad_node_list_is_cannot_tell(self, host: FakeHost, make_settings: Callable[..., Settings]) -> None:
        host.slurm_jobs[42] = SlurmJob(42, nodes="gb[01-02")
        with pytest.raises(SlurmQueryError, match="node list"):
            slurmctld.ask_job(42, host, make_settings(), "")

    def test_the_question(self, host: FakeHost, make_settings: Callable[..., Settings]) -> None:
        """One squeue, the job's SLURM_CONF and SLURM_TIME_FORMAT=%s, bounded by query_timeout_s."""
        host.slurm_jobs[42] = SlurmJob(42, nodes="gb[01-02]", start_time=1796434531, restarts=2)
        got = slurmctld.ask_job(42, host, make_settings(slurm={"query_timeout_s": 2}), "/etc/slurm/slurm.conf")
        assert got == JobRecord(42, "RUNNING", ("gb01", "gb02"), "NO", 1796434531, 2)
        assert got.holds("gb02") and not got.holds("gb03") and got.wants_to_start
        assert host.envs == [(slurmctld.squeue_argv("/usr/bin/squeue", 42),
                              {"SLURM_TIME_FORMAT": "%s", "SLURM_CONF": "/etc/slurm/slurm.conf"})]  # fmt: skip

    def test_no_answer(self, host: FakeHost, make_settings: Callable[..., Settings]) -> None:
        host.squeue_hangs = True
        with pytest.raises(SlurmQueryError, match="cannot ask slurmctld about job 42"):
            slurmctld.ask_job(42, host, make_settings(), "")
        assert host.now == 1003.0
