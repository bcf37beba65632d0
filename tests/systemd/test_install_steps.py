"""The booted-node lab follows docs/install.md literally: its install commands are the page's, in order.

Runs without root or containers (no marker): it compares tests/lab/siteinstall.py with the page.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.lab import siteinstall
from tests.lab.sysd import SystemdLab

PAGE = Path(__file__).resolve().parents[2] / "docs" / "install.md"
#: the sections whose shell commands a compute node runs (3 is slurm.conf, 6-8 are not per-node setup)
NODE_SECTIONS = ("1.", "2.", "4.", "5.")


def _sections() -> dict[str, str]:
    """Section number ("1.") -> its text, for the page's "## N. ..." headings."""
    parts = re.split(r"^## ", PAGE.read_text(encoding="utf-8"), flags=re.MULTILINE)
    return {p.split(" ", 1)[0]: p for p in parts[1:]}


def _fenced(text: str, lang: str) -> list[str]:
    """Every line inside ```lang fences, stripped, without blank and comment lines or trailing comments."""
    blocks = re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)
    lines = [re.sub(r"\s+#\s.*$", "", ln).strip() for b in blocks for ln in b.splitlines()]
    return [ln for ln in lines if ln and not ln.startswith("#")]


def _node_commands() -> list[str]:
    sections = _sections()
    return [ln for s in NODE_SECTIONS for ln in _fenced(sections[s], "sh")]


def test_every_lab_step_is_a_command_of_the_page_in_the_pages_order() -> None:
    """STEPS are the page's own lines (placeholders kept), in the order the page gives them."""
    page = _node_commands()
    positions = []
    for step in siteinstall.STEPS:
        assert step in page, f"the lab runs {step!r}, which docs/install.md does not say"
        positions.append(page.index(step))
    assert positions == sorted(positions), "the lab runs the page's commands in another order"


def test_every_command_of_the_page_is_run_or_said_why_not() -> None:
    """No node command of the page is skipped silently, and NOT_RUN names only commands the page has."""
    page = _node_commands()
    unaccounted = [ln for ln in page if ln not in siteinstall.STEPS and ln not in siteinstall.NOT_RUN]
    assert unaccounted == [], f"docs/install.md commands the lab neither runs nor explains: {unaccounted}"
    stale = [ln for ln in siteinstall.NOT_RUN if ln not in page and ln not in PAGE.read_text()]
    assert stale == [], f"NOT_RUN names commands the page no longer has: {stale}"


def test_the_checks_are_the_pages() -> None:
    """The checks run after the install are quoted in the page (section 1 or the rollout checklist)."""
    text = PAGE.read_text(encoding="utf-8")
    for line, want in siteinstall.CHECKS:
        assert f"`{line}`" in text, line
        assert want.strip() in text, want


def test_the_labs_slurm_conf_has_the_pages_lines() -> None:
    """Section 3's slurm.conf lines are in the page and in the lab's slurm.conf, and only those prolog lines."""
    page = _fenced(_sections()["3."], "ini")
    for line in siteinstall.SLURM_CONF:
        assert line in page, line
    conf = SystemdLab(Path("/nonexistent"), nodes=2).slurm_conf().splitlines()
    assert set(siteinstall.SLURM_CONF) <= set(conf)
    assert [ln for ln in conf if ln.startswith(("Prolog", "Epilog"))] == list(siteinstall.SLURM_CONF)
    assert "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=EXCLUSIVE" in conf


@pytest.mark.parametrize("placeholder", sorted(siteinstall.PLACEHOLDERS))
def test_placeholders_are_the_pages(placeholder: str) -> None:
    """The lab fills in exactly the page's placeholders."""
    assert placeholder in PAGE.read_text(encoding="utf-8")
