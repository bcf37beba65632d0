"""Generated reference files: the man page from the argparse definitions, the default config from the schema.

The packages build both at build time (``python3 -m imexctl.cli.reference man``
and ``... config``), so neither can drift from the code; tests/cli/test_reference.py
checks that every command, option, exit code and key is in them.  Never on
the hook path.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterator, Sequence

from imexctl import __version__
from imexctl.config import schema

__all__ = ["config_man_page", "config_meanings", "default_config", "main", "man_page"]

_FILES = (
    ("/etc/imexctl/imexctl.conf", "the configuration (as shipped it sets nothing; every key: imexctl.conf(5))"),
    ("/usr/share/imexctl/imexctl.conf.example", "every key of the configuration, commented out at its default"),
    ("/run/imexctl/jobs/<job id>/", "each job's config.cfg, nodes_config.cfg and state.json"),
    ("/var/log/imexctl.log", "imexctl's log, one JSON object per line"),
    ("/usr/share/imexctl/hooks/", "the prolog and epilog scripts for slurm.conf's Prolog= and Epilog="),
    (
        "/usr/share/imexctl/hooks/task-prolog, enroot/99-imexctl.sh",
        "the optional TaskProlog= and the enroot hook for /etc/enroot/hooks.d (docs/containers.md)",
    ),
    ("/opt/imexctl/", "imexctl and its Python dependencies (the packages)"),
)


def _roff(text: str) -> str:
    """Escape text for roff: backslashes, hyphens, and a leading dot or quote."""
    out = text.replace("\\", "\\e").replace("-", "\\-")
    return "\\&" + out if out[:1] in (".", "'") else out


def _subparsers(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """``(name, help, parser)`` of each subcommand, in definition order."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name, ""), sub


def _usage(action: argparse.Action) -> str:
    """The option with its argument (``--job ID``), or a positional (``EXPR...``), in roff."""
    meta = action.metavar if isinstance(action.metavar, str) else action.dest.upper()
    if action.option_strings:
        names = ", ".join(f"\\fB{_roff(o)}\\fR" for o in action.option_strings)
        takes = action.nargs != 0 and not isinstance(action, argparse._VersionAction)
        return f"{names} \\fI{_roff(meta)}\\fR" if takes else names
    more = "..." if action.nargs in ("+", "*") else ""
    return f"\\fI{_roff(meta)}\\fR{more}"


def _options(parser: argparse.ArgumentParser) -> list[str]:
    lines: list[str] = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        lines += [".TP", _usage(action), _roff(action.help or "")]
    return lines


def _commands(parser: argparse.ArgumentParser, path: str) -> list[str]:
    lines: list[str] = []
    for name, help_text, sub in _subparsers(parser):
        full = f"{path} {name}"
        lines += [f'.SS "{_roff(full)}"', _roff(help_text) + ("." if help_text else "")]
        if sub.description:
            lines += [".PP", _roff(sub.description)]
        lines += _options(sub)
        lines += _commands(sub, full)
    return lines


def man_page(parser: argparse.ArgumentParser | None = None) -> str:
    """imexctl(8) in roff, from :mod:`imexctl.cli.parser` (the one source of commands and options)."""
    from imexctl.cli.parser import build_parser
    from imexctl.platform.errors import ExitCode

    parser = parser or build_parser()
    lines = [
        f'.TH IMEXCTL 8 "" "imexctl {__version__}" "System Administration"',
        ".SH NAME",
        "imexctl \\- " + _roff((parser.description or "").rstrip(".")),
        ".SH SYNOPSIS",
        ".B imexctl",
        "[\\fB\\-\\-config\\fR \\fIFILE\\fR] [\\fB\\-v\\fR] \\fICOMMAND\\fR [\\fIOPTIONS\\fR]",
        ".SH DESCRIPTION",
        "imexctl gives each Slurm job its own NVIDIA IMEX domain on GB200/GB300 NVL72 racks, from slurmd's",
        "Prolog= and Epilog=, and checks, shows and cleans a tray for administrators.",
        ".SH OPTIONS",
        *_options(parser),
        ".SH COMMANDS",
        *_commands(parser, "imexctl"),
        ".SH EXIT STATUS",
    ]
    for code in ExitCode:
        lines += [".TP", f"\\fB{int(code)}\\fR ({code.name})", _roff(code.meaning)]
    lines.append(".SH FILES")
    for path, what in _FILES:
        lines += [".TP", f"\\fI{_roff(path)}\\fR", _roff(what)]
    lines += [
        ".SH SEE ALSO",
        "\\fBimexctl.conf\\fR(5), \\fBslurm.conf\\fR(5), \\fBslurmd\\fR(8), \\fBsystemctl\\fR(1);",
    ]
    lines.append("/usr/share/doc/imexctl/README.md and /usr/share/doc/imexctl/docs/ (install.md, operations.md, ...).")
    return "\n".join(lines) + "\n"


def _markdown_text(cell: str) -> str:
    """A cell of a Markdown table as plain text for roff: no code marks, emphasis or link targets."""
    text = re.sub(r"\[([^\]]+)\]\([^)]*\)", r"\1", cell)
    text = text.replace("*(empty)*", "(empty)").replace("`", "").replace("<sup>", "^").replace("</sup>", "")
    return re.sub(r"\*([^*]+)\*", r"\1", text).strip()


