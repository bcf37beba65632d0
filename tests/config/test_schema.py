"""The one grammar of imexctl.conf (schema.parse_ini_subset): what it reads, and the line it names for the rest."""

from __future__ import annotations

from pathlib import Path

import pytest

from imexctl.config import schema

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("text", "want"),
    [
        pytest.param("", {}, id="empty"),
        pytest.param("\n\n   \n", {}, id="blank-lines"),
        pytest.param("[paths]\nroot = /x\n", {"paths": {"root": "/x"}}, id="section-and-key"),
        pytest.param("[paths]\n", {"paths": {}}, id="empty-section"),
        pytest.param("[paths]\nroot=/x\nrun_dir   =   /r  \n", {"paths": {"root": "/x", "run_dir": "/r"}}, id="blanks"),
        pytest.param("[a]\nk =\n", {"a": {"k": ""}}, id="empty-value"),
        pytest.param("[a]\nk = x = y\n", {"a": {"k": "x = y"}}, id="first-equals-splits"),
        pytest.param("[a]\nk == y\n", {"a": {"k": "= y"}}, id="double-equals"),
        pytest.param("[a]\nk = /x # not a comment\n", {"a": {"k": "/x # not a comment"}}, id="no-inline-comments"),
        pytest.param("[a]\nk = %(root)s\n", {"a": {"k": "%(root)s"}}, id="no-interpolation"),
        pytest.param("[a]\nk = a:b\n", {"a": {"k": "a:b"}}, id="colon-in-value"),
        pytest.param("# c\n; c\n[a]\n  # indented comment\n\t; tab\nk = v\n", {"a": {"k": "v"}}, id="comments"),
        pytest.param("[a]\r\nk = v\r\n", {"a": {"k": "v"}}, id="crlf"),
        pytest.param("[a]\nK = 1\nk = 2\n[A]\n", {"a": {"K": "1", "k": "2"}, "A": {}}, id="case-sensitive"),
        pytest.param("[a]\nk = 1\n[b]\nk = 2\n", {"a": {"k": "1"}, "b": {"k": "2"}}, id="same-key-two-sections"),
        pytest.param("[imex]\nLOG_LEVEL = 4\n", {"imex": {"LOG_LEVEL": "4"}}, id="imex"),
        pytest.param("[a]\nk = imex\x00\n", {"a": {"k": "imex\x00"}}, id="nul-in-value-left-to-validate"),
        pytest.param("[a]\nlog level = x\n", {"a": {"log level": "x"}}, id="blank-in-key-left-to-validate"),
    ],
)
def test_reads(text: str, want: dict[str, dict[str, str]]) -> None:
    """Sections, ``key = value`` (split at the first '='), comments and blank lines; values as written."""
    assert schema.parse_ini_subset(text, "/etc/x.conf") == want


@pytest.mark.parametrize(
    ("text", "line", "why"),
    [
        pytest.param("[a]\nk: v\n", 2, "':' before the '='", id="colon"),
        pytest.param("[a]\nk:x = v\n", 2, "':' before the '='", id="colon-in-key"),
        pytest.param("[a]\nk = v\n  w\n", 3, "indented: continuation lines", id="continuation"),
        pytest.param("[a]\n  k = v\n", 2, "indented", id="indented-key"),
        pytest.param(" [a]\n", 1, "indented", id="indented-section"),
        pytest.param("k = v\n[a]\n", 1, "before the first [section]", id="key-outside-section"),
        pytest.param("[a]\njust some words\n", 2, "not a [section], a comment or key = value", id="no-equals"),
        pytest.param("[a]\n= 5\n", 2, "no key before the '='", id="empty-key"),
        pytest.param("[a]\n  = 5\n", 2, "indented", id="indented-empty-key"),
        pytest.param("[a]\nk = 1\n[b]\n[a]\n", 4, "section [a] given again (first on line 1)", id="duplicate-section"),
        pytest.param("[a]\nk = 1\nk = 2\n", 3, "[a] k given again (first on line 2)", id="duplicate-key"),
        pytest.param("[a]\nk = 1\nk  =2\n", 3, "given again", id="duplicate-key-blanks"),
        pytest.param("[DEFAULT]\nk = 1\n", 1, "[DEFAULT] is not read", id="default"),
        pytest.param("[paths\nroot = /x\n", 1, "not a section header", id="unclosed"),
        pytest.param("[]\n", 1, "not a section header", id="empty-name"),
        pytest.param("[a]b]\n", 1, "not a section header", id="bracket-in-name"),
        pytest.param("[a] # c\n", 1, "nothing after the ']'", id="text-after-header"),
        pytest.param("[imex ]\n", 1, "blanks or non-printing characters", id="blank-in-name"),
        pytest.param("[a\tb]\n", 1, "blanks or non-printing", id="tab-in-name"),
        pytest.param("\ufeff[a]\n", 1, "byte order mark", id="bom"),
        pytest.param("[a]\nk = v\rw\n", 2, "carriage return", id="lone-cr"),
    ],
)
def test_refuses_naming_file_and_line(text: str, line: int, why: str) -> None:
    """Anything else is an error naming the file, the line number, the reason and the line as written."""
    with pytest.raises(schema.SchemaError) as info:
        schema.parse_ini_subset(text, "/etc/x.conf")
    message = str(info.value)
    assert message.startswith(f"/etc/x.conf: line {line}: ") and why in message, message
    assert repr(text.split("\n")[line - 1].removesuffix("\r"))[:60] in message


