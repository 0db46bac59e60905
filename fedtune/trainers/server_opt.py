"""Server optimizers: the server treats the averaged message q_t as a gradient.

docs/explanation/algorithms.md §1.4 (Charles & Konečný 2021 (arXiv:2103.05032) App. E,
Charles & Konečný 2020 (arXiv:2007.00878) §8.4). With server lr η, momentum β, moments β₁, β₂ and ε:

* ``sgd``       x ← x − η q
* ``momentum``  m ← β m + q;  x ← x − η m                          (heavy ball)
* ``nesterov``  ``keras`` form: m ← β m + q;  x ← x − η (q + β m)  (what TFF's SGD(nesterov) does)
                ``theory`` form: broadcast y = x + β (x − x_prev); x ← y − η q(y)
* ``adam``      m ← β₁ m + (1−β₁) q;  v ← β₂ v + (1−β₂) q²;  x ← x − η m̂ / (√v̂ + ε)
* ``yogi``      m as Adam;  v ← v − (1−β₂) sign(v − q²) q²;   x ← x − η m̂ / (√v̂ + ε)
* ``adagrad``   v ← v + q²;  x ← x − η q / (√v + ε)

Constants default to the Yogi setting of Charles & Konečný 2020 §8.4 (β₁ 0.9, β₂ 0.99,
ε 1e-5, v₀ = 0). Bias correction (m̂ = m/(1−β₁ᵗ), v̂ = v/(1−β₂ᵗ)) is *off* by default, as in
the adaptive federated optimizers of Reddi et al. that the papers use; the documents do not say
(docs/explanation/algorithms.md §9 item 12), so ``server_bias_correction`` turns it on.

Each optimizer is a pair of pure functions over dicts of tensors: ``init(params) -> state`` and
``step(params, state, q, lr) -> (params, state)``; ``broadcast(params, state)`` is the point the
clients are sent (differs from ``params`` only for the theory form of Nesterov).

The server optimizer is a part: :data:`SERVER_HPARAMS` declares its hyperparameters (type,
default, bounds, default search entry; :mod:`fedtune.trainers.hparams`), once for every recipe
(defined in :mod:`fedtune.trainers.part_hparams`, which a spec's validation reads without torch).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .part_hparams import SERVER_HPARAMS, SERVER_OPTS

__all__ = ["SERVER_HPARAMS", "SERVER_OPTS", "ServerOpt", "make_server_opt"]


Params = dict[str, torch.Tensor]


def _zeros(params: Params) -> Params:
    return {k: torch.zeros_like(v) for k, v in params.items()}


@dataclass(frozen=True)
class ServerOpt:
    """A server optimizer: pure functions that treat the aggregated message q_t as a gradient.

    Args:
        name: Its name (``sgd``, ``momentum``, ``nesterov``, ``adam``, ``yogi``, ``adagrad``).
        init: ``init(params) -> state``.
        step: ``step(params, state, q, lr) -> (params, state)``.
        broadcast: ``broadcast(params, state) -> params`` the clients are sent.
    """

    name: str
    init: Callable[[Params], dict[str, Params | torch.Tensor]]
    step: Callable[[Params, dict, Params, float], tuple[Params, dict]]
    broadcast: Callable[[Params, dict], Params]


def _identity_broadcast(params: Params, state: dict) -> Params:
    return params


def _sgd() -> ServerOpt:
    def step(params, state, q, lr):
        return {k: params[k] - lr * q[k] for k in params}, state

    return ServerOpt("sgd", lambda p: {}, step, _identity_broadcast)


def _momentum(beta: float) -> ServerOpt:
    def step(params, state, q, lr):
        m = {k: beta * state["m"][k] + q[k] for k in params}
        return {k: params[k] - lr * m[k] for k in params}, {"m": m}

    return ServerOpt("momentum", lambda p: {"m": _zeros(p)}, step, _identity_broadcast)


def _nesterov_keras(beta: float) -> ServerOpt:
    def step(params, state, q, lr):
        m = {k: beta * state["m"][k] + q[k] for k in params}
        return {k: params[k] - lr * (q[k] + beta * m[k]) for k in params}, {"m": m}

    return ServerOpt("nesterov", lambda p: {"m": _zeros(p)}, step, _identity_broadcast)


def _nesterov_theory(beta: float) -> ServerOpt:
    def broadcast(params, state):
        prev = state["prev"]
        return {k: params[k] + beta * (params[k] - prev[k]) for k in params}

    def step(params, state, q, lr):
        y = broadcast(params, state)
        return {k: y[k] - lr * q[k] for k in params}, {"prev": dict(params)}

    return ServerOpt(
        "nesterov", lambda p: {"prev": {k: v.clone() for k, v in p.items()}}, step, broadcast
    )


def _adaptive(name: str, hp: Any) -> ServerOpt:
    b1, b2, eps, correct = (
        hp.server_beta1,
        hp.server_beta2,
        hp.server_eps,
        hp.server_bias_correction,
    )

    def init(params):
        return {"m": _zeros(params), "v": _zeros(params), "t": torch.zeros((), dtype=torch.long)}

    def second_moment(v, g2):
        if name == "adam":
            return b2 * v + (1 - b2) * g2
        if name == "yogi":
            return v - (1 - b2) * torch.sign(v - g2) * g2
        return v + g2  # adagrad

    def step(params, state, q, lr):
        t = state["t"] + 1
        m = q if name == "adagrad" else {k: b1 * state["m"][k] + (1 - b1) * q[k] for k in params}
        v = {k: second_moment(state["v"][k], q[k] * q[k]) for k in params}
        c1 = 1 - b1 ** int(t) if correct and name != "adagrad" else 1.0
        c2 = 1 - b2 ** int(t) if correct and name != "adagrad" else 1.0
        new = {k: params[k] - lr * (m[k] / c1) / (torch.sqrt(v[k] / c2) + eps) for k in params}
        return new, {"m": m if name != "adagrad" else state["m"], "v": v, "t": t}

    return ServerOpt(name, init, step, _identity_broadcast)


def make_server_opt(hp: Any) -> ServerOpt:
    """Build the server optimizer a recipe's hyperparameters name.

    Args:
        hp: A recipe's validated hyperparameters (:data:`SERVER_HPARAMS` among them):
            ``server_opt`` names the optimizer, the others give its constants.

    Returns:
        The server optimizer.
    """
    if hp.server_opt == "sgd":
        return _sgd()
    if hp.server_opt == "momentum":
        return _momentum(hp.server_momentum)
    if hp.server_opt == "nesterov":
        if hp.nesterov_form == "theory":
            return _nesterov_theory(hp.server_momentum)
        return _nesterov_keras(hp.server_momentum)
    return _adaptive(hp.server_opt, hp)