def config_meanings(configuration_md: str) -> dict[str, dict[str, str]]:
    """``{section: {key: meaning}}`` from docs/configuration.md's key tables (the first table of each section)."""
    out: dict[str, dict[str, str]] = {}
    for part in re.split(r"^## `\[", configuration_md, flags=re.MULTILINE)[1:]:
        name, _, body = part.partition("]`")
        rows = out.setdefault(name, {})
        table = body.split("| key |", 1)[1].split("\n\n", 1)[0] if "| key |" in body else ""
        for line in table.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            if len(cells) >= 3 and cells[0].startswith("`"):  # key, default, meaning
                rows[cells[0].strip("`")] = _markdown_text(" | ".join(cells[2:]))
    return out


def config_man_page(configuration_md: str) -> str:
    """imexctl.conf(5) in roff: every section and key of the schema with its default and meaning.

    The meanings come from docs/configuration.md, whose keys and defaults
    tests/test_docs.py holds to the schema.
    """
    from imexctl.config import settings

    meanings = config_meanings(configuration_md)
    lines = [
        f'.TH IMEXCTL.CONF 5 "" "imexctl {__version__}" "File Formats"',
        ".SH NAME",
        "imexctl.conf \\- configuration of imexctl, per-job NVIDIA IMEX domains for Slurm",
        ".SH DESCRIPTION",
        "An INI file of [section] lines and key = value lines; comments are lines of their own that start with",
        "# or ;. Every key is optional: a key that is not set has the default shown below. The file must be",
        "owned by root and not writable by group or others. imexctl doctor and imexctl status check a change.",
        "Where imexctl looks for the file: docs/configuration.md and imexctl(8), option \\fB\\-\\-config\\fR.",
    ]
    for name, keys in schema.SCHEMA.items():
        doc = _markdown_text(re.sub(r":\w+:`~?([^`]+)`", r"\1", (settings.SECTIONS[name].__doc__ or "").strip()))
        lines += [f'.SH "[{name}]"', _roff(doc.splitlines()[0] if doc else "")]
        for key, (default, _parse) in keys.items():
            shown = f" = \\fI{_roff(default)}\\fR" if default else " (default: empty)"
            lines += [".TP", f"\\fB{_roff(key)}\\fR{shown}", _roff(meanings.get(name, {}).get(key, ""))]
    lines += ['.SH "[imex]"', "Keys of NVIDIA's config.cfg that imexctl passes on to every job's daemon:"]
    for key, meaning in meanings.get("imex", {}).items():
        lines += [".TP", f"\\fB{_roff(key)}\\fR", _roff(meaning)]
    lines += [".SH FILES", ".TP", "\\fI/etc/imexctl/imexctl.conf\\fR", "the configuration; as shipped it sets nothing"]
    lines += [".TP", "\\fI/usr/share/imexctl/imexctl.conf.example\\fR", "every key, commented out at its default"]
    lines += [".SH SEE ALSO", "\\fBimexctl\\fR(8); /usr/share/doc/imexctl/docs/configuration.md."]
    return "\n".join(lines) + "\n"


def default_config() -> str:
    """``/usr/share/imexctl/imexctl.conf.example``: every section, every key commented out at its default.

    Not the conffile: ``/etc/imexctl/imexctl.conf`` is ``pkg/imexctl.conf``, a
    text that does not change with the release (a conffile that changes makes
    an upgrade of a node with an edited config stop at dpkg's prompt).  This
    one follows the defaults, so it carries no version either.
    """
    from imexctl.config import settings

    lines = [
        "# imexctl configuration: every key, commented out at its built-in default.",
        "# Copy a key into /etc/imexctl/imexctl.conf under its [section] line, without the '#', to change it.",
        "# Keep comments on lines of their own. Every key: man 5 imexctl.conf. Check a change: imexctl doctor",
    ]
    for name, keys in schema.SCHEMA.items():
        doc = (settings.SECTIONS[name].__doc__ or "").strip().splitlines()[0]
        doc = re.sub(r":\w+:`~?([^`]+)`", r"\1", doc).replace("``", "")
        lines += ["", f"# {doc}", f"[{name}]"]
        lines += [f"#{key} = {default}".rstrip() for key, (default, _parse) in keys.items()]
    lines += ["", "# [imex]: keys of NVIDIA's config.cfg passed on to every job's daemon, e.g.", "[imex]"]
    lines += ["#LOG_LEVEL = 4"]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m imexctl.cli.reference man|config|conf-man MD``: print one of the generated files."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["man"]:
        sys.stdout.write(man_page())
    elif args == ["config"]:
        sys.stdout.write(default_config())
    elif len(args) == 2 and args[0] == "conf-man":  # the command and docs/configuration.md
        with open(args[1], encoding="utf-8") as md:
            sys.stdout.write(config_man_page(md.read()))
    else:
        sys.stderr.write("usage: python -m imexctl.cli.reference man|config|conf-man CONFIGURATION_MD\n")
        return 64
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
