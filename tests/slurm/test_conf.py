"""slurmconf: slurm.conf read as Slurm reads it (src/common/parse_config.c), for the keys imexctl needs."""

from __future__ import annotations

from pathlib import Path

import pytest

from imexctl.platform.errors import ConfigError
from imexctl.slurm import conf as slurmconf

DATA = Path(__file__).parents[1] / "data" / "slurmconf"


def conf(tmp_path: Path, text: str, name: str = "slurm.conf") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


class TestRead:
    def test_real_syntax(self) -> None:
        """Case-insensitive keys, comments, a continuation line, quotes, escapes and an Include."""
        c = slurmconf.read(DATA / "good.conf")
        assert c.get("prolog") == "/etc/slurm/prolog.d/*" and c.get("PROLOGFLAGS") == "Alloc,Contain"
        assert c.get("ClusterName") == "gb200" and c.get("MailProg") == "/usr/bin/mail"
        assert c.get("Comment") == "a#b"
        assert c.get("TopologyPlugin") == "topology/block"
        assert c.files == (DATA / "good.conf", DATA / "nodes.conf")

    def test_record_lines_do_not_shadow_global_keys(self) -> None:
        """A NodeName line's PrologEpilogTimeout=5 is that record's, not the global 120."""
        c = slurmconf.read(DATA / "good.conf")
        assert c.seconds("PrologEpilogTimeout") == 120
        assert [r[1]["NodeName"] for r in c.records if r[0] == "nodename"] == ["gb[01-18]", "gb[19-36]"]

    def test_last_value_wins_and_all_are_kept(self, tmp_path: Path) -> None:
        """Prolog may appear on several lines (24.05+); a scalar's last value is the one in effect."""
        c = slurmconf.read(conf(tmp_path, "Prolog=/a\nprolog=/b\nPrologEpilogTimeout=10\nPrologEpilogTimeout=30\n"))
        assert c.get_all("Prolog") == ("/a", "/b") and c.seconds("PrologEpilogTimeout") == 30

    def test_include_glob_and_relative(self, tmp_path: Path) -> None:
        """Include takes glob patterns, relative to the including file's directory, in sorted order."""
        (tmp_path / "conf.d").mkdir()
        conf(tmp_path / "conf.d", "PrologTimeout=20\n", "b.conf")
        conf(tmp_path / "conf.d", "PrologTimeout=10\n", "a.conf")
        c = slurmconf.read(conf(tmp_path, "include conf.d/*.conf\n"))
        assert c.get_all("PrologTimeout") == ("10", "20")

    @pytest.mark.parametrize(
        ("text", "message"),
        [
            pytest.param("Include missing.conf\n", "missing.conf: No such file", id="missing-include"),
            pytest.param("Include\n", "Include without a file name", id="include-no-file"),
            pytest.param("just words\n", "not a Key=Value line", id="no-pair"),
            pytest.param("PrologEpilogTimeout=soon\n", "is not a number of seconds", id="bad-seconds"),
        ],
    )
    def test_errors_name_the_file_and_line(self, tmp_path: Path, text: str, message: str) -> None:
        """Broken files are a ConfigError naming what is wrong."""
        with pytest.raises(ConfigError, match=message):
            slurmconf.read(conf(tmp_path, text)).seconds("PrologEpilogTimeout")

    def test_include_loop_is_bounded(self, tmp_path: Path) -> None:
        """A file that includes itself fails after a bounded depth, not forever."""
        with pytest.raises(ConfigError, match="nested more than"):
            slurmconf.read(conf(tmp_path, "Include slurm.conf\n"))

    def test_unreadable_file(self, tmp_path: Path) -> None:
        """A missing slurm.conf is a ConfigError naming it."""
        with pytest.raises(ConfigError, match="cannot read"):
            slurmconf.read(tmp_path / "nope.conf")


class TestHookTimeout:
    @pytest.mark.parametrize(
        ("text", "hook", "want"),
        [
            pytest.param("PrologEpilogTimeout=30\n", "prolog", (30, "PrologEpilogTimeout"), id="common"),
            pytest.param("PrologEpilogTimeout=30\nPrologTimeout=90\n", "prolog", (90, "PrologTimeout"), id="25.05"),
            pytest.param(
                "PrologEpilogTimeout=30\nPrologTimeout=90\n", "epilog", (30, "PrologEpilogTimeout"), id="epilog-common"
            ),
            pytest.param("EpilogTimeout=45\n", "epilog", (45, "EpilogTimeout"), id="epilog-own"),
            pytest.param("ClusterName=x\n", "prolog", None, id="unset-waits-forever"),
            pytest.param("PrologEpilogTimeout=0\n", "prolog", None, id="zero"),
        ],
    )
    def test_which_key_sets_it(self, tmp_path: Path, text: str, hook: str, want: tuple[int, str] | None) -> None:
        """PrologTimeout/EpilogTimeout override PrologEpilogTimeout; unset means no limit."""
        assert slurmconf.hook_timeout(slurmconf.read(conf(tmp_path, text)), hook) == want
