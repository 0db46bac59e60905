"""One forward pass before training: does the model's output fit the task's loss?

A user model with the wrong output shape (say ``[B]`` logits instead of ``[B, classes]``) would
otherwise fail deep inside the vectorized runner (``vmap`` over the cohort) with a message about
tensor dimensions, or — worse — train on a per-example loss of the wrong shape. The
:class:`~fedtune.trainers.Trainer` calls :func:`check_model_outputs` once, on two examples of
the first client, and raises ``ConfigError("task.model", …)`` naming the model's output shape,
the targets' shape and what the loss did with them. The loss contract
(``fedtune.extend``): ``loss_fn(outputs [B, ...], targets [B, ...]) -> [B]``.

Two examples of one client may hold one label only (a label-skewed split): a model with one
output for a two-class task passes on them and every trial then fails with a bare ``IndexError:
Target 1 is out of bounds``. So the loss is also tried on the examples with the smallest and the
largest integer label over all the data, and an error names the label range and ``file:line``
of the task's model (its ``model_fn``, when that is the user's code).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from pathlib import Path

import torch
from torch.func import functional_call

from fedtune.errors import CodeError, ConfigError

from .tasks.base import Task

__all__ = ["check_model_outputs"]

_FEDTUNE = Path(__file__).resolve().parents[1]  # fedtune's own package: not the user's code


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
    _check_label_range(task, model, params, data)


def _check_label_range(task: Task, model: torch.nn.Module, params, data) -> None:
    """The loss on the examples of the smallest and largest integer label of ``data``."""
    targets = getattr(data, "targets", None)
    inputs = getattr(data, "inputs", None)
    if not torch.is_tensor(targets) or targets.dim() != 1 or targets.is_floating_point():
        return  # regression or sequence targets: no label range to check
    if targets.numel() == 0 or not torch.is_tensor(inputs):
        return
    rows = torch.stack([torch.argmin(targets), torch.argmax(targets)])
    lo, hi = (int(v) for v in targets[rows])
    x, y = inputs[rows.to(inputs.device)], targets[rows]
    with torch.no_grad():
        out = functional_call(model, dict(params), (x,))
        try:
            task.loss_fn(out, y)
        except Exception as exc:
            shape = list(out.shape) if torch.is_tensor(out) else type(out).__name__
            raise CodeError(
                "task.model",
                f"the model's outputs of shape {shape} do not fit task {task.name!r}'s loss "
                f"on the labels its data holds ({lo}..{hi}): {type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": "),
                _model_location(task),
            ) from exc


def _model_location(task: Task) -> str | None:
    """``file:line`` of the task's ``model_fn`` when it is the user's code (not fedtune's)."""
    fn = getattr(task.model_fn, "__func__", task.model_fn)
    code = getattr(fn, "__code__", None)
    try:
        path = inspect.getsourcefile(fn) if code is not None else None
    except TypeError:
        return None
    if not path or Path(path).resolve().is_relative_to(_FEDTUNE):
        return None
    return f"{path}:{code.co_firstlineno}"
