"""remnants: the domains a tray tore down while their other trays may hold them, and the prolog's wait for them.

The last class is the property the channel rule promises (design.md "The channel rule"): over random clusters
of one NVLink clique (its trays in slurm.conf, or in topology blocks with keys, a map or none), random jobs that
start on free trays, end, and leave their trays one by one, no two domains alive at once (a running one, or
what is left of an ending one) hold one channel number, once each tray waits as the prolog does.
"""

from __future__ import annotations

import json
import os
import random
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest
import structlog
from structlog.testing import capture_logs

from imexctl.channels.devices import channel_minor
from imexctl.config import settings as config
from imexctl.config.settings import Settings
from imexctl.hooks import members, remnants
from imexctl.hooks.jobs import CLOCK_SLACK_S
from imexctl.hooks.runtime import Runtime
from imexctl.hooks.state import JobState
from imexctl.hooks.teardown import cleanup, teardown
from imexctl.platform.errors import DomainBusyError
from imexctl.slurm import nodefold
from imexctl.slurm.topofile import BlockMap, parse_map, parse_topology
from tests.conftest import write_config
from tests.support.fakes import FakeGpu, FakeHost, SlurmJob

KEY = "4f2a9c1e-5d6b-4e8f-9a0b-1c2d3e4f5a6b.7"


def state(job_id: int = 7, trays: tuple[str, ...] = ("gb01", "gb02"), channel: int | None = 3, **more: Any) -> JobState:
    """What a prolog wrote on gb01 for a domain over ``trays``, its epilog begun at ``ended``."""
    fields: dict[str, Any] = {"ended": 0.0, "epilog_deadline": 0.0, "restarts": 0, "start_time": 1_796_434_004}
    fields.update(more)
    return JobState(job_id, "gb01", 1000, 100, "alice", trays, (), 0, "exec", channel, "", 1.0, **fields)


@pytest.fixture
def rt(host: FakeHost, make_settings: Callable[..., Settings], root: Path) -> Runtime:
    (root / "run/imexctl").mkdir(parents=True, mode=0o755)
    return Runtime(host, FakeGpu(), make_settings(), structlog.get_logger())


