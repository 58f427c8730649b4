"""The tidy CSV rendering of the report document: one row per dataset x encoder x metric.

Columns: ``dataset``, ``encoder``, ``checkpoint`` (the checkpoint file, empty for a
weight-free encoder), ``metric``, ``value``, ``ci_low``, ``ci_high`` (the interval;
empty without statistics), ``num_queries``, ``num_skipped``.  A result with verification
metrics adds a row per ``tpr@fpr=<level>`` (no interval).  Values are percentages
written at full precision (``repr``): read back, they are the numbers of report.json.
"""

from __future__ import annotations

import csv
import io
from typing import Any

from . import view

COLUMNS = (
    "dataset",
    "encoder",
    "checkpoint",
    "metric",
    "value",
    "ci_low",
    "ci_high",
    "num_queries",
    "num_skipped",
)


def render_csv(doc: dict[str, Any]) -> str:
    """The CSV text (header, then rows in report order)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(COLUMNS)
    for entry in doc["results"]:
        for name, value in entry["metrics"].items():
            interval = view.ci(entry, name) or ("", "")
            writer.writerow(
                [
                    entry["dataset"],
                    entry["encoder"],
                    entry["provenance"]["checkpoint"] or "",
                    name,
                    repr(value),
                    *(repr(x) if x != "" else "" for x in interval),
                    entry["num_queries"],
                    entry["num_skipped"],
                ]
            )
        for level, value in ((entry.get("verification") or {}).get("tpr@fpr") or {}).items():
            writer.writerow(
                [
                    entry["dataset"],
                    entry["encoder"],
                    entry["provenance"]["checkpoint"] or "",
                    f"tpr@fpr={level}",
                    repr(value),
                    "",
                    "",
                    entry["num_queries"],
                    entry["num_skipped"],
                ]
            )
    return buffer.getvalue()
