"""Log lines as JSON (``hybridrag serve --log-json``): one object per line, with the request id and timings a
record carries."""

from __future__ import annotations

import json
import logging


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line (time, level, logger, message, request_id and timings when the record has them)."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"time": self.formatTime(record), "level": record.levelname, "logger": record.name,
               "message": record.getMessage()}
        for key in ("request_id", "timings_ms"):
            if key in record.__dict__:  # set through ``extra=``
                out[key] = record.__dict__[key]
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out)
