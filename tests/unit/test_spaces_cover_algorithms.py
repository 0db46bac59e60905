"""Every registered algorithm has a shipped search space that a study spec accepts."""

from __future__ import annotations

import pytest

from fedtune.search_spaces.loader import space_for_algorithm
from fedtune.trainers import algorithms, get_recipe
from fedtune.tuning.spec import StudySpec


@pytest.mark.parametrize("name", sorted(algorithms()))
def test_algorithm_has_a_valid_shipped_space(name):
    space = space_for_algorithm(name)
    assert space is not None, f"no shipped search space lists {name}"
    recipe = get_recipe(name)
    task = {"name": "mixed_quadratic"} if recipe.needs_central else {"name": "quadratic"}
    train = {"rounds": 20}
    if recipe.max_clients_per_round:
        train["clients_per_round"] = recipe.max_clients_per_round
    spec = StudySpec.from_dict(
        {
            "name": f"cover-{name.replace('_', '-')}",
            "task": task,
            "algorithm": name,
            "train": train,
            "search": {"space": space.name},
            "budget": {"trials": 2},
        }
    )
    searched = spec.search_space()
    assert searched.parameters, name
