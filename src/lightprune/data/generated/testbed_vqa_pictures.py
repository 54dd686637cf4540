"""The pictures of Testbed VQA's image rows (`lightprune.data.generated.testbed_vqa`): one of scikit-learn's
handwritten digits upscaled (`render_digit`), or a bar chart drawn by matplotlib on whole pixels
(`render_bar_chart`, `Bar`); `render_row` draws a row's, the same pixels every run.

With ``canvas`` set, `render_row` pastes the picture onto a larger square of uninformative noise
(`place_on_canvas`): grey levels drawn around `CANVAS_GREY`, the picture at a position drawn from the row's
key (``place="random"``) or in the middle (``"centre"``), so that most of the vision tokens show nothing a question asks
about and the tokens the text attends to least are the background's (the premise of "Modality-Aware Expert Pruning for
MoE-Based Multimodal Large Language Models", arXiv 2611.05927, sections 4.2 and 5.2: low-attention vision tokens show
non-salient background).

A row is any object with the generated rows' ``key``, ``digit`` and ``bars``
(`TestbedVQARow`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

__all__ = ["BAR_COLORS", "BAR_LEVELS", "CANVAS_GREY", "CANVAS_NOISE", "CANVAS_PLACES", "CHART_BACKGROUND", "CHART_DPI",
           "MIN_IMAGE_SIZE", "Bar", "bar_boxes", "check_canvas", "check_image_size", "digit_images", "place_on_canvas",
           "render_bar_chart", "render_digit", "render_row"]

BAR_COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30), "green": (30, 160, 60), "blue": (30, 70, 220), "yellow": (235, 200, 20),
    "purple": (140, 50, 170), "orange": (245, 130, 20)}
BAR_LEVELS = 6  # a bar's height is level * (drawable height // BAR_LEVELS) pixels, level in 1..BAR_LEVELS
CHART_BACKGROUND: tuple[int, int, int] = (235, 235, 235)
CHART_DPI = 64  # figure size image_size / 64 inches: exact in binary, so the canvas is image_size pixels
MIN_IMAGE_SIZE = 16
#: the canvas's noise: each pixel's grey level uniform in CANVAS_GREY +- CANVAS_NOISE (the same in R, G and B)
CANVAS_GREY, CANVAS_NOISE = 200, 24


@dataclass(frozen=True)
class Bar:
    """One bar of a chart: ``color`` in `BAR_COLORS`, ``height`` a level in 1..`BAR_LEVELS`."""

    color: str
    height: int


def check_image_size(image_size: int) -> None:
    """``image_size`` an int of at least `MIN_IMAGE_SIZE` (room for 4 bars with gaps)."""
    if not isinstance(image_size, int) or isinstance(image_size, bool) or image_size < MIN_IMAGE_SIZE:
        raise ValueError(f"image_size must be an int >= {MIN_IMAGE_SIZE} (room for 4 bars with gaps), "
                         f"got {image_size!r}")


@lru_cache(maxsize=1)
def digit_images():
    """``(images, labels)`` of ``sklearn.datasets.load_digits()``: uint8 grey levels 0-16 ``[1797, 8, 8]``, ints."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:
        raise ImportError("the 'digit' task reads scikit-learn's bundled handwritten digits: pip install "
                          "'lightprune[testbed]' (scikit-learn>=1.3), or leave 'digit' out of tasks") from e
    import numpy as np

    digits = load_digits()
    images = np.rint(digits.images).astype(np.uint8)
    images.setflags(write=False)
    return images, tuple(int(t) for t in digits.target)


def render_digit(index: int, image_size: int = 32):
    """The RGB ``PIL.Image`` of sklearn digit ``index``: grey ``255 - level * 255 / 16``, nearest-upscaled."""
    import numpy as np
    from PIL import Image

    check_image_size(image_size)
    images, _ = digit_images()
    if not isinstance(index, int) or not 0 <= index < len(images):
        raise ValueError(f"digit index must be an int in [0, {len(images)}), got {index!r}")
    grey = np.rint(255 - images[index].astype(np.float64) * (255 / 16)).astype(np.uint8)
    return Image.fromarray(grey, "L").resize((image_size, image_size), Image.NEAREST).convert("RGB")


