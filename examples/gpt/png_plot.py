"""A line chart written straight to PNG (zlib + the PNG chunk format), so the main job
needs nothing beyond the standard library and torch to draw its loss curves."""

from __future__ import annotations

import struct
import zlib

# Five rows of 3x5 pixel glyphs for the axis labels.
_GLYPHS = {
    "0": "111101101101111", "1": "010110010010111", "2": "111001111100111", "3": "111001111001111",
    "4": "101101111001001", "5": "111100111001111", "6": "111100111101111", "7": "111001001001001",
    "8": "111101111101111", "9": "111101111001111", ".": "000000000000010", " ": "000000000000000",
    "B": "110101110101110", "F": "111100110100100", "P": "111101111100100", "-": "000000111000000",
}


class Canvas:
    def __init__(self, width: int, height: int):
        self.width, self.height = width, height
        self.pixels = bytearray(b"\xff" * (width * height * 3))

    def set(self, x: int, y: int, color) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            i = (y * self.width + x) * 3
            self.pixels[i:i + 3] = bytes(color)

    def line(self, x0: float, y0: float, x1: float, y1: float, color, thickness: int = 1) -> None:
        steps = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
        for i in range(steps + 1):
            t = i / steps
            x, y = round(x0 + (x1 - x0) * t), round(y0 + (y1 - y0) * t)
            for dx in range(thickness):
                for dy in range(thickness):
                    self.set(x + dx, y + dy, color)

    def text(self, x: int, y: int, s: str, color=(0, 0, 0), scale: int = 2) -> None:
        for k, ch in enumerate(s):
            glyph = _GLYPHS.get(ch, _GLYPHS[" "])
            for row in range(5):
                for col in range(3):
                    if glyph[row * 3 + col] == "1":
                        for sx in range(scale):
                            for sy in range(scale):
                                self.set(x + (k * 4 + col) * scale + sx, y + row * scale + sy, color)

    def save(self, path: str) -> None:
        raw = b"".join(b"\x00" + bytes(self.pixels[y * self.width * 3:(y + 1) * self.width * 3])
                       for y in range(self.height))

        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        with open(path, "wb") as f:
            f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9))
                    + chunk(b"IEND", b""))


def plot_curves(path: str, curves: dict, width: int = 800, height: int = 480) -> None:
    """Curves {name: (color, [y0, y1, ...])} over their step index; y axis labelled."""
    canvas = Canvas(width, height)
    left, right, top, bottom = 70, width - 20, 20, height - 40
    values = [v for _, ys in curves.values() for v in ys]
    lo, hi = min(values), max(values)
    hi = hi if hi > lo else lo + 1.0
    steps = max(len(ys) for _, ys in curves.values())
    canvas.line(left, bottom, right, bottom, (0, 0, 0))
    canvas.line(left, top, left, bottom, (0, 0, 0))
    for k in range(5):  # y ticks
        v = lo + (hi - lo) * k / 4
        y = bottom - (bottom - top) * k / 4
        canvas.line(left - 5, y, left, y, (0, 0, 0))
        canvas.text(5, int(y) - 5, f"{v:.2f}")
    for color, ys in curves.values():
        pts = [(left + (right - left) * i / max(1, steps - 1), bottom - (bottom - top) * (v - lo) / (hi - lo))
               for i, v in enumerate(ys)]
        for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
            canvas.line(x0, y0, x1, y1, color, thickness=2)
    canvas.text(left, height - 25, "0")  # x axis: steps
    last = str(steps - 1)
    canvas.text(right - 8 * len(last), height - 25, last)
    for k, (name, (color, _)) in enumerate(curves.items()):  # legend, top right
        x, y = right - 120, top + 10 + 20 * k
        canvas.line(x, y + 5, x + 30, y + 5, color, thickness=3)
        canvas.text(x + 40, y, name)
    canvas.save(path)
