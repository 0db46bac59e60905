"""One forward pass before training: does the model's output fit the task's loss?

A user model with the wrong output shape (say ``[B]`` logits instead of ``[B, classes]``) would
otherwise fail deep inside the vectorized runner (``vmap`` over the cohort) with a message about
tensor dimensions, or — worse — train on a per-example loss of the wrong shape. The
:class:`~fedtune.trainers.Trainer` calls :func:`check_model_outputs` once, on two examples of
the first client, and raises ``ConfigError("task.model", …)`` naming the model's output shape,
the targets' shape and what the loss did with them. The loss contract
(``fedtune.extend``): ``loss_fn(outputs [B, ...], targets [B, ...]) -> [B]``.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch.func import functional_call

from fedtune.errors import ConfigError

from .tasks.base import Task

__all__ = ["check_model_outputs"]


def check_model_outputs(
    task: Task,
    model: torch.nn.Module,
    params: Mapping[str, torch.Tensor],
    data,
) -> None:
    """Raise ``ConfigError("task.model", …)`` unless ``loss_fn(model(x), y)`` is ``[B]`` on
    the first examples of ``data`` (the trainer's cast store: device and dtype of training)."""
    view = data.cohort(torch.tensor([0]))
    start, count = int(view.offsets[0]), int(view.counts[0])
    rows = torch.arange(start, start + min(2, count))
    x = view.inputs[rows.to(view.inputs.device)]
    y = view.targets[rows.to(view.targets.device)]
    b = int(rows.shape[0])
    shape_of = lambda t: list(t.shape) if torch.is_tensor(t) else type(t).__name__  # noqa: E731
    with torch.no_grad():
        try:
            out = functional_call(model, dict(params), (x,))
        except Exception as exc:
            raise ConfigError(
                "task.model",
                f"the model failed on inputs of shape {shape_of(x)}: {type(exc).__name__}: {exc}",
            ) from exc
        try:
            losses = task.loss_fn(out, y)
        except Exception as exc:
            raise ConfigError(
                "task.model",
                f"the model's outputs of shape {shape_of(out)} do not fit task "
                f"{task.name!r}'s loss with targets of shape {shape_of(y)}: "
                f"{type(exc).__name__}: {exc}",
            ) from exc
    if not torch.is_tensor(losses) or tuple(losses.shape) != (b,):
        raise ConfigError(
            "task.model",
            f"task {task.name!r}'s loss on model outputs of shape {shape_of(out)} and targets "
            f"of shape {shape_of(y)} has shape {shape_of(losses)}; it must be per-example "
            f"losses [{b}] (is the model's output shape right?)",
        )