class TestRemember:
    def test_a_domain_with_a_channel_and_other_trays_is_kept_root_only(self, rt: Runtime) -> None:
        """Its channel, job, run and trays, and its bound: its epilog's own deadline here plus the clock slack;
        the file is root's, mode 0600, written whole."""
        remnants.remember(state(ended=rt.host.time(), epilog_deadline=rt.host.time() + 90), rt)
        (kept,) = remnants.load(rt)
        assert (kept.job_id, kept.channel, kept.trays, kept.restarts) == (7, 3, ("gb01", "gb02"), 0)
        assert kept.until == rt.host.time() + 90 + CLOCK_SLACK_S
        st = os.lstat(remnants.path(rt))
        assert stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o600

    def test_without_a_recorded_deadline_the_settings_bound_it(self, rt: Runtime) -> None:
        """A state an older epilog marked (no deadline): every wait of the settings from its mark on."""
        d = rt.settings.daemon
        remnants.remember(state(ended=rt.host.time() - 5), rt)
        (kept,) = remnants.load(rt)
        waits = d.process_wait_s + d.lock_timeout_s + d.stop_timeout_s + d.kill_grace_s
        assert rt.host.time() - 5 + waits + CLOCK_SLACK_S < kept.until <= rt.host.time() + waits + 20 + CLOCK_SLACK_S

    @pytest.mark.parametrize(
        "gone", [state(trays=("gb01",)), state(channel=None), None], ids=["one-tray", "no-channel", "no-state"]
    )
    def test_what_cannot_live_on_elsewhere_is_not_kept(self, rt: Runtime, gone: JobState | None) -> None:
        """A one-tray domain, a domain without a channel, a lost state: nothing written."""
        remnants.remember(gone, rt)
        assert not remnants.path(rt).exists()

    def test_the_file_keeps_the_newest_domains_within_their_bound(self, rt: Runtime, host: FakeHost) -> None:
        """At most KEEP domains, the newest; a domain past its bound is dropped; the same job is kept once."""
        for job in range(1, remnants.KEEP + 6):
            remnants.remember(state(job_id=job, ended=rt.host.time()), rt)
        assert [r.job_id for r in remnants.load(rt)] == list(range(6, remnants.KEEP + 6))
        remnants.remember(state(job_id=remnants.KEEP + 5, channel=9, ended=rt.host.time()), rt)
        assert [r.channel for r in remnants.load(rt) if r.job_id == remnants.KEEP + 5] == [9]
        host.now += remnants.load(rt)[-1].until - rt.host.time() + 1  # every bound passed
        remnants.remember(state(job_id=1000, ended=rt.host.time()), rt)
        assert [r.job_id for r in remnants.load(rt)] == [1000]

    @pytest.mark.parametrize(
        "spoil",
        [
            lambda p: p.write_text("{not json"),
            lambda p: p.write_text(json.dumps({"domains": [{"job_id": 7}]})),
            lambda p: p.write_text(json.dumps({"domains": [{**state()._asdict(), "trays": "gb01"}]})),
            lambda p: (p.write_text('{"domains": []}'), p.chmod(0o666)),
            lambda p: p.symlink_to("/etc/hostname"),
        ],
        ids=["not-json", "fields-missing", "foreign-fields", "world-writable", "symlink"],
    )
    def test_an_unreadable_file_is_no_record_and_says_so(self, rt: Runtime, spoil: Callable[[Path], Any]) -> None:
        """A file that is not what remember writes (or not root's alone, or a link): no domain, a warning; the next
        teardown writes it anew."""
        spoil(remnants.path(rt))
        with capture_logs() as logs:
            assert remnants.load(rt) == []
        (warned,) = [e for e in logs if e["event"] == "imex.channel.memory_failed"]
        assert warned["log_level"] == "warning" and warned["path"] == str(remnants.path(rt))
        remnants.remember(state(ended=rt.host.time()), rt)
        assert [r.job_id for r in remnants.load(rt)] == [7]

    def test_teardown_remembers_and_a_dry_run_does_not(self, rt: Runtime, root: Path) -> None:
        """teardown (the epilog's, a roll-back's, cleanup's) records the domain it removes; cleanup --dry-run not."""
        from imexctl.hooks.state import write_state

        jd = rt.settings.paths.job(7)
        jd.path.mkdir(parents=True)
        write_state(jd, state(ended=rt.host.time())._replace(backend="none"))
        cleanup(rt, job_id=7, dry_run=True, force=True)
        assert not remnants.path(rt).exists()
        teardown(7, rt)
        assert [(r.job_id, r.trays) for r in remnants.load(rt)] == [(7, ("gb01", "gb02"))]


