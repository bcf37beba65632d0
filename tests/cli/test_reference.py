"""reference: the man page from the argparse definitions and the shipped default config from the schema."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from pathlib import Path

import pytest

from imexctl import __version__
from imexctl.cli import reference
from imexctl.cli.parser import build_parser
from imexctl.config import schema, settings
from imexctl.platform.errors import ExitCode
from tests.support.ci import need_tools


@pytest.fixture
def man_and_groff() -> None:
    need_tools("man", "groff", how="Debian's man-db and groff-base; bash .ci/setup test installs them")


def _commands(parser, path=("imexctl",)):
    for name, _help, sub in reference._subparsers(parser):
        yield (*path, name), sub
        yield from _commands(sub, (*path, name))


PARSER = build_parser()
COMMANDS = list(_commands(PARSER))


@pytest.fixture(scope="module")
def page() -> str:
    return reference.man_page()


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=" ".join)
def test_man_page_has_a_section_per_command(page: str, path: tuple[str, ...]) -> None:
    """Every command and subcommand of the parser has its own .SS heading."""
    assert f'.SS "{reference._roff(" ".join(path))}"' in page  # roff escapes the hyphen of task-prolog


@pytest.mark.parametrize(
    ("path", "option"),
    [
        (p, o)
        for p, sub in [(("imexctl",), PARSER), *COMMANDS]
        for a in sub._actions
        for o in a.option_strings
        if o not in {"-h", "--help"}
    ],
    ids=lambda v: " ".join(v) if isinstance(v, tuple) else v,
)
def test_man_page_lists_every_option(page: str, path: tuple[str, ...], option: str) -> None:
    """Every option of every command is in the page, escaped for roff, after its command's heading."""
    heading = page.index(f'.SS "{reference._roff(" ".join(path))}"') if len(path) > 1 else 0
    assert f"\\fB{option.replace('-', chr(92) + '-')}\\fR" in page[heading:]


def test_man_page_lists_every_exit_code(page: str) -> None:
    """The EXIT STATUS section has every ExitCode with its number and meaning."""
    status = page.split(".SH EXIT STATUS", 1)[1].split(".SH", 1)[0]
    for code in ExitCode:
        assert f"\\fB{int(code)}\\fR ({code.name})" in status


@pytest.mark.usefixtures("man_and_groff")
def test_man_page_renders_without_warnings(page: str, tmp_path: Path) -> None:
    """man renders the page with no roff warnings, and the text shows a command and an option."""
    src = tmp_path / "imexctl.8"
    src.write_text(page)
    done = subprocess.run(
        ["man", "--warnings", "-l", str(src)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, "MANWIDTH": "100", "MAN_KEEP_FORMATTING": "0"},
    )
    text = re.sub(".\x08", "", done.stdout)  # bold and underline by overstriking
    assert done.stderr == ""
    assert "imexctl doctor" in text and "--slurm-conf FILE" in text


def test_roff_escapes_leading_dots_and_backslashes() -> None:
    """A help text starting with a dot cannot become a roff request."""
    assert reference._roff(".x a-b \\n") == "\\&.x a\\-b \\en"


CONFFILE = Path(__file__).resolve().parents[2] / "pkg/imexctl.conf"


@pytest.mark.parametrize("text", [pytest.param(CONFFILE, id="conffile"), pytest.param(None, id="example")])
def test_shipped_config_loads_to_the_defaults(tmp_path: Path, text: Path | None) -> None:
    """The shipped conffile and the example change nothing: each loads to exactly the built-in defaults."""
    path = tmp_path / "imexctl.conf"
    path.write_text(text.read_text() if text else reference.default_config())
    path.chmod(0o644)
    loaded = settings.load(path, node="gb01")
    defaults = settings.load(None, node="gb01")
    assert loaded._replace(source=None) == defaults


def test_conffile_names_no_release_and_no_default() -> None:
    """/etc/imexctl/imexctl.conf is a fixed text: no version, no key, no default that a release could change."""
    text = CONFFILE.read_text()
    assert not re.search(r"\d+\.\d+\.\d+", text)
    keys = {key for keys in schema.SCHEMA.values() for key in keys} - {"deadline_s"}  # the example in the prose
    assert not [line for line in text.splitlines() if line.lstrip("# ").split(" =")[0] in keys]
    assert "/usr/share/imexctl/imexctl.conf.example" in text


