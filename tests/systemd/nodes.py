"""What the booted-node tests share: the nodes, their job units, putting a node back."""

from __future__ import annotations

from tests.lab.sysd import SystemdLab

__all__ = ["NODES", "UNITS", "leftover_units", "restore", "retire_stock"]

NODES = ["node1", "node2"]
UNITS = "imexctl-imex@*"


def leftover_units(lab: SystemdLab) -> dict[str, list[str]]:
    """The job units systemd still has loaded, per node (none after a clean epilog)."""
    return {n: units for n in NODES if (units := lab.node(n).units(UNITS))}


def retire_stock(lab: SystemdLab, node: str) -> None:
    """Stop and mask the stock unit again, as docs/install.md leaves it."""
    m = lab.node(node)
    m.exec(["systemctl", "stop", "nvidia-imex.service"], check=False)
    m.exec(["systemctl", "mask", "nvidia-imex.service"], check=False)


def restore(lab: SystemdLab, node: str) -> None:
    """Put a node back as docs/install.md leaves it: stock unit stopped and masked, no job unit loaded."""
    retire_stock(lab, node)
    m = lab.node(node)
    for unit in m.units(UNITS):
        m.exec(["systemctl", "stop", unit], check=False, timeout=30)
        m.exec(["systemctl", "reset-failed", unit], check=False)
    lab.imexctl(node, "cleanup", "--force")
