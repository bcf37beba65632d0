"""Where a config file is wrong (issue 42): a hook's config_invalid error carries ``<file>:<line>`` (``where``), so
that a drain reason or an alert can name the line without parsing the message."""

from __future__ import annotations

from pathlib import Path

import pytest

from imexctl.config import settings
from imexctl.platform.errors import ConfigError


def where(tmp_path: Path, text: str) -> str:
    """The ``where`` of the ConfigError that loading ``text`` raises."""
    path = tmp_path / "imexctl.conf"
    path.write_text(text)
    path.chmod(0o644)
    with pytest.raises(ConfigError) as info:
        settings.load(path, node="gb01")
    return info.value.where


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("[policy]\nfabric = none\njobs: all\n", 3),  # a line that does not parse
        ("# site\n[policy]\nfabric = none\n\n[readiness]\ndeadline_s = soon\n", 6),  # a bad value
        ("[policy]\n[readiness]\ndeadline = 5\n", 3),  # an unknown key
        ("[policy]\nfabric = none\n; old\n[deamon]\nunit = x\n", 4),  # an unknown section: its header
        ("[imex]\nIMEX_BOGUS = 1\n", 2),  # an unknown [imex] key
        ("[readiness]\npoll_initial_s = 2\npoll_max_s = 1\n", 2),  # keys that do not fit: the one the check names
        ("[readiness]\ndeadline_s = 9\n[policy]\njobs = partitions\n", 0),  # partitions left at its default: no line
    ],
    ids=["syntax", "value", "key", "section", "imex", "cross-check", "default"],
)
def test_the_error_names_the_file_and_line(tmp_path: Path, text: str, line: int) -> None:
    path = tmp_path / "imexctl.conf"
    assert where(tmp_path, text) == (f"{path}:{line}" if line else str(path))


def test_a_file_that_cannot_be_read_is_named_without_a_line(tmp_path: Path) -> None:
    """Not root's or writable by others: the file alone."""
    path = tmp_path / "imexctl.conf"
    path.write_text("[policy]\n")
    path.chmod(0o666)
    with pytest.raises(ConfigError) as info:
        settings.load(path, node="gb01")
    assert info.value.where == str(path)
