"""Tray addresses from slurm.conf's node lines (``[resolve] method = slurm_conf``).

slurmd and slurmctld reach a node at its ``NodeAddr`` (which defaults to
``NodeHostname``, which defaults to ``NodeName``; slurm.conf(5)), and Slurm
requires slurm.conf to be the same on every node: so every tray reads the
same addresses.  ``NodeName`` and ``NodeAddr`` may both be host lists, paired
in order (``NodeName=gb[01-18] NodeAddr=10.0.0.[1-18]``), as Slurm expands
them (``src/common/read_config.c``: the counts must match).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from imexctl.platform.errors import ConfigError, NodeListError
from imexctl.slurm import conf as slurmconf
from imexctl.slurm import nodelist

__all__ = ["CONFIGLESS", "addresses", "conf_path", "node_names", "read"]

#: where slurmd keeps the slurm.conf it fetched in configless mode (design.md source slurm-configless),
#: newest layout first; taken under ``[paths] root``
CONFIGLESS: Final = ("/run/slurm/conf/slurm.conf", "/var/spool/slurmd/conf-cache/slurm.conf")


def conf_path(slurm_conf: str, root: Path) -> Path:
    """The slurm.conf slurmd uses: the job's ``$SLURM_CONF``, else the configless cache.

    Raises:
        ConfigError: neither is there.
    """
    if slurm_conf:
        return Path(slurm_conf)
    for candidate in CONFIGLESS:
        path = root / candidate.lstrip("/")
        if path.is_file():
            return path
    raise ConfigError(
        "[resolve] method = slurm_conf: the job has no SLURM_CONF and there is no configless copy "
        f"({' or '.join(CONFIGLESS)}); set SLURM_CONF for slurmd or use [resolve] method = dns"
    )


def read(path: Path) -> dict[str, str]:
    """Every node of the slurm.conf at ``path`` (and its includes) with its address text.

    Raises:
        ConfigError: the file cannot be read, or a node line is inconsistent.
    """
    return addresses(slurmconf.read(path))


def node_names(conf: slurmconf.SlurmConf) -> tuple[str, ...]:
    """Every node of the node lines, in Slurm's own order: the lines in file order, each host list expanded.

    That is the order of slurmctld's node table (a node defined twice counts
    where it first appears); ``NodeName=DEFAULT`` lines name no node.

    Raises:
        ConfigError: a bad host list.
    """
    names: dict[str, None] = {}
    for kind, raw in conf.records:
        rec = {k.lower(): v for k, v in raw.items()}
        if kind == "nodename" and rec["nodename"].upper() != "DEFAULT":
            names.update(dict.fromkeys(_expand(conf.path, "NodeName", rec["nodename"])))
    return tuple(names)


def addresses(conf: slurmconf.SlurmConf) -> dict[str, str]:
    """``{node: NodeAddr}`` from the node lines; NodeHostname, then the name itself, where NodeAddr is unset.

    ``NodeName=DEFAULT`` lines are skipped (an address is no default).

    Raises:
        ConfigError: a bad host list, counts that do not pair, or a node defined twice.
    """
    out: dict[str, str] = {}
    for kind, raw in conf.records:
        if kind != "nodename":
            continue
        rec = {k.lower(): v for k, v in raw.items()}
        if rec["nodename"].upper() == "DEFAULT":
            continue
        names = _expand(conf.path, "NodeName", rec["nodename"])
        key = next((k for k in ("NodeAddr", "NodeHostname") if rec.get(k.lower())), "")
        addrs = _expand(conf.path, key, rec[key.lower()]) if key else names
        if len(addrs) != len(names):
            raise ConfigError(
                f"{conf.path}: NodeName={rec['nodename']} names {len(names)} nodes but "
                f"{key}={rec[key.lower()]} gives {len(addrs)} (Slurm pairs them in order; the counts must match)"
            )
        for name, addr in zip(names, addrs):
            if name in out:
                raise ConfigError(f"{conf.path}: node {name} is defined twice")
            out[name] = addr
    return out


def _expand(path: Path, key: str, text: str) -> list[str]:
    try:
        return nodelist.expand(text)
    except NodeListError as exc:
        raise ConfigError(f"{path}: {key}={text}: {exc}") from exc
