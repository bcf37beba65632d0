"""This tray's NVLink fabric identity, for ``imexctl topology`` and ``imexctl status``; the key syntax.

A tray's NVLink domain key is ``<clusterUuid>.<cliqueId>`` as NVML reports it
(:func:`imexctl.gpu.fabric.clique_key`; design.md source nvml-clique).  The report
never waits for a pending registration and never judges health by policy: it
shows what NVML says now, per GPU and for the tray.  A failed NVML read is an
error, never "no fabric" (docs/nvml.md).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from imexctl.gpu import nvml
from imexctl.gpu.fabric import STATE_COMPLETED, FabricInfo, Gpu, clique_key
from imexctl.platform import Record
from imexctl.platform.errors import GpuError

if TYPE_CHECKING:
    from imexctl.platform.output import JsonObject

__all__ = ["NO_FABRIC", "GpuReport", "TrayFabric", "parse_key", "read_tray", "render_text"]

NO_FABRIC = "no multi-node NVLink fabric"
_CLIQUE_MAX = 0xFFFFFFFF  # cliqueId is an unsigned int in nvml.h
_UUID_TEXT_LEN = 36


def parse_key(text: str) -> str:
    """The canonical key (lower-case UUID) of ``<clusterUuid>.<cliqueId>``.

    Raises:
        ValueError: saying what is wrong with ``text``.
    """
    import uuid

    cluster, dot, clique = text.rpartition(".")
    if not dot:
        raise ValueError(f"{text!r} is not <clusterUuid>.<cliqueId>")
    try:
        parsed = uuid.UUID(cluster)
    except ValueError:
        parsed = None
    if parsed is None or len(cluster) != _UUID_TEXT_LEN or cluster.count("-") != 4:
        raise ValueError(f"{cluster!r} is not a cluster UUID like 4f2a9c1e-5d6b-4e8f-9a0b-1c2d3e4f5a6b")
    if parsed.int == 0:
        raise ValueError("an all-zero cluster UUID is not a multi-node NVLink fabric")
    if not (clique.isascii() and clique.isdigit()) or int(clique) > _CLIQUE_MAX:
        raise ValueError(f"clique id {clique!r} is not a number from 0 to {_CLIQUE_MAX}")
    return f"{parsed}.{int(clique)}"


class GpuReport(Record):
    """One GPU as the report shows it; None where NVML gave nothing (a GPU without fabric support)."""

    gpu: int
    state: str
    status: str | None
    cluster_uuid: str | None
    clique_id: int | None
    layout: str | None
    health: str
    health_summary: str | None
    health_problems: tuple[str, ...]
    health_mask: int | None

    def data(self) -> JsonObject:
        """The GPU's object in ``topology --json``'s ``gpus``: every key always present."""
        return {**self._asdict(), "health_problems": list(self.health_problems)}


@dataclasses.dataclass(frozen=True)
class TrayFabric:
    """What NVML says about this tray: its key, or why there is none, and every GPU.

    Exactly one of ``key``, ``reason`` (no fabric) and ``error`` (NVML failed,
    or the fabric is not usable) is set.
    """

    node: str
    key: str | None
    reason: str
    error: str
    health: str
    gpus: tuple[GpuReport, ...]
    nvml: dict[str, str] | None

    @property
    def fabric(self) -> str:
        """``nvlink`` (a key), ``none`` (no multi-node fabric) or ``error``."""
        return "error" if self.error else "nvlink" if self.key else "none"

    def data(self) -> JsonObject:
        """The ``data`` object of ``imexctl topology --json`` (docs/topology.md)."""
        return {
            "node": self.node,
            "fabric": self.fabric,
            "key": self.key,
            "reason": self.reason,
            "error": self.error,
            "health": self.health,
            "gpus": [g.data() for g in self.gpus],
            "nvml": self.nvml,
        }


def read_tray(gpu: Gpu, node: str) -> TrayFabric:
    """Ask NVML once (no wait) and describe the tray; NVML failures become ``error``, never raise."""
    try:
        infos = gpu.fabric_infos()
    except GpuError as exc:
        return TrayFabric(node, None, "", str(exc), "", (), _versions(gpu))
    gpus = tuple(_gpu(index, info) for index, info in enumerate(infos))
    try:
        key = clique_key(infos)
    except GpuError as exc:
        return TrayFabric(node, None, "", str(exc), "", gpus, _versions(gpu))
    if key is None:
        return TrayFabric(node, None, _no_fabric_reason(infos), "", "", gpus, _versions(gpu))
    members = [i for i in infos if i is not None and i.state == STATE_COMPLETED and i.cluster_uuid != bytes(16)]
    return TrayFabric(node, key, "", "", tray_health(members), gpus, _versions(gpu))


def _versions(gpu: Gpu) -> dict[str, str] | None:
    versions = getattr(gpu, "versions", None)
    if versions is None:
        return None
    return {"nvidia_ml_py": str(versions.python), "driver": str(versions.driver)}


def _gpu(index: int, info: FabricInfo | None) -> GpuReport:
    """One GPU for the report."""
    if info is None:
        state = nvml.STATE_NAMES[nvml.STATE_NOT_SUPPORTED]
        return GpuReport(index, state, None, None, None, None, "", None, (), None)
    import uuid

    health = info.health
    return GpuReport(
        info.gpu,
        info.state_name,
        nvml.return_name(info.status),
        str(uuid.UUID(bytes=info.cluster_uuid)),
        info.clique_id,
        info.layout,
        health.text(),
        health.summary or None,
        tuple(health.problems),
        info.health_mask,
    )


def _no_fabric_reason(infos: list[FabricInfo | None]) -> str:
    if not infos:
        return "NVML reports no GPU"
    if all(i is None or i.state == nvml.STATE_NOT_SUPPORTED for i in infos):
        return "no GPU supports the NVLink fabric (NVML: NOT_SUPPORTED)"
    return "the GPUs are registered with an all-zero cluster UUID (not part of a multi-node NVLink domain)"


def tray_health(members: list[FabricInfo]) -> str:
    """The worst health among the GPUs that form the key, with the GPUs it applies to."""
    ranked: dict[str, list[int]] = {}
    for info in members:
        ranked.setdefault(info.health.text(), []).append(info.gpu)
    if not ranked:
        return ""
    worst = max(ranked, key=_health_rank)
    gpus = ranked[worst]
    where = "all GPUs" if len(gpus) == len(members) else "GPU " + ", ".join(str(g) for g in gpus)
    return f"{worst} ({where})"


def _health_rank(text: str) -> tuple[int, str]:
    order = ("UNHEALTHY", "LIMITED_CAPACITY", "UNKNOWN", "HEALTHY:", "no health summary:")
    for rank, head in enumerate(order):
        if text.startswith(head):
            return (len(order) - rank, text)
    return (0, text)


def render_text(tray: TrayFabric) -> str:
    """The human form of ``imexctl topology``."""
    lines = [f"node: {tray.node}"]
    if tray.key:
        lines += [f"NVLink domain: {tray.key}", f"fabric health: {tray.health}"]
    elif tray.error:
        lines.append(f"NVLink domain: unknown ({tray.error})")
    else:
        lines.append(f"NVLink domain: none ({NO_FABRIC}: {tray.reason})")
    if tray.gpus:
        lines.append(_row("GPU", "state", "status", "clique", "cluster UUID", "health"))
    for g in tray.gpus:
        status = (g.status or "-").removeprefix("NVML_")
        clique = "-" if g.clique_id is None else str(g.clique_id)
        lines.append(_row(str(g.gpu), g.state, status, clique, g.cluster_uuid or "-", g.health or "-"))
    return "\n".join(lines) + "\n"


def _row(gpu: str, state: str, status: str, clique: str, cluster: str, health: str) -> str:
    return f"{gpu:>3}  {state:<13}  {status:<21}  {clique:<10}  {cluster:<36}  {health}"
