"""Plot checks: a real PNG of the expected size with a drawing in it."""

from __future__ import annotations

from pathlib import Path

import numpy as np

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def assert_plot_png(
    path: str | Path, figsize: tuple[float, float], dpi: int, tight: bool = False
) -> np.ndarray:
    """Decode ``path`` and check it is the figure that was drawn, not any file of some size.

    * the PNG signature, and it decodes (``matplotlib.image.imread``);
    * its pixel size is ``figsize × dpi`` (exactly; with ``bbox_inches="tight"`` the margins
      are cropped or grown, so each side within [0.6, 1.3] of it);
    * content: a white page with marks — most pixels the background, and enough non-background
      pixels (axes, ticks, lines, text) and distinct colours that a blank, single-colour or
      noise image fails.

    Returns the RGB pixels for further checks.
    """
    from matplotlib import image

    path = Path(path)
    assert path.read_bytes()[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    pixels = image.imread(path)
    assert pixels.ndim == 3 and pixels.shape[2] in (3, 4), pixels.shape
    height, width = pixels.shape[:2]
    want_w, want_h = round(figsize[0] * dpi), round(figsize[1] * dpi)
    if tight:
        assert 0.6 * want_w <= width <= 1.3 * want_w, (width, want_w)
        assert 0.6 * want_h <= height <= 1.3 * want_h, (height, want_h)
    else:
        assert (width, height) == (want_w, want_h)
    rgb = pixels[..., :3]
    background = np.all(rgb > 0.97, axis=-1)
    drawn = 1.0 - float(background.mean())
    assert 0.01 < drawn < 0.6, f"{path}: {drawn:.3f} of the pixels are drawn"
    assert float(rgb.std()) > 0.05, f"{path}: no pixel variance"
    colours = np.unique((rgb[~background] * 255).round().astype(np.uint8), axis=0)
    assert len(colours) >= 16, f"{path}: only {len(colours)} colours"
    return rgb


# fedtune.tuning.analysis.plots: Figure(figsize=…) per artifact, saved at dpi 110 with a tight bbox
TUNING_DPI = 110
TUNING_FIGSIZES = {
    "curves": (7, 4.5),
    "pareto": (6, 4.5),
    "envelope": (7.5, 4.8),
    "theory": (10, 4.2),
}


def assert_tuning_plot(path: str | Path, kind: str) -> np.ndarray:
    return assert_plot_png(path, TUNING_FIGSIZES[kind], TUNING_DPI, tight=True)