#: pkg/imexctl.conf's sha256. Every release that changes the conffile makes dpkg stop at its prompt
#: on each node whose copy was edited (or, told to keep it, leave the new text as .dpkg-dist), and
#: rpm write an .rpmnew: change the file only on purpose, then this value, and say so in the release notes.
CONFFILE_SHA256 = "22dd957a539e25237d07194417c4957b7d2b5e1fa3a98c6d949d87f2258ec6fc"


def test_conffile_changes_only_on_purpose() -> None:
    """The shipped conffile is the reviewed text: any change to it is a deliberate one."""
    assert hashlib.sha256(CONFFILE.read_bytes()).hexdigest() == CONFFILE_SHA256


def test_example_config_carries_no_version() -> None:
    """The example follows the defaults but not the version number."""
    assert __version__ not in reference.default_config()


def test_default_config_shows_every_key_commented_at_its_default() -> None:
    """Every key of every section is there as '#key = default', under its section; no key is set."""
    text = reference.default_config()
    sections = re.split(r"^\[(\w+)\]$", text, flags=re.MULTILINE)
    bodies = dict(zip(sections[1::2], sections[2::2]))
    assert list(bodies) == [*schema.SCHEMA, "imex"]
    for name, keys in schema.SCHEMA.items():
        for key, (default, _parse) in keys.items():
            assert f"\n#{key} = {default}".rstrip() + "\n" in bodies[name], (name, key)
    assert not [line for line in text.splitlines() if line and not line.startswith(("#", "["))]


def test_module_entry_point(capsys: pytest.CaptureFixture[str]) -> None:
    """python -m imexctl.cli.reference prints the page or the config, and refuses anything else with 64."""
    assert reference.main(["man"]) == 0 and capsys.readouterr().out.startswith(".TH IMEXCTL 8")
    assert reference.main(["config"]) == 0 and "[metrics]" in capsys.readouterr().out
    assert reference.main(["html"]) == 64


CONFIGURATION_MD = (Path(__file__).resolve().parents[2] / "docs/configuration.md").read_text()


@pytest.fixture(scope="module")
def conf_page() -> str:
    return reference.config_man_page(CONFIGURATION_MD)


@pytest.mark.parametrize(
    ("section", "key"), [(s, k) for s, keys in schema.SCHEMA.items() for k in keys], ids="{}".format
)
def test_conf_man_page_has_every_key_with_its_default_and_meaning(conf_page: str, section: str, key: str) -> None:
    """imexctl.conf(5) lists each key under its section, with the schema's default and a meaning."""
    default = schema.SCHEMA[section][key][0]
    body = conf_page.split(f'.SH "[{section}]"', 1)[1].split(".SH", 1)[0]
    shown = f" = \\fI{reference._roff(default)}\\fR" if default else " (default: empty)"
    entry = body.split(f".TP\n\\fB{reference._roff(key)}\\fR{shown}\n", 1)
    assert len(entry) == 2, (section, key)
    assert entry[1].split("\n", 1)[0].strip(), f"{section}.{key} has no meaning in docs/configuration.md"


def test_conf_man_page_sections_follow_the_schema(conf_page: str) -> None:
    """One .SH per schema section, in the file's order, then [imex] with NVIDIA's keys."""
    headings = re.findall(r'^\.SH "\[(\w+)\]"$', conf_page, flags=re.MULTILINE)
    assert headings == [*schema.SCHEMA, "imex"]
    assert "\\fBLOG_LEVEL\\fR" in conf_page.split('.SH "[imex]"', 1)[1]


@pytest.mark.usefixtures("man_and_groff")
def test_conf_man_page_renders_without_warnings(conf_page: str, tmp_path: Path) -> None:
    """man renders imexctl.conf(5) with no roff warnings."""
    src = tmp_path / "imexctl.conf.5"
    src.write_text(conf_page)
    done = subprocess.run(
        ["man", "--warnings", "-l", str(src)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, "MANWIDTH": "100", "MAN_KEEP_FORMATTING": "0"},
    )
    text = re.sub(".\x08", "", done.stdout)
    assert done.stderr == ""
    assert "deadline_s = 60" in text


def test_module_entry_point_writes_the_conf_page(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """python -m imexctl.cli.reference conf-man MD prints imexctl.conf(5)."""
    md = tmp_path / "configuration.md"
    md.write_text(CONFIGURATION_MD)
    assert reference.main(["conf-man", str(md)]) == 0
    assert capsys.readouterr().out.startswith(".TH IMEXCTL.CONF 5")
