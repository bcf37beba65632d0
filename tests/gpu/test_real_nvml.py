"""NvmlGpu against the real driver: runs only where NVML initialises (``-m gpu``)."""

from __future__ import annotations

import re
from typing import Iterator

import pytest

from imexctl.errors import GpuError
from imexctl.gpu import FabricInfo, NvmlGpu, clique_key

pytestmark = pytest.mark.gpu


def _nvml_works() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # ImportError, NVMLError: no driver here
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.fixture(scope="module")
def gpu_count() -> Iterator[int]:
    """The number of GPUs NVML sees; skips the module where NVML does not initialise."""
    if not _nvml_works():
        pytest.skip("NVML does not initialise here (no NVIDIA driver)")
    import pynvml

    pynvml.nvmlInit()
    try:
        count = int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()
    yield count


def test_fabric_infos_one_entry_per_gpu(gpu_count: int) -> None:
    """NvmlGpu returns one entry per GPU, each None or a well-formed FabricInfo."""
    infos = NvmlGpu().fabric_infos()
    assert len(infos) == gpu_count
    for index, info in enumerate(infos):
        if info is None:
            continue
        assert isinstance(info, FabricInfo) and info.index == index
        assert isinstance(info.cluster_uuid, bytes) and len(info.cluster_uuid) == 16
        assert 0 <= info.state <= 3 and info.status >= 0 and info.clique_id >= 0


def test_fabric_infos_twice_agree(gpu_count: int) -> None:
    """Two queries in a row (init/shutdown each) give the same answer."""
    assert NvmlGpu().fabric_infos() == NvmlGpu().fabric_infos()


def test_clique_key_on_real_hardware(gpu_count: int) -> None:
    """clique_key gives None, a 'uuid.cliqueId' key, or a GpuError naming a GPU; nothing else."""
    infos = NvmlGpu().fabric_infos()
    try:
        key = clique_key(infos)
    except GpuError as exc:
        assert re.match(r"GPU \d+: |GPUs of this tray report several", str(exc)), exc
        return
    if key is not None:
        assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.\d+", key)
        assert any(i is not None and i.cluster_uuid != bytes(16) for i in infos)
