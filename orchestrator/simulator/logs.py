"""SGLang's log lines: `[%Y-%m-%d %H:%M:%S TP0] message` on stderr, like Python logging.

The ` TP0` prefix is on scheduler lines only and only for TP > 1, as SGLang's `configure_logger`
does; launcher/tokenizer lines have none.
"""

from __future__ import annotations

import sys
import time


class Log:
    """SGLang-formatted log lines on stderr, flushed per line (the orchestrator tails the file).

    `level` is --log-level: INFO lines (decode/prefill batches, start-up progress) are dropped
    above info, warnings above warning; errors are always written.
    """

    _LEVELS = {"debug": 10, "info": 20, "warning": 30, "warn": 30, "error": 40, "critical": 50}

    def __init__(self, tp_size: int, level: str = "info"):
        self._prefix = " TP0" if tp_size > 1 else ""
        self._level = self._LEVELS.get(level.lower(), 20)

    def _write(self, prefix: str, message: str, level: int) -> None:
        if level < self._level:
            return
        sys.stderr.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}{prefix}] {message}\n")
        sys.stderr.flush()

    def scheduler(self, message: str, *, level: int = 20) -> None:
        """A line from the TP-rank-0 scheduler (`[... TP0] message`)."""
        self._write(self._prefix, message, level)

    def main(self, message: str, *, level: int = 20) -> None:
        """A line from the launcher / tokenizer manager (`[...] message`)."""
        self._write("", message, level)

    def warning(self, message: str) -> None:
        self._write("", message, 30)

    @staticmethod
    def raw(text: str) -> None:
        """Unformatted text such as a traceback, always written."""
        sys.stderr.write(text if text.endswith("\n") else text + "\n")
        sys.stderr.flush()
