"""A real Alertmanager (Debian's prometheus-alertmanager) with the shipped route, for the alert tests.

tests/test_alerts.py and the booted lab's tests/systemd/test_config_fault.py post the alerts promtool proved
the shipped rules raise, and read back how the shipped route (pkg/prometheus/alertmanager.yml) groups them.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.simhelpers import wait_for
from tests.support.ci import unavailable

__all__ = ["ROUTE", "get", "groups", "running"]

ROUTE = Path(__file__).resolve().parents[2] / "pkg/prometheus/alertmanager.yml"


@contextlib.contextmanager
def running(storage: Path) -> Iterator[str]:
    """Alertmanager with :data:`ROUTE`, its data in ``storage``; its URL (skipped, or failed under CI, without it)."""
    found = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    if found is None:
        unavailable("alertmanager is not installed (Debian's prometheus-alertmanager; bash .ci/setup test installs it)")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = [found, f"--config.file={ROUTE}", f"--storage.path={storage}", f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=", "--log.level=warn"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: get(f"{url}/-/ready") is not None or proc.poll() is not None, 30, 0.1, what="alertmanager")
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def get(url: str) -> Any:
    """A GET's JSON (or its body), None when it cannot be asked."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - a local test server
            body = resp.read()
    except OSError:
        return None
    return json.loads(body) if body.strip().startswith((b"[", b"{")) else body


def groups(url: str, alerts: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Post ``alerts``; Alertmanager's groups as ``{block: [instance, ...]}``, each of one alertname and grouped by
    exactly alertname and block."""
    req = urllib.request.Request(f"{url}/api/v2/alerts", data=json.dumps(alerts).encode(), method="POST",  # noqa: S310
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - a local test server
        assert resp.status == 200
    blocks = {a["labels"].get("block") for a in alerts}
    found = wait_for(lambda: (g := get(f"{url}/api/v2/alerts/groups")) and len(g) == len(blocks) and g,
                     15, 0.2, what="the groups")  # fmt: skip
    assert len({g["labels"]["alertname"] for g in found}) == 1, found
    assert all(set(g["labels"]) == {"alertname", "block"} for g in found), found
    return {g["labels"]["block"]: sorted(a["labels"].get("instance", "") for a in g["alerts"]) for g in found}