class TestWaitGone:
    def _remember(self, rt: Runtime, **more: Any) -> None:
        remnants.remember(state(ended=rt.host.time(), epilog_deadline=rt.host.time() + 60, **more), rt)

    def test_another_run_of_the_same_job_is_never_waited_for(self, rt: Runtime, host: FakeHost) -> None:
        """slurmctld starts a job's next run only once every epilog of the last has ended: job 7 again, no wait."""
        self._remember(rt)
        remnants.wait_gone(7, 3, ("gb01", "gb03"), rt, slurm_conf="/etc/slurm/slurm.conf", deadline=host.now)
        assert not host.calls

    def test_a_domain_past_its_bound_is_not_waited_for(self, rt: Runtime, host: FakeHost) -> None:
        """Past its bound the old domain's epilogs must have ended everywhere: no question."""
        self._remember(rt)
        host.now += remnants.load(rt)[0].until - rt.host.time()
        remnants.wait_gone(8, 3, ("gb01", "gb03"), rt, slurm_conf="/etc/slurm/slurm.conf", deadline=host.now)
        assert not host.calls

    @pytest.mark.parametrize(
        ("record", "waits"),
        [
            (SlurmJob(7, "RUNNING", "gb[02-03]"), True),
            (SlurmJob(7, "RUNNING", "gb[02-03]", restarts=1), False),
            (SlurmJob(7, "RUNNING", "gb[02-03]", start_time=1_796_439_999), False),
            (SlurmJob(7, "COMPLETING", "gb02", restarts=1), True),
            (SlurmJob(7, "CANCELLED", "gb[01-02]"), False),
        ],
        ids=["still-runs-there", "requeued-and-runs-again", "started-again", "requeue-completing", "cancelled"],
    )
    def test_what_slurmctld_says_decides(self, rt: Runtime, host: FakeHost, record: SlurmJob, waits: bool) -> None:
        """The old job still holds gb02 in the run that set the domain up (a job that gave up gb01 alone), or is
        COMPLETING there: wait. A later run of it, or an ended job: gone."""
        self._remember(rt)
        host.slurm_jobs[7] = record
        if waits:
            with pytest.raises(DomainBusyError, match=r"job 7's IMEX domain on gb02"):
                remnants.wait_gone(8, 3, ("gb01", "gb03"), rt, slurm_conf="/s.conf", deadline=host.now)
        else:
            remnants.wait_gone(8, 3, ("gb01", "gb03"), rt, slurm_conf="/s.conf", deadline=host.now)

    def test_a_job_slurmctld_purged_is_gone_at_once(self, rt: Runtime, host: FakeHost) -> None:
        """Issue 43: slurmctld forgets a job MinJobAge (300 s by default) after its last epilog, well within the
        remembered bound (its epilog's deadline plus the clock slack). Its "Invalid job id" is an answer: one
        question, no wait, and the log says why (it was read as no answer: the new domain waited until its
        deadline and every tray of it drained)."""
        self._remember(rt)
        with capture_logs() as logs:
            remnants.wait_gone(8, 3, ("gb01", "gb03"), rt, slurm_conf="/s.conf", deadline=host.now + 30)
        assert len(host.calls) == 1 and host.calls[0][0].endswith("squeue") and not host.slept
        (waited,) = [e for e in logs if e["event"] == "imex.channel.waited"]
        assert waited["old_job_id"] == 7 and "no longer holds job 7" in waited["how"], waited

    def test_slurmctld_unreachable_is_no_answer(self, rt: Runtime, host: FakeHost) -> None:
        """squeue cannot reach slurmctld (exit 1 too, another message): no answer, so the bound decides and the
        prolog's deadline comes first."""
        self._remember(rt)
        host.squeue_down_for = 10**6
        with pytest.raises(DomainBusyError, match=r"job 7's IMEX domain on gb02, .*slurmctld did not answer"):
            remnants.wait_gone(8, 3, ("gb01", "gb03"), rt, slurm_conf="/s.conf", deadline=host.now + 5)

    def test_outside_slurmd_nothing_is_waited_for(self, rt: Runtime, host: FakeHost) -> None:
        """No slurm.conf (imexctl demo, the simulator's fault cycles): no Slurm ends jobs there, so the remembered
        domain holds nothing back and squeue is never run (a crashed run's leftovers held the next prolog for the
        whole bound and drained its tray)."""
        self._remember(rt)
        remnants.wait_gone(8, 3, ("gb01", "gb03"), rt, slurm_conf="", deadline=host.now + 2)
        assert not host.calls and not host.slept


# ---------------------------------------------------------------- the property


class _Domain:
    """A domain of the model: its trays, number, whether its job runs, and the trays it still lives on."""

    def __init__(self, job_id: int, trays: list[str], number: int) -> None:
        self.job_id, self.trays, self.number = job_id, trays, number
        self.running, self.live = True, set(trays)


