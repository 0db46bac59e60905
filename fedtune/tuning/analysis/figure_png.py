"""A figure description (:mod:`.figure`) drawn with matplotlib (Agg canvas, no pyplot state).

:func:`apply_axis` sets one matplotlib axis to an :class:`~.figure.Axis`: its scale, limits,
ticks and their labels, and nothing matplotlib would choose itself (no minor ticks, no offset
such as ``+1.79`` that hides the values). The study's own plots (:mod:`.plots`) use it too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .figure import Axis, Figure

__all__ = ["apply_axis", "matplotlib_figure", "png"]


def apply_axis(ax: Any, which: str, spec: Axis) -> None:
    """Make ``ax``'s ``which`` axis (``x`` or ``y``) the axis ``spec`` describes.

    Args:
        ax: a matplotlib ``Axes``.
        which: ``x`` or ``y``.
        spec: the axis.
    """
    from matplotlib.ticker import NullLocator

    getattr(ax, f"set_{which}scale")("log" if spec.log else "linear")
    getattr(ax, f"set_{which}lim")(spec.lo, spec.hi)
    getattr(ax, f"set_{which}ticks")(spec.ticks, spec.tick_labels)
    getattr(ax, f"{which}axis").set_minor_locator(NullLocator())
    getattr(ax, f"set_{which}label")(spec.label)


def png(figure: Figure, path: str | Path) -> Path:
    """Write ``figure`` as a PNG (:func:`matplotlib_figure`).

    Args:
        figure: The description.
        path: The PNG to write.

    Returns:
        The path written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    matplotlib_figure(figure).savefig(path, dpi=100)
    return path


def matplotlib_figure(figure: Figure) -> Any:
    """``figure`` drawn with matplotlib (Agg canvas): its scales, limits, ticks and labels,
    nothing matplotlib would choose itself (no minor ticks, no offset), laid out so that no
    label runs into the next panel.

    Args:
        figure: The description.

    Returns:
        The matplotlib ``Figure``.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure as MplFigure

    n = max(len(figure.panels), 1)
    fig = MplFigure(figsize=(5.2 * n, 4.4), layout="constrained")
    FigureCanvasAgg(fig)
    for j, panel in enumerate(figure.panels):
        ax = fig.add_subplot(1, n, j + 1)
        for s in panel.series:
            xs, ys = zip(*s.points, strict=True)
            if panel.kind == "points":
                ax.plot(xs, ys, "o", color=s.colour, label=s.key, ms=4)
            elif panel.kind == "line":
                ax.plot(xs, ys, "o-", color=s.colour, label=s.key, ms=4)
            else:
                ax.step(xs, ys, where="post", color=s.colour, label=s.key)
        apply_axis(ax, "x", panel.x)
        apply_axis(ax, "y", panel.y)
        ax.set_title(panel.title)
        ax.grid(alpha=0.3)
        if panel.series:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no finite points", ha="center", transform=ax.transAxes)
    fig.suptitle(figure.title)
    return fig
