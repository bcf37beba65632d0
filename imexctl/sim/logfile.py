"""The simulated daemon's log, in the real line format (design.md source imex-log).

``[Mar 27 2025 15:47:10] [INFO] [tid 39] <message>``
"""

from __future__ import annotations

import sys
import threading
import time
from typing import IO, Final

from imexctl.sim.formats import format_timestamp

__all__ = ["SimLog"]

# LOG_LEVEL: 0 = off, 1 = CRITICAL+, 2 = ERROR+, 3 = WARNING+, 4 = INFO+ (design.md source imex-config);
# 5 = DEBUG (sim only).
_LEVELS: Final = {"CRITICAL": 1, "ERROR": 2, "WARNING": 3, "INFO": 4, "DEBUG": 5}


class SimLog:
    """Writes log lines to the log file, or to stderr when there is none."""

    def __init__(self, stream: IO[str], level: int = 4) -> None:
        self.stream = stream
        self.level = level

    @classmethod
    def open(cls, file_name: str, level: int, append: bool) -> SimLog:
        """Open ``file_name`` (empty or unopenable: stderr) and write the banner line."""
        stream: IO[str] = sys.stderr
        problem = ""
        if file_name:
            try:
                stream = open(file_name, "a" if append else "w", encoding="utf-8")  # noqa: SIM115 # kept open
            except OSError as exc:
                problem = f"Unable to open log file {file_name} ({exc.strerror}), logging to console"
        log = cls(stream, level)
        log.raw(f"IMEX Log initializing at: {format_timestamp()}")
        if problem:
            log.warning(problem)
        return log

    def close(self) -> None:
        """Close the log file (stderr stays open)."""
        if self.stream is not sys.stderr:
            self.stream.close()

    def raw(self, text: str) -> None:
        """Write one line as is."""
        try:
            self.stream.write(text + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass  # a log that cannot be written must not take the daemon down

    def emit(self, tag: str, message: str) -> None:
        """Write one line if ``tag`` passes LOG_LEVEL."""
        if _LEVELS[tag] > self.level:
            return
        stamp = time.strftime("%b %d %Y %H:%M:%S")
        self.raw(f"[{stamp}] [{tag}] [tid {threading.get_native_id()}] {message}")

    def critical(self, message: str) -> None:
        """Log at CRITICAL."""
        self.emit("CRITICAL", message)

    def error(self, message: str) -> None:
        """Log at ERROR."""
        self.emit("ERROR", message)

    def warning(self, message: str) -> None:
        """Log at WARNING."""
        self.emit("WARNING", message)

    def info(self, message: str) -> None:
        """Log at INFO."""
        self.emit("INFO", message)

    def debug(self, message: str) -> None:
        """Log at DEBUG (LOG_LEVEL=5, a simulator extension)."""
        self.emit("DEBUG", message)
