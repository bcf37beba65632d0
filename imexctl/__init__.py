"""imexctl: give every Slurm job its own NVIDIA IMEX domain."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
