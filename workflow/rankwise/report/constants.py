"""The report's settings, defined once and read by the document and every renderer.

Protocol-specific choices (the overview's headline metrics, what a unit is called) are
read from :mod:`rankwise.registry`, never mapped here."""

from __future__ import annotations

#: A comparison is marked significant when its Holm-adjusted p-value is below this
#: (declared with the tests it applies to).
from ..stats import ALPHA  # noqa: F401  (the report's modules import it from here)

#: Ranks listed in the Markdown CMC table.
CMC_TABLE_RANKS = (1, 5, 10, 20, 50)
#: Up to this many encoders in a dataset, every pair is compared; beyond, each to the previous
#: one and the best to the others (linear in the number of encoders, not quadratic).
ALL_PAIRS_MAX = 4
#: Whose worst queries are listed: the best encoder of each dataset, or every encoder.
WORST_ENCODERS = ("best", "all")
#: Confidence of every interval in the report (the JSON key is ``ci95``).
CONFIDENCE = 0.95
#: Thumbnails fit in a square of this many pixels.
THUMBNAIL_PX = 64