def test_a_long_line_is_shortened_in_the_error() -> None:
    """The line in the message is cut at 80 characters."""
    with pytest.raises(schema.SchemaError, match=r"line 2: .*'x{77}\.\.\.'$"):
        schema.parse_ini_subset("[a]\n" + "x" * 500 + "\n")


def test_without_a_path_the_message_says_config() -> None:
    """Text that comes from no file is named ``<config>``."""
    with pytest.raises(schema.SchemaError, match="^<config>: line 1: "):
        schema.parse_ini_subset("k = v\n")


def _ini_blocks() -> list[tuple[str, str]]:
    """The ``ini`` code blocks of README.md and docs/*.md that are imexctl config files."""
    found = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for i, block in enumerate(page.read_text().split("```ini\n")[1:]):
            text = block.split("```", 1)[0]
            if any(f"[{section}]" in text for section in schema.SCHEMA):
                found.append((f"{page.name}#{i}", text))
    return found


def test_the_documented_configs_are_in_the_grammar() -> None:
    """Every config example in the docs reads without an error."""
    blocks = _ini_blocks()
    assert len(blocks) >= 4
    for name, text in blocks:
        assert schema.parse_ini_subset(text, name), name


def _find(explicit: str | None, env: dict[str, str]) -> tuple[str, bool]:
    """``find_config`` as its callers call it: with the value of ``SLURM_CONF`` from the same environment."""
    return schema.find_config(explicit, env, slurm_conf=env.get("SLURM_CONF", ""))


class TestFindConfig:
    def test_explicit_option_wins(self, tmp_path: Path) -> None:
        """--config is used (and required) even when the environment names other files."""
        env = {"IMEXCTL_CONFIG": "/etc/other.conf", "SLURM_CONF": str(tmp_path / "slurm.conf")}
        assert _find("/x/explicit.conf", env) == ("/x/explicit.conf", True)

    def test_environment_variable_next(self, tmp_path: Path) -> None:
        """Without --config, $IMEXCTL_CONFIG is used and required."""
        (tmp_path / "imexctl.conf").write_text("")
        env = {"IMEXCTL_CONFIG": "/etc/env.conf", "SLURM_CONF": str(tmp_path / "slurm.conf")}
        assert _find(None, env) == ("/etc/env.conf", True)

    def test_beside_slurm_conf_when_present(self, tmp_path: Path) -> None:
        """imexctl.conf in the directory of $SLURM_CONF is used when it exists."""
        (tmp_path / "imexctl.conf").write_text("")
        assert _find(None, {"SLURM_CONF": str(tmp_path / "slurm.conf")}) == (
            str(tmp_path / "imexctl.conf"),
            True,
        )

    def test_default_when_nothing_beside_slurm_conf(self, tmp_path: Path) -> None:
        """Without a file beside $SLURM_CONF the default path is used and may be missing."""
        assert _find(None, {"SLURM_CONF": str(tmp_path / "slurm.conf")}) == (schema.DEFAULT_CONFIG, False)

    def test_default_with_empty_environment(self) -> None:
        """With nothing given the default path is used and may be missing."""
        assert _find(None, {}) == (schema.DEFAULT_CONFIG, False)
        assert _find("", {"IMEXCTL_CONFIG": ""}) == (schema.DEFAULT_CONFIG, False)

    def test_beside_a_relative_slurm_conf(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A relative $SLURM_CONF names imexctl.conf in the same relative directory."""
        monkeypatch.chdir(tmp_path)
        (tmp_path / "imexctl.conf").write_text("")
        assert _find(None, {"SLURM_CONF": "slurm.conf"}) == ("imexctl.conf", True)
        assert _find(None, {"SLURM_CONF": "etc//./slurm.conf"}) == (schema.DEFAULT_CONFIG, False)
