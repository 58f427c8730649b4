"""Thumbnails of gallery and query images for the HTML report (Pillow, imported when used)."""

from __future__ import annotations

import base64
import io

from .constants import THUMBNAIL_PX


class Thumbnails:
    """``(base64 PNG, width, height)`` thumbnails of image files, fitting in a square of
    ``size`` pixels (cached per path; ``None`` if there is no readable image)."""

    def __init__(self, size: int = THUMBNAIL_PX):
        self.size = size
        self.cache: dict[str, tuple[str, int, int] | None] = {}

    def __call__(self, path: str | None) -> tuple[str, int, int] | None:
        if not path:
            return None
        if path not in self.cache:
            self.cache[path] = self._make(path)
        return self.cache[path]

    def _make(self, path: str) -> tuple[str, int, int] | None:
        from PIL import Image

        try:
            with Image.open(path) as image:
                image = image.convert("RGB")
        except (OSError, ValueError):
            return None
        w, h = image.size
        scale = self.size / max(w, h)
        size = (max(1, round(w * scale)), max(1, round(h * scale)))
        image = image.resize(
            size, Image.Resampling.NEAREST if scale >= 1 else Image.Resampling.LANCZOS
        )
        # 64 colours: half the bytes, and plenty to tell items apart
        image = image.quantize(64, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
        buffer = io.BytesIO()
        image.save(buffer, format="PNG", optimize=True)
        return base64.b64encode(buffer.getvalue()).decode("ascii"), size[0], size[1]
