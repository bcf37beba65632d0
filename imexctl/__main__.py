"""``python -m imexctl``."""

from __future__ import annotations

import sys

from imexctl.cli import main

sys.exit(main())