class _Cluster:
    """One NVLink clique of trays, each with its own run directory, and slurmctld as the model knows it."""

    def __init__(self, rng: random.Random, base: Path, topology: str) -> None:
        self.rng = rng
        size = rng.randint(2, 7)
        self.trays = [f"gb{i:02d}" for i in range(1, size + 1)]
        self.count = rng.randint(size + 1, 3 * size + 2)  # the rule is proven while the clique is below the count
        self.host = FakeHost()
        self.source, self.key_map, self.blocks = self._topology(topology)
        path = write_config(base, {"paths": {"root": f"{base}/%n"}, "policy": {"channel_count": self.count}})
        self.rts = {
            t: Runtime(self.host, FakeGpu(), config.load(path, node=t), structlog.get_logger()) for t in self.trays
        }
        for t in self.trays:
            (base / t / "run/imexctl").mkdir(parents=True, mode=0o755)
        self.domains: list[_Domain] = []
        self.next_id = rng.randint(1, 5000)

    def _topology(self, kind: str) -> tuple[BlockMap | None, BlockMap | None, list[list[str]]]:
        """slurm.conf's node list (one block), or blocks of the clique: keyed, keyless, or keyed by a map."""
        if kind == "slurm.conf":
            return None, None, [self.trays]
        cuts = sorted(self.rng.sample(range(1, len(self.trays)), self.rng.randint(0, min(2, len(self.trays) - 1))))
        blocks = [self.trays[a:b] for a, b in zip([0, *cuts], [*cuts, len(self.trays)])]
        tag = f"  # imexctl-key: {KEY}" if kind == "keyed" else ""
        text = "".join(f"BlockName=b{i} Nodes={nodefold.fold(b)}{tag}\n" for i, b in enumerate(blocks))
        key_map = parse_map("".join(f"{t} {KEY}\n" for t in self.trays), "map") if kind == "map" else None
        return parse_topology(text, "topology.conf"), key_map, blocks

    def _place(self, trays: list[str]) -> members.Place:
        return members.channel_place(trays, self.source, self.trays, self.key_map)

    def _tell_slurmctld(self) -> None:
        """squeue's answers as slurmctld holds the jobs now: an ending job lists the trays it still holds."""
        for d in self.domains:
            state = "RUNNING" if d.running else "COMPLETING" if d.live else "COMPLETED"
            self.host.slurm_jobs[d.job_id] = SlurmJob(d.job_id, state, nodefold.fold(sorted(d.live or d.trays)))

    def start(self) -> None:
        """A job on free trays of one block; every tray's prolog waits as it would (here: the job starts later)."""
        busy = {t for d in self.domains for t in d.live}
        block = self.rng.choice(self.blocks)
        free = [t for t in block if t not in busy]
        if not free:
            return
        trays = self.rng.sample(free, self.rng.randint(1, len(free)))
        self.next_id += self.rng.choice([1, 1, 2, max(1, (self.count - 1) // len(self.trays)), self.rng.randint(1, 99)])
        place = self._place(trays)
        number = channel_minor(self.next_id, self.count, place.position, place.trays)
        self._tell_slurmctld()
        self.host.squeue_down_for = 1 if self.rng.random() < 0.1 else 0
        try:
            for t in trays:
                rt = self.rts[t]
                remnants.wait_gone(self.next_id, number, trays, rt, slurm_conf="/s.conf", deadline=self.host.now)
        except DomainBusyError:
            return  # its prologs wait: it does not start yet
        self.domains.append(_Domain(self.next_id, trays, number))

    def end(self) -> None:
        running = [d for d in self.domains if d.running]
        if running:
            self.rng.choice(running).running = False

    def leave_one_tray(self) -> None:
        """An ending job's epilog ends on one of its trays: that tray tears the domain down (and remembers it)."""
        ending = [d for d in self.domains if not d.running and d.live]
        if not ending:
            return
        d = self.rng.choice(ending)
        tray = self.rng.choice(sorted(d.live))
        now = self.host.time()
        remnants.remember(
            state(d.job_id, tuple(d.trays), d.number, ended=now, epilog_deadline=now + 60), self.rts[tray]
        )
        d.live.discard(tray)

    def clashes(self) -> list[str]:
        """Pairs of domains alive at once (any tray left) that hold one number."""
        alive = [d for d in self.domains if d.live]
        return [
            f"jobs {a.job_id} on {a.trays} and {b.job_id} on {b.trays}: channel {a.number} ({len(self.trays)} trays, "
            f"channel_count {self.count}, blocks {self.blocks})"
            for i, a in enumerate(alive)
            for b in alive[i + 1 :]
            if a.number == b.number
        ]


@pytest.fixture
def base() -> Iterator[Path]:
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="imx", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("topology", ["slurm.conf", "keyed", "keyless", "map"])
@pytest.mark.parametrize("seed", range(12))
def test_no_two_domains_alive_at_once_in_a_clique_hold_one_number(base: Path, topology: str, seed: int) -> None:
    """Random jobs over one clique: started on free trays (of one block), ended, their trays left one by one; after
    every step no two domains that still live anywhere have one channel number."""
    rng = random.Random(f"{topology}-{seed}")
    cluster = _Cluster(rng, base, topology)
    for step in range(120):
        rng.choice([cluster.start, cluster.start, cluster.end, cluster.leave_one_tray, cluster.leave_one_tray])()
        clashes = cluster.clashes()
        assert not clashes, f"step {step}: {clashes}"
    assert len(cluster.domains) > 5, "the run started too few jobs to tell anything"
