"""The operator documentation stays in sync with the code.

Checks only what cannot drift silently: every config key and default, every
exit code and error code, every log event, every command and option, the
README's quick start against ``.ci/run``, the hook and unit lines quoted in
docs/install.md, and the links between the pages.
"""

from __future__ import annotations

import argparse
import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from imexctl.cli.parser import build_parser
from imexctl.commands import demo, health
from imexctl.config import schema
from imexctl.doctor import run as doctor
from imexctl.imex import config as imexconf
from imexctl.imex.daemon import FORGET_S
from imexctl.platform import errors, logsetup
from imexctl.platform.errors import ExitCode, ImexctlError

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = (
    "install.md",
    "configuration.md",
    "exit-codes.md",
    "events.md",
    "troubleshooting.md",
    "design.md",
    "nvml.md",
    "security.md",
    "topology.md",
    "operations.md",
    "metrics.md",
    "containers.md",
)
SHELL_FENCES = ("sh", "shell", "bash", "console")
# last name parts that make a dotted token a file name, not an event name
FILE_SUFFIXES = frozenset(
    {"cfg", "conf", "d", "json", "log", "lock", "md", "pid", "prom", "py", "service", "sock", "yaml"}
)


def _page(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def _all_docs() -> str:
    return "\n".join(_page(name) for name in PAGES)


def _readme() -> str:
    assert README.is_file(), "README.md is missing"
    return README.read_text(encoding="utf-8")


def _without_fences(text: str) -> str:
    """The text with fenced code blocks blanked out (headings inside them are not headings)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.DOTALL | re.MULTILINE)


def _section(text: str, heading: str, level: int = 2) -> str:
    """The body under the first heading of ``level`` that starts with ``heading``, up to the next one."""
    marks = "#" * level
    lines = text.splitlines()
    body: list[str] = []
    inside = fenced = False
    for line in lines:
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and re.match(rf"^#{{1,{level}}} ", line):
            if inside:
                break
            inside = line.startswith(f"{marks} {heading}")
            continue
        if inside:
            body.append(line)
    assert inside or body, f"no heading {marks} {heading!r}"
    return "\n".join(body)


def _cells(line: str) -> list[str]:
    parts = re.split(r"(?<!\\)\|", line.strip())
    return [p.strip() for p in parts[1:-1]]


def _tables(text: str) -> list[list[list[str]]]:
    """Every Markdown table in ``text`` as rows of cells, header and separator rows dropped."""
    tables: list[list[list[str]]] = []
    current: list[list[str]] = []
    for line in [*_without_fences(text).splitlines(), ""]:
        if line.strip().startswith("|"):
            current.append(_cells(line))
            continue
        if current:
            tables.append(list(current[2:]))
            current = []
    return tables


def _rows(text: str) -> list[list[str]]:
    return [row for table in _tables(text) for row in table]


def _code(value: str) -> str:
    return f"`{value}`"


# ---------------------------------------------------------------- pages


@pytest.mark.parametrize("name", PAGES)
def test_page_exists_and_has_one_title(name: str) -> None:
    text = _without_fences(_page(name))
    assert len(re.findall(r"^# ", text, flags=re.MULTILINE)) == 1


def test_operations_lists_every_doctor_check() -> None:
    """docs/operations.md's doctor table names exactly the checks doctor.CHECK_NAMES lists."""
    rows = _rows(_section(_page("operations.md"), "imexctl doctor"))
    named = {name.strip("`") for row in rows if row for name in row[0].split(", ")}
    assert named == set(doctor.CHECK_NAMES)


# ---------------------------------------------------------------- configuration


CONFIG_KEYS = [(section, key) for section, keys in schema.SCHEMA.items() for key in keys]


def _config_section(section: str) -> str:
    return _section(_page("configuration.md"), f"`[{section}]`")


@pytest.mark.parametrize(("section", "key"), CONFIG_KEYS)
def test_config_key_is_documented_with_its_default(section: str, key: str) -> None:
    rows = {row[0]: row for row in _rows(_config_section(section)) if row}
    assert _code(key) in rows, f"[{section}] {key} is not in docs/configuration.md"
    default = schema.SCHEMA[section][key][0]
    cell = rows[_code(key)][1]
    if default:
        assert _code(default) in cell, f"[{section}] {key}: default {default!r} not in {cell!r}"
    else:
        assert "(empty)" in cell, f"[{section}] {key}: empty default not written as (empty): {cell!r}"


@pytest.mark.parametrize("section", list(schema.SCHEMA))
def test_config_section_documents_no_key_that_does_not_exist(section: str) -> None:
    tables = _tables(_config_section(section))
    assert len(tables) == 1, f"[{section}] should have exactly one table"
    assert [len(row) for row in tables[0]] == [3] * len(tables[0]), "columns: key | default | meaning"
    documented = {row[0] for row in tables[0]}
    assert documented == {_code(k) for k in schema.SCHEMA[section]}


def test_config_sections_are_exactly_the_schema_plus_imex() -> None:
    text = _without_fences(_page("configuration.md"))
    headings = re.findall(r"^## `\[([a-z_]+)\]`", text, flags=re.MULTILINE)
    assert headings == [*schema.SCHEMA, "imex"]


def test_imex_section_lists_allowed_keys_with_what_imexctl_writes() -> None:
    tables = _tables(_config_section("imex"))
    assert len(tables) == 2, "[imex]: a table of allowed keys, then one of owned keys"
    allowed = {row[0]: row for row in tables[0]}
    assert set(allowed) == {_code(k) for k in schema.IMEX_KEYS}
    for key in schema.IMEX_KEYS:
        cell = allowed[_code(key)][1]
        if key not in imexconf.DEFAULTS:
            assert "(not written)" in cell, key
        elif imexconf.DEFAULTS[key]:
            assert _code(imexconf.DEFAULTS[key]) in cell, key
        else:
            assert "(empty)" in cell, key


def test_imex_section_lists_every_owned_key() -> None:
    owned = {row[0] for row in _tables(_config_section("imex"))[1]}
    assert owned == {_code(k) for k in schema.OWNED_IMEX_KEYS}


def test_every_key_of_a_rendered_config_is_documented() -> None:
    text = imexconf.render_config(
        job_id=42,
        port=61042,
        bind_ip="10.0.0.1",
        nodes_path=Path("/run/imexctl/jobs/42/nodes_config.cfg"),
        cmd_port=62042,
        log_file=Path("/var/log/nvidia-imex.log"),
        overrides={},
    )
    written = {line.split("=", 1)[0] for line in text.splitlines() if line and not line.startswith("#")}
    section = _config_section("imex")
    missing = sorted(k for k in written if _code(k) not in section)
    assert not missing, f"config.cfg keys not in docs/configuration.md [imex]: {missing}"


def test_config_lookup_order_is_documented_in_order() -> None:
    text = _section(_page("configuration.md"), "Where imexctl looks")
    wanted = ["--config", "$IMEXCTL_CONFIG", "$SLURM_CONF", str(schema.DEFAULT_CONFIG)]
    positions = [text.find(w) for w in wanted]
    assert -1 not in positions, dict(zip(wanted, positions))
    assert positions == sorted(positions)


# ---------------------------------------------------------------- exit codes


def _exit_rows() -> dict[str, list[str]]:
    return {row[0]: row for row in _rows(_section(_page("exit-codes.md"), "Exit codes")) if row}


@pytest.mark.parametrize("code", list(ExitCode), ids=lambda c: c.name)
def test_exit_code_has_a_row_with_name_and_number(code: ExitCode) -> None:
    rows = _exit_rows()
    assert _code(code.name) in rows, f"{code.name} missing from docs/exit-codes.md"
    assert rows[_code(code.name)][1] == _code(str(int(code)))


def test_exit_code_table_names_no_code_that_does_not_exist() -> None:
    assert set(_exit_rows()) == {_code(c.name) for c in ExitCode}


def _error_classes() -> Iterator[type]:
    for name in errors.__all__:
        obj = getattr(errors, name)
        if isinstance(obj, type) and issubclass(obj, ImexctlError) and obj is not ImexctlError:
            yield obj


def test_every_error_code_has_a_row_with_its_exit_code() -> None:
    rows = {row[0]: row for row in _rows(_section(_page("exit-codes.md"), "Error codes")) if row}
    expected = {_code(cls.code): _code(str(int(cls.exit_code))) for cls in _error_classes()}
    assert set(rows) == set(expected)
    for code, number in expected.items():
        assert rows[code][1] == number, f"{code}: docs say {rows[code][1]}, code says {number}"


def _heading_slugs(name: str) -> list[str]:
    """Every heading's GitHub anchor (before GitHub's ``-1`` for a repeated one), in page order."""
    return [_slug(h) for h in re.findall(r"^#{1,6} (.+)$", _without_fences(_page(name)), flags=re.MULTILINE)]


@pytest.mark.parametrize("code", sorted({cls.code for cls in _error_classes()} | {"crashed"} | set(health.CODES)))
def test_every_code_has_an_anchor_that_is_the_code(code: str) -> None:
    """troubleshooting.md has one heading whose GitHub anchor is exactly the code (``#not_ready``): the alerts'
    runbook_url and health's fixes link there, and a second heading of the same text would make it ``#code-1``."""
    headings = re.findall(r"^#{1,6} (.+)$", _without_fences(_page("troubleshooting.md")), flags=re.MULTILINE)
    assert f"{code}" in [h.strip() for h in headings], f"no heading '### {code}'"
    assert _heading_slugs("troubleshooting.md").count(code) == 1


@pytest.mark.parametrize("name", PAGES)
def test_no_command_forces_a_requeued_job_to_start(name: str) -> None:
    """A requeued job started before cred_expire may run without its domain on a tray (troubleshooting.md): no
    page gives 'StartTime=now' as a command to run; the recovery is to resume the trays and release the job."""
    blocks = re.findall(r"^[ \t]*```.*?^[ \t]*```", _page(name), flags=re.DOTALL | re.MULTILINE)
    assert not [b for b in blocks if "StartTime=now" in b.replace(" ", "")]


def test_operations_lists_every_health_code() -> None:
    """operations.md's health table names exactly the codes imexctl health finds."""
    rows = _rows(_section(_page("operations.md"), "In a node health check"))
    assert [row[0].strip("`") for row in rows if row] == list(health.CODES)


# ---------------------------------------------------------------- events


def test_event_catalogue_is_exactly_log_events() -> None:
    table = _rows(_section(_page("events.md"), "The catalogue"))
    documented = [row[0] for row in table]
    assert len(documented) == len(set(documented)), "an event is listed twice"
    assert set(documented) == {_code(e) for e in logsetup.EVENTS}


def _event_like_tokens(text: str) -> set[str]:
    prefixes = {name.split(".", 1)[0] for name in logsetup.EVENTS}
    found = set()
    for token in re.findall(r"`([a-z_]+(?:\.[a-z_]+)+)`", text):
        parts = token.split(".")
        if parts[0] in prefixes and parts[-1] not in FILE_SUFFIXES:
            found.add(token)
    return found


@pytest.mark.parametrize("name", PAGES)
def test_docs_name_no_event_that_does_not_exist(name: str) -> None:
    unknown = _event_like_tokens(_page(name)) - set(logsetup.EVENTS) - set(doctor.CHECK_NAMES)
    assert not unknown, f"docs/{name} names events that imexctl/platform/logsetup.py does not have: {sorted(unknown)}"


def test_events_page_explains_the_summary_lines_and_destinations() -> None:
    text = _page("events.md")
    for needed in ("prolog.done", "epilog.done", "stderr", "slurmd", str(schema.SCHEMA["paths"]["log_file"][0])):
        assert needed in text


# ---------------------------------------------------------------- commands


def _subcommands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from _subcommands(sub, (*path, name))


PARSER = build_parser()
COMMANDS = [path for path, _ in _subcommands(PARSER)]
OPTIONS = sorted(
    {
        opt
        for p in [PARSER, *(sub for _, sub in _subcommands(PARSER))]
        for a in p._actions
        for opt in a.option_strings
        if opt.startswith("--") and opt != "--help"
    }
)


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_every_command_is_documented(path: tuple[str, ...]) -> None:
    command = "imexctl " + " ".join(path)
    assert command in _readme() + _all_docs(), f"'{command}' appears in neither README.md nor docs/"


@pytest.mark.parametrize("option", OPTIONS)
def test_every_long_option_is_documented(option: str) -> None:
    assert option in _readme() + _all_docs(), f"{option} appears in neither README.md nor docs/"


@pytest.mark.parametrize("fault", sorted(demo.FAULTS))
def test_every_demo_fault_is_named(fault: str) -> None:
    assert re.search(rf"(?<![\w-]){re.escape(fault)}(?![\w-])", _readme() + _all_docs()), fault


# ---------------------------------------------------------------- README quick start


def _shell_blocks(text: str) -> list[list[str]]:
    blocks = re.findall(r"^```([a-z]*)\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)
    return [
        [line.strip() for line in body.splitlines() if line.strip() and not line.strip().startswith("#")]
        for lang, body in blocks
        if lang in SHELL_FENCES
    ]


def _runs_tests(line: str) -> bool:
    """Whether a shell line runs the test suite (pytest itself, or tests/__main__.py's side-by-side runner)."""
    return re.search(r"-m (pytest|tests)\b", line) is not None


def _ci_test_command() -> str:
    lines = (ROOT / ".ci/run").read_text(encoding="utf-8").splitlines()
    commands = [line.strip() for line in lines if _runs_tests(line) and not line.strip().startswith("#")]
    assert len(commands) == 1, f".ci/run should run the tests exactly once: {commands}"
    return commands[0]


def test_readme_quick_start_has_exactly_two_shell_commands() -> None:
    blocks = _shell_blocks(_section(_readme(), "Quick start"))
    assert len(blocks) == 2, f"Quick start should have two shell blocks, has {len(blocks)}"
    assert all(len(b) == 1 for b in blocks), f"each Quick start block should hold one command: {blocks}"
    assert any("imexctl demo" in b[0] for b in blocks), "one Quick start command runs the demo"


def test_readme_test_command_is_what_ci_runs() -> None:
    commands = [b[0] for b in _shell_blocks(_section(_readme(), "Quick start")) if b and _runs_tests(b[0])]
    assert commands == [_ci_test_command()]


# ---------------------------------------------------------------- install.md quotes the shipped files


@pytest.mark.parametrize("hook", ["prolog", "epilog"])
def test_install_quotes_the_hook_command(hook: str) -> None:
    lines = (ROOT / "hooks" / hook).read_text(encoding="utf-8").splitlines()
    exec_lines = [line.strip() for line in lines if line.startswith("exec ")]
    assert len(exec_lines) == 1
    assert exec_lines[0] in _page("install.md")


def test_install_quotes_the_unit_exec_start() -> None:
    unit = (ROOT / "systemd/imexctl-imex@.service").read_text(encoding="utf-8")
    exec_start = [line.strip() for line in unit.splitlines() if line.startswith("ExecStart=")]
    assert len(exec_start) == 1
    assert exec_start[0] in _page("install.md")


def test_install_timeout_advice_matches_the_defaults() -> None:
    """The worst case added up in install.md must stay below the PrologEpilogTimeout it advises."""
    d = {k: float(v[0]) for k, v in schema.SCHEMA["daemon"].items() if k.endswith("_s")}
    r = {k: float(v[0]) for k, v in schema.SCHEMA["readiness"].items() if k.endswith("_s")}
    worst = (
        max(r["deadline_s"], d["lock_timeout_s"] + 10 + d["start_timeout_s"])
        + 2 * r["ctl_timeout_s"]
        + d["stop_timeout_s"]
        + 5
        + 10
        + d["kill_grace_s"]
        + 2
        + FORGET_S
    )
    advised = re.search(r"^PrologEpilogTimeout=(\d+)$", _page("install.md"), flags=re.MULTILINE)
    assert advised is not None
    assert worst < int(advised.group(1))
    assert f"{worst:g} s with the defaults" in _page("install.md")


# ---------------------------------------------------------------- links


def _slug(heading: str) -> str:
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(text: str) -> set[str]:
    plain = _without_fences(text)
    found = {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", plain, flags=re.MULTILINE)}
    found |= set(re.findall(r'<a id="([^"]+)"', plain))
    return found


@pytest.mark.parametrize("name", PAGES)
def test_links_between_pages_resolve(name: str) -> None:
    text = _without_fences(_page(name))
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", target):
            continue
        file_part, _, anchor = target.partition("#")
        path = (DOCS / file_part) if file_part else DOCS / name
        assert path.is_file(), f"docs/{name}: link to missing {target}"
        if anchor and path.suffix == ".md":
            assert anchor in _anchors(path.read_text(encoding="utf-8")), f"docs/{name}: no anchor {target}"


# ---------------------------------------------------------------- design.md: module map and sources


def test_module_map_lists_exactly_the_package_modules() -> None:
    """Every module of imexctl/ with code (sim/ as one row) appears in design.md's module map, and nothing else.

    A folder's ``__init__.py`` that holds only its docstring is no module of its own.
    """
    rows = _rows(_section(_page("design.md"), "Module map"))
    named = {name.strip("`") for row in rows if row for name in row[0].split(", ")}
    package = {
        p.relative_to(ROOT / "imexctl").as_posix()
        for p in (ROOT / "imexctl").rglob("*.py")
        if p.parent.name != "sim"
        and p.relative_to(ROOT / "imexctl").as_posix() not in ("__init__.py", "__main__.py")
        and not (p.name == "__init__.py" and _docstring_only(p))
    }
    assert named == package | {"sim/"}


def _docstring_only(path: Path) -> bool:
    body = ast.parse(path.read_text(encoding="utf-8")).body
    return len(body) == 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)


def test_every_cited_source_is_in_design_md() -> None:
    """Every 'design.md source <key>' cited in the code names a row of design.md's Sources table."""
    keys = {row[0].strip("`") for row in _rows(_section(_page("design.md"), "Sources")) if row}
    cited = set()
    for path in [*(ROOT / "imexctl").rglob("*.py"), *(ROOT / "tests").rglob("*.py")]:
        key = r"(?:[a-z0-9]+-[a-z0-9-]*[a-z0-9]|channels)"
        for match in re.finditer(rf"design\.md sources? ({key}(?:, {key})*)", path.read_text()):
            cited |= set(match.group(1).split(", "))
    assert cited and cited <= keys, sorted(cited - keys)


# ---------------------------------------------------------------- the threat model against its tests


def _test_names(path: str) -> set[str]:
    """The test functions of ``path`` (``Class::test`` for a class's), by the file's syntax tree."""
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            names |= {f"{node.name}::{f.name}" for f in node.body if isinstance(f, ast.FunctionDef)}
            names.add(node.name)
    return names


def _named_tests(cell: str) -> list[tuple[str, str]]:
    """``(file, test)`` for each test a table cell names: ``tests/x.py::test_y``, and bare ``test_z`` after it."""
    out: list[tuple[str, str]] = []
    where = ""
    for match in re.finditer(r"`(tests/[\w/]+\.py)(?:::([\w:]+))?`|`((?:test_|Test)\w+)`", cell):
        if match.group(1):
            where = match.group(1)
            if match.group(2):
                out.append((where, match.group(2)))
        elif where:
            out.append((where, match.group(3)))
    return out


def test_security_threat_model_is_held_to_its_tests() -> None:
    """Each attacker of security.md's "A local user against the hooks" names real tests; each test has a row.

    A row whose test was renamed or removed, and an attacker test without a row (issue 41), fail here.
    """
    rows = _rows(_section(_page("security.md"), "A local user against the hooks"))
    assert rows and all(len(row) == 4 for row in rows), rows
    named: set[tuple[str, str]] = set()
    for what, _, stops, tests in rows:
        found = _named_tests(tests)
        assert found, f"no test named for: {what[:80]}"
        assert stops.strip(), f"no defence named for: {what[:80]}"
        named |= set(found)
    missing = sorted(f"{path}::{name}" for path, name in named if name not in _test_names(path))
    assert not missing, f"security.md names tests that do not exist: {missing}"
    attackers = {name for name in _test_names("tests/test_local_user.py") if name.startswith("test_")}
    unrowed = sorted(attackers - {name for path, name in named if path == "tests/test_local_user.py"})
    assert not unrowed, f"tests/test_local_user.py tests without a row in security.md: {unrowed}"
