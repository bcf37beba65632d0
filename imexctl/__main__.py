"""``python -m imexctl``."""

from __future__ import annotations

from imexctl.cli import console

console()
