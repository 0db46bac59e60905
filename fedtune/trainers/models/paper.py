"""The models of the papers' experiments (docs/explanation/algorithms.md §7.2).

Every model is a pure function of (parameters, inputs): no BatchNorm running statistics and no
dropout, so ``torch.func.functional_call`` + ``vmap`` can evaluate a cohort of clients at once.
Images are channel-first ``[B, C, H, W]``; token sequences are ``int64 [B, T]`` and sequence
models return per-position logits ``[B, T, V]``. Parameters are PyTorch's default
initialisation (the TFF baselines use Glorot/He initialisers; the papers do not depend on it).

* ``femnist_cnn`` — Charles & Konečný 2020 (arXiv:2007.00878) App. C (the CNN of McMahan et al.
  2017): conv 5×5×32 ('same') → ReLU → max-pool 2 → conv 5×5×64 ('same') → ReLU → max-pool 2 →
  dense 512 ReLU → dense ``num_outputs``. 1,690,046 parameters for 28×28×1 → 62.
* ``femnist_cnn_small`` — Charles & Konečný 2021 (arXiv:2103.05032) App. F says "the same [CNN] used
  by Reddi et al. (2020)": conv 3×3×32 → ReLU → conv 3×3×64 → ReLU → max-pool 2 → dense 128 ReLU →
  dense ``num_outputs`` (1,206,590 parameters for 62 classes). Its text summarises this as
  "two 3×3 conv layers, each with max pooling and dropout"; we follow the cited model, which
  pools once. **Dropout (0.25 and 0.5) is omitted**: it draws a random mask per forward pass,
  which would make the model a function of hidden RNG state rather than of (parameters,
  inputs), break the vectorised-equals-sequential runner contract and make the papers'
  training-loss selection rule noisy; the papers' analyses never rely on it.
* ``char_lstm`` — Shakespeare (both papers): embedding 8 → 2 × LSTM(256) → dense over the
  90-symbol vocabulary at every position. 820,522 parameters (the LSTMs are :class:`LSTM`,
  Keras-style with one bias per layer).
* ``resnet18_gn`` — CIFAR-100: ResNet-18 (basic blocks [2, 2, 2, 2], widths 64–512, stride-2
  downsampling with 1×1 projection shortcuts) with every BatchNorm replaced by GroupNorm
  (2 groups, as Hsieh et al. 2019). Inputs are 24×24 or 32×32, so the stem is the usual CIFAR
  3×3 stride-1 convolution without max-pool.
* ``bow_logistic`` — Stack Overflow tag prediction (Charles & Konečný 2020 App. C):
  one-vs-rest logistic regression, a single dense layer 10,000 → 500 (logits; the task's loss
  applies the sigmoid).
* ``word_lstm`` — Stack Overflow next-word prediction: embedding 96 → LSTM(670) → dense 96
  (the projection of the TFF baseline model of Reddi et al.) → dense 10,004; 4,050,748
  parameters, the count Reddi et al. report for their Keras model.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from fedtune.errors import ConfigError

__all__ = ["LSTM", "CharLSTM", "ResNet18GN", "WordLSTM"]


def _image_shape(input_shape: tuple[int, ...], name: str) -> tuple[int, int, int]:
    if len(input_shape) == 2:
        return (1, *input_shape)  # [H, W] grey images
    if len(input_shape) != 3:
        raise ConfigError("task.model", f"{name} expects images (C, H, W), got {input_shape}")
    return input_shape  # type: ignore[return-value]


class _Images(nn.Module):
    """Reshapes ``[B, ...]`` (flat pixels or ``[B, H, W]``) to ``[B, C, H, W]``."""

    def __init__(self, shape: tuple[int, int, int]) -> None:
        super().__init__()
        self.shape = shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], *self.shape)


def femnist_cnn(input_shape: tuple[int, ...], num_outputs: int) -> nn.Module:
    c, h, w = _image_shape(input_shape, "femnist_cnn")
    # 'same' padding and ceil-mode pooling reproduce Keras' padding='same' layers
    flat = 64 * math.ceil(math.ceil(h / 2) / 2) * math.ceil(math.ceil(w / 2) / 2)
    return nn.Sequential(
        _Images((c, h, w)),
        nn.Conv2d(c, 32, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2, ceil_mode=True),
        nn.Conv2d(32, 64, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2, ceil_mode=True),
        nn.Flatten(),
        nn.Linear(flat, 512),
        nn.ReLU(),
        nn.Linear(512, num_outputs),
    )


def femnist_cnn_small(input_shape: tuple[int, ...], num_outputs: int) -> nn.Module:
    c, h, w = _image_shape(input_shape, "femnist_cnn_small")
    flat = 64 * ((h - 4) // 2) * ((w - 4) // 2)
    return nn.Sequential(
        _Images((c, h, w)),
        nn.Conv2d(c, 32, 3),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(flat, 128),
        nn.ReLU(),
        nn.Linear(128, num_outputs),
    )


class LSTM(nn.Module):
    """One LSTM layer written with matrix products so that ``vmap`` can batch it over clients
    (``torch.nn.LSTM``'s fused kernel has no batching rule for a plain forward).

    Keras conventions, as in the TFF baselines: gates (i, f, g, o) from x_t W_x + h_{t−1} W_h + b
    with a single bias (forget-gate bias initialised to 1), c_t = σ(f)⊙c_{t−1} + σ(i)⊙tanh(g),
    h_t = σ(o)⊙tanh(c_t), h_0 = c_0 = 0. Input ``[B, T, I]`` → hidden states ``[B, T, H]``.
    """

    def __init__(self, input_size: int, hidden: int) -> None:
        super().__init__()
        bound = 1.0 / math.sqrt(hidden)
        self.hidden = hidden
        self.weight_x = nn.Parameter(torch.empty(input_size, 4 * hidden).uniform_(-bound, bound))
        self.weight_h = nn.Parameter(torch.empty(hidden, 4 * hidden).uniform_(-bound, bound))
        bias = torch.zeros(4 * hidden)
        bias[hidden : 2 * hidden] = 1.0
        self.bias = nn.Parameter(bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gates_x = x @ self.weight_x + self.bias  # all time steps at once
        h = x.new_zeros(x.shape[0], self.hidden)
        c = h
        states = []
        for t in range(x.shape[1]):
            i, f, g, o = (gates_x[:, t] + h @ self.weight_h).chunk(4, dim=-1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            states.append(h)
        return torch.stack(states, dim=1)


class CharLSTM(nn.Module):
    """Token ids ``[B, T]`` → embedding → stacked LSTM → (projection) → logits ``[B, T, vocab]``."""

    def __init__(
        self, vocab: int, embed: int, hidden: int, layers: int, project: int | None = None
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        sizes = [embed] + [hidden] * layers
        self.lstm = nn.Sequential(*(LSTM(a, hidden) for a in sizes[:-1]))
        self.project = nn.Linear(hidden, project) if project else None
        self.out = nn.Linear(project or hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.lstm(self.embed(tokens.long()))
        if self.project is not None:
            h = self.project(h)
        return self.out(h)


class WordLSTM(CharLSTM):
    """Stack Overflow next-word model: embedding 96 → LSTM(670) → dense 96 → dense vocab."""

    def __init__(self, vocab: int) -> None:
        super().__init__(vocab, embed=96, hidden=670, layers=1, project=96)


def char_lstm(input_shape: tuple[int, ...], num_outputs: int) -> nn.Module:
    # input_shape = (sequence length,); the vocabulary is both input and output alphabet
    return CharLSTM(num_outputs, embed=8, hidden=256, layers=2)


def word_lstm(input_shape: tuple[int, ...], num_outputs: int) -> nn.Module:
    return WordLSTM(num_outputs)


def bow_logistic(input_shape: tuple[int, ...], num_outputs: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_outputs))


def _gn(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(2, channels)


class _BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.norm1 = _gn(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.norm2 = _gn(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), _gn(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.norm1(self.conv1(x)))
        y = self.norm2(self.conv2(y))
        return torch.relu(y + self.shortcut(x))


class ResNet18GN(nn.Module):
    """ResNet-18 with GroupNorm for small (CIFAR-sized) images ``[B, C, H, W]``."""

    def __init__(self, channels: int, num_outputs: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(channels, 64, 3, 1, 1, bias=False), _gn(64), nn.ReLU())
        blocks: list[nn.Module] = []
        cin = 64
        for i, cout in enumerate((64, 128, 256, 512)):
            blocks += [_BasicBlock(cin, cout, 1 if i == 0 else 2), _BasicBlock(cout, cout, 1)]
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(512, num_outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.blocks(self.stem(x))
        return self.head(y.mean(dim=(-2, -1)))


def resnet18_gn(input_shape: tuple[int, ...], num_outputs: int) -> nn.Module:
    c, _, _ = _image_shape(input_shape, "resnet18_gn")
    return ResNet18GN(c, num_outputs)
