"""scikit-learn's bundled wine data, read without importing scikit-learn.

``sklearn.datasets.load_wine`` imports most of scikit-learn and SciPy (about 2 CPU-s, more than
torch's import) to read a CSV file of 178 rows, and every process that builds ``fedlab_wine``
pays it: the service's code check, each trial. :func:`wine_arrays` reads the same file that
``load_wine`` reads (``sklearn/datasets/data/wine_data.csv``: a header line, then 13 features
and the cultivar per row), as fedtune's own ``digits`` task reads scikit-learn's digits.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

__all__ = ["wine_arrays"]


def wine_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The wines and their cultivars: ``load_wine()``'s ``.data`` and ``.target``.

    Returns:
        The features ``[178, 13]`` (float64) and the cultivars ``[178]`` (int, 0–2);
        ``load_wine`` itself gives them if the file is not where scikit-learn keeps it.
    """
    spec = importlib.util.find_spec("sklearn")  # finds the package without running it
    roots = spec.submodule_search_locations if spec is not None else None
    path = Path(roots[0], "datasets", "data", "wine_data.csv") if roots else None
    if path is None or not path.is_file():
        from sklearn.datasets import load_wine

        bunch = load_wine()
        return bunch.data, bunch.target
    table = np.loadtxt(path, delimiter=",", skiprows=1)
    return table[:, :-1], table[:, -1].astype(int)
