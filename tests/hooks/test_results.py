"""The records the prolog, the epilog and cleanup return (imexctl.hooks.results), and how they render."""

from __future__ import annotations

import pytest

from imexctl.hooks.results import Action, CleanupResult, EpilogResult, PrologResult, Setup, texts

CHANNEL = "/dev/nvidia-caps-imex-channels/channel4"


@pytest.mark.parametrize(
    ("action", "text"),
    [
        (Action("stop_daemon", "4"), "stop daemon of job 4"),
        (Action("stop_daemon", "4", "SIGKILL to pid 77", killed=True), "stop daemon of job 4 (SIGKILL to pid 77)"),
        (Action("remove_channel", CHANNEL), f"remove channel {CHANNEL}"),
        (Action("remove_job_dir", "/run/imexctl/jobs/4"), "remove /run/imexctl/jobs/4"),
        (Action("remove_stray_channel", CHANNEL), f"remove stray channel {CHANNEL}"),
        (Action("remove_note", "4"), "remove note of job 4"),
        (Action("failed", "/dev/x", "busy"), "could not remove /dev/x: busy"),
    ],
)
def test_action_text(action: Action, text: str) -> None:
    """Each kind of action reads as the summary lines and cleanup have always printed it."""
    assert action.text == text
    assert texts((action,), dry_run=True) == [f"would {text}"]


def test_records_are_frozen() -> None:
    """A result cannot be changed after the run."""
    with pytest.raises(AttributeError):
        PrologResult(0.1).skipped = "x"  # type: ignore[misc]


def test_prolog_fields_of_a_set_up() -> None:
    """A domain set up: deadline, trays, ports, channel, ready, blamed, then the duration."""
    setup = Setup(2, CHANNEL, port=61042, cmd_port=62042, ready=True, blamed=("10.0.0.2",))
    assert PrologResult(0.5, deadline_s=30.0, setup=setup).fields() == {
        "ok": True,
        "deadline_s": 30.0,
        "trays": 2,
        "port": 61042,
        "cmd_port": 62042,
        "channel": CHANNEL,
        "ready": True,
        "blamed": ["10.0.0.2"],
        "duration_s": 0.5,
    }
    only = PrologResult(0.5, deadline_s=30.0, setup=Setup(1, CHANNEL, daemon=False)).fields()
    assert list(only) == ["ok", "deadline_s", "trays", "channel", "daemon", "duration_s"] and only["daemon"] is False


def test_epilog_and_cleanup_render_their_actions_as_text() -> None:
    """epilog.done and cleanup's JSON carry the actions' texts; cleanup's text says when there is nothing."""
    stop = Action("stop_daemon", "4")
    assert EpilogResult(0.2, (stop,), ("lost",)).fields() == {
        "ok": True,
        "actions": ["stop daemon of job 4"],
        "duration_s": 0.2,
        "lost_daemon": ["lost"],
    }
    dry = CleanupResult(True, (stop,), ("job 5 still runs on this node (use --force)",))
    assert dry.data() == {
        "dry_run": True,
        "actions": ["would stop daemon of job 4"],
        "skipped": ["job 5 still runs on this node (use --force)"],
        "errors": [],
    }
    assert dry.text() == "would stop daemon of job 4\nskipped: job 5 still runs on this node (use --force)\n"
    assert CleanupResult(False).text() == "nothing to clean up\n"