def bar_boxes(n_bars: int, image_size: int) -> tuple[list[tuple[int, int]], int, int]:
    """Where bars go: ``([(left, width)] per bar, bottom, pixels per height level)``, pixels from the left
    and bottom edges; bars have gaps between them and a margin all round."""
    margin = max(1, image_size // 16)
    span = image_size - 2 * margin
    slot = span // n_bars
    width = max(1, slot * 3 // 5)
    gap = slot - width
    start = margin + (span - n_bars * slot) // 2 + (gap + 1) // 2
    return [(start + i * slot, width) for i in range(n_bars)], margin, span // BAR_LEVELS


def render_bar_chart(bars: Sequence[Bar], image_size: int = 32):
    """The RGB ``PIL.Image`` of ``bars`` drawn by matplotlib on `CHART_BACKGROUND` (``image_size`` square)."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from PIL import Image

    check_image_size(image_size)
    if not 1 <= len(bars) <= 4:
        raise ValueError(f"a chart has 1 to 4 bars, got {len(bars)}")
    for bar in bars:
        if bar.color not in BAR_COLORS or not 1 <= bar.height <= BAR_LEVELS:
            raise ValueError(f"bad bar {bar!r}: color in {list(BAR_COLORS)}, height in 1..{BAR_LEVELS}")
    rgb = lambda c: tuple(v / 255 for v in c)  # noqa: E731
    inches = image_size / CHART_DPI
    fig = Figure(figsize=(inches, inches), dpi=CHART_DPI, facecolor=rgb(CHART_BACKGROUND))
    canvas = FigureCanvasAgg(fig)
    ax = fig.add_axes((0, 0, 1, 1), facecolor=rgb(CHART_BACKGROUND))
    ax.set_axis_off()
    ax.set_xlim(0, image_size)  # one data unit per pixel: bars cover whole pixels
    ax.set_ylim(0, image_size)
    boxes, bottom, step = bar_boxes(len(bars), image_size)
    ax.bar([left for left, _ in boxes], [b.height * step for b in bars], width=[w for _, w in boxes],
           bottom=bottom, align="edge", color=[rgb(BAR_COLORS[b.color]) for b in bars], linewidth=0,
           antialiased=False)
    canvas.draw()
    pixels = np.asarray(canvas.buffer_rgba())[..., :3].copy()
    if pixels.shape != (image_size, image_size, 3):  # pragma: no cover - the figure size is exact
        raise RuntimeError(f"matplotlib drew {pixels.shape[1]} x {pixels.shape[0]} pixels, not {image_size}")
    return Image.fromarray(pixels, "RGB")


#: where :func:`place_on_canvas` puts the picture: at a position drawn from the row's key, or in the middle
CANVAS_PLACES: tuple[str, ...] = ("random", "centre")


def check_canvas(canvas: int | None, image_size: int, place: str = "random") -> None:
    """``canvas`` is None or an int at least ``image_size``; ``place`` one of `CANVAS_PLACES`."""
    if canvas is not None and (not isinstance(canvas, int) or isinstance(canvas, bool) or canvas < image_size):
        raise ValueError(f"canvas must be None or an int >= image_size ({image_size}), got {canvas!r}")
    if place not in CANVAS_PLACES:
        raise ValueError(f"canvas_place must be one of {list(CANVAS_PLACES)}, got {place!r}")


def _row_seed(row: Any) -> int:
    """A seed from the row's key (its picture): the same row gets the same canvas in every split and run."""
    return int.from_bytes(hashlib.sha256(repr(row.key).encode("utf-8")).digest()[:8], "little")


def place_on_canvas(picture, row: Any, canvas: int, place: str = "random"):
    """``picture`` pasted onto a ``canvas`` x ``canvas`` square of noise (`CANVAS_GREY` +- `CANVAS_NOISE`
    per pixel, drawn from the row's key), its top-left corner at a position drawn uniformly from the row's key
    (``place="random"``) or at (canvas - side) // 2 on both axes (``"centre"``)."""
    import numpy as np
    from PIL import Image

    check_canvas(canvas, picture.width, place)
    rng = np.random.default_rng(_row_seed(row))
    grey = rng.integers(CANVAS_GREY - CANVAS_NOISE, CANVAS_GREY + CANVAS_NOISE + 1, size=(canvas, canvas),
                        dtype=np.int64).astype(np.uint8)
    out = Image.fromarray(grey, "L").convert("RGB")
    left, top = (int(v) for v in rng.integers(0, canvas - picture.width + 1, size=2))
    if place == "centre":
        left = top = (canvas - picture.width) // 2
    out.paste(picture, (left, top))
    return out


def render_row(row: Any, image_size: int = 32, canvas: int | None = None, place: str = "random"):
    """The row's picture (``PIL.Image``, RGB; ``image_size`` square, on a ``canvas`` square of noise when given,
    placed by ``place``: `place_on_canvas`); ``None`` for a text row."""
    check_canvas(canvas, image_size, place)
    if row.digit is not None:
        picture = render_digit(row.digit, image_size)
    elif row.bars:
        picture = render_bar_chart(row.bars, image_size)
    else:
        return None
    return picture if canvas is None else place_on_canvas(picture, row, canvas, place)
