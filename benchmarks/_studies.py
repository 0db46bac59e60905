"""The spec of a study whose trials do next to no work (quadratic, 1 client, d = 1, one local
step of batch 1): what the start-up and MLflow-UI benchmarks run, so that the time or the
artifacts measured are fedtune's, not the engine's."""

from __future__ import annotations

import textwrap


def free_study(
    name: str, *, rounds: int, trials: int, sampler: str, max_concurrent: int = 1
) -> str:
    """YAML of ``name``: ``trials`` trials of ``rounds`` rounds, fedavg space, ``sampler``
    seeded with 0, no scheduler, objective = the last round's train loss."""
    return textwrap.dedent(
        f"""
        name: {name}
        task: {{name: quadratic, clients: 1, dim: 1, examples: 1, seed: 0}}
        algorithm: fedavg
        train: {{rounds: {rounds}, clients_per_round: 1, local_steps: 1, batch_size: 1,
                eval_every: 1, dtype: float64}}
        search: {{space: fedavg}}
        sampler: {{name: {sampler}, seed: 0}}
        scheduler: {{name: none}}
        objective: {{metric: train_loss, last_rounds: 1}}
        budget: {{trials: {trials}, max_concurrent: {max_concurrent}}}
        """
    )
