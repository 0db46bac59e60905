"""The plot check of tests/images.py rejects what the old ``size > 200`` / ``size > 2000``
checks let through: an empty figure, a solid image, random noise, a figure of
the wrong size; it accepts a real plot."""

from __future__ import annotations

import numpy as np
import pytest

from tests.images import assert_plot_png


def _save(tmp_path, name, draw=None, figsize=(6, 4), dpi=100):
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # not at collection
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    if draw:
        draw(fig)
    path = tmp_path / f"{name}.png"
    fig.savefig(path, dpi=dpi)
    return path


def _plot(fig):
    ax = fig.add_subplot()
    ax.plot(np.arange(50), np.sin(np.arange(50) / 5), label="a")
    ax.set(xlabel="round", ylabel="loss", title="curves")
    ax.legend()


def test_accepts_a_real_plot(tmp_path):
    assert_plot_png(_save(tmp_path, "ok", _plot), (6, 4), 100)


def test_rejects_what_a_byte_count_accepts(tmp_path):
    empty = _save(tmp_path, "empty")
    assert empty.stat().st_size > 200  # the old check passed it
    with pytest.raises(AssertionError, match="drawn"):
        assert_plot_png(empty, (6, 4), 100)
    with pytest.raises(AssertionError):
        assert_plot_png(_save(tmp_path, "small", _plot, figsize=(3, 2)), (6, 4), 100)
    with pytest.raises(AssertionError):
        assert_plot_png(_save(tmp_path, "small_tight", _plot, figsize=(3, 2)), (6, 4), 100, True)
    from matplotlib import image

    noise = tmp_path / "noise.png"
    image.imsave(noise, np.random.default_rng(0).random((400, 600, 3)))
    assert noise.stat().st_size > 2000
    with pytest.raises(AssertionError, match="drawn"):
        assert_plot_png(noise, (6, 4), 100)
    solid = tmp_path / "solid.png"
    image.imsave(solid, np.full((400, 600, 3), 0.3))
    with pytest.raises(AssertionError):
        assert_plot_png(solid, (6, 4), 100)
    fake = tmp_path / "fake.png"
    fake.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(3000))
    with pytest.raises(Exception):  # noqa: B017 - any decoding error
        assert_plot_png(fake, (6, 4), 100)
