"""The training loop of one trial: ``run_trial(config, on_round) -> TrialResult``.

One round (Charles & Konečný 2020 (arXiv:2007.00878) Alg. 3 with ServerOpt,
docs/explanation/algorithms.md §1.3 and §2):

1. sample the cohort I_t from the *data* seed (same clients for every hyperparameter setting);
2. ℓ_t ← mean over I_t of each client's loss at the broadcast model, before local training;
   non-finite ℓ_t or ℓ_t > divergence_factor·ℓ_1 ends the trial as ``diverged`` (an outcome).
   Where the algorithm declares it (:class:`~.algorithms.MeasuringAlgorithm`: a first step at
   the broadcast model, clients no larger than the batch) the clients' first local steps give
   the losses from their own forward pass (:mod:`.first_step`), and a diverged round's update
   is dropped;
3. draw each client's batches from (trial seed, t, client) and let the algorithm update the
   server state with the rates in force, γ_t = γ·a_c^{#decays}, η_t = η·a_s^{#decays};
4. LocalUpdateDecay observes ℓ_t (a decay applies from the next round);
5. every ``eval_every`` rounds (and the first and last), population loss and test metrics.

The :class:`Trainer` exposes ``step()``, ``state_dict()`` and ``load_state_dict()``: the whole
run state (model, server-optimizer state, algorithm extras such as per-client state, decay
controller, records; randomness is a function of (seed, round, client)) is checkpointed after
any round, and a restored run continues exactly as an uninterrupted one. Imports nothing from
Ray, MLflow or FastAPI.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from fedtune.errors import ConfigError
from fedtune.round_keys import EVAL_CLIENTS_METRIC, RUNNER_METRIC

from .algorithms import Cohort, MeasuringAlgorithm, RoundContext, resolve
from .config import TrialConfig
from .decay import DecayController
from .evaluation import (
    client_mean_losses,
    dataset_metrics,
    evaluation_population,
    population_loss,
)
from .model_check import check_model_outputs
from .module_loss import ModuleLoss
from .parsing import parse_trial_config
from .records import Outcome, RoundRecord, TrialResult, divergence
from .runners import choose_runner, make_runner
from .sampling import cohort_batch_indices, sample_clients
from .steps import epoch_steps, padded_batches, step_summary
from .tasks import Task, build_task
from .tasks.base import InMemoryData

__all__ = [
    "EVAL_CLIENTS_METRIC",
    "RUNNER_METRIC",
    "Trainer",
    "cohort_rows",
    "pick_device",
    "run_trial",
]

OnRound = Callable[[RoundRecord], bool | None]
_STATE_VERSION = 1


def pick_device(requested: str) -> torch.device:
    """Resolve ``train.device`` to a torch device.

    Args:
        requested: ``auto`` (a GPU when there is one, else the CPU) or a torch device name.

    Returns:
        The device.

    Raises:
        ConfigError: A CUDA device was requested but no GPU is available.
    """
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(requested)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device", "CUDA requested but no GPU is available")
    return device


def device_label(requested: str) -> str:
    """What ``train.device`` resolves to here, as a run records it.

    Args:
        requested: ``train.device`` (``auto``, ``cpu``, ``cuda``, ``cuda:1`` …).

    Returns:
        ``cpu``, or the CUDA device with its name: ``cuda:0 (NVIDIA H100 80GB HBM3)``.
    """
    device = pick_device(requested)
    if device.type != "cuda":
        return str(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return f"cuda:{index} ({torch.cuda.get_device_name(index)})"


class Trainer:
    """Run one trial round by round, with checkpoints between rounds.

    Args:
        config: The trial's configuration, parsed or as a mapping.
        task: The task, already built (None: built from ``config.task``).

    Raises:
        ConfigError: An invalid configuration, device or model.
    """

    def __init__(self, config: TrialConfig | Mapping[str, Any], task: Task | None = None) -> None:
        self.config = config if isinstance(config, TrialConfig) else parse_trial_config(config)
        cfg = self.config
        self.task = (
            task if task is not None else build_task(cfg.task.name, cfg.task.params, cfg.task.seed)
        )
        self.algorithm, self.hparams, self.local_steps = resolve(cfg, self.task)
        self.device = pick_device(cfg.train.device)
        self.dtype = torch.float64 if cfg.train.dtype == "float64" else torch.float32
        # in memory: cast once here; file-backed: each cohort is cast when it is loaded
        self.data = self.task.train.to(self.device, self.dtype)
        self.test = None
        if self.task.test is not None:
            self.test = self.task.test.to(self.device, self.dtype)
        gen = torch.Generator().manual_seed(cfg.seed)
        self.model = self.task.model_fn(gen).to(device=self.device, dtype=self.dtype)
        params = {n: p.detach().clone() for n, p in self.model.named_parameters()}
        check_model_outputs(self.task, self.model, params, self.data)
        self.loss_of = ModuleLoss(self.model, self.task.loss_fn)
        self.state = self.algorithm.init(params)
        self.decay = DecayController(
            cfg.decay, base_rates=(self.hparams.client_lr, self.hparams.server_lr)
        )
        self.runner_kind = choose_runner(
            cfg.train.runner,
            sum(p.numel() for p in params.values()),
            self.device,
            cfg.train.clients_per_round,
            self.local_steps,
        )
        self.runner = make_runner(self.runner_kind)
        #: ℓ_t from the clients' first local steps where the algorithm can (False: always the
        #: separate pass over the cohort's data; the two give the same losses)
        self.measure_in_first_step = True
        self.records: list[RoundRecord] = []
        self.outcome: Outcome | None = None
        self.reason = ""
        self.initial_loss: float | None = None
        self._wall = 0.0
        self._examples = 0
        self._last_view: tuple[tuple[int, ...], InMemoryData] | None = None

    # -- functional model -------------------------------------------------------------
    def per_example_loss(self, params, x, y) -> torch.Tensor:
        """Evaluate the task's loss of the model at ``params``, one value per example.

        Args:
            params: The model's parameters by name.
            x: Inputs ``[B, ...]``.
            y: Targets ``[B, ...]``.

        Returns:
            The losses ``[B]``.
        """
        return self.loss_of.evaluate(params, x, y)

    def _metric(self, fn):
        return lambda params, x, y: fn(self.loss_of.forward(params, x), y)

    # -- one round --------------------------------------------------------------------
    @property
    def round(self) -> int:
        """The number of rounds run so far."""
        return len(self.records)

    @property
    def done(self) -> bool:
        """Whether the trial has ended (an outcome is set or every round has run)."""
        return self.outcome is not None or self.round >= self.config.train.rounds

    def _view(self, clients: torch.Tensor) -> InMemoryData:
        """The data of ``clients``: only they are loaded (``FederatedData.cohort``); the last
        view is kept so that the round's batches and its training read the same load."""
        key = tuple(clients.tolist())
        if self._last_view is None or self._last_view[0] != key:
            self._last_view = (key, self.data.cohort(clients))
        return self._last_view[1]

    def _cohort(self, t: int) -> Cohort:
        """The round's clients, their batch rows (into :meth:`_view`) and weights."""
        cfg = self.config
        clients = torch.from_numpy(
            sample_clients(cfg.task.seed, t, self.data.num_clients, cfg.train.clients_per_round)
        )
        data = self._view(clients)
        steps, batches = cohort_rows(
            cfg,
            self.algorithm.num_batches(),
            self.local_steps,
            t,
            clients,
            data,
            self.data.client_sizes,
        )
        counts = self.data.client_sizes[clients].to(self.dtype)
        weights = counts if cfg.train.weighting == "examples" else torch.ones_like(counts)
        return Cohort(
            clients.to(self.device),
            batches.to(self.device),
            (weights / weights.sum()).to(self.device),
            None if steps is None else steps.to(self.device),
        )

    def step(self) -> RoundRecord | None:
        """Run one round.

        Returns:
            The round's record, or None when the round ended the trial (diverged).

        Raises:
            RuntimeError: The trial has already ended.
        """
        if self.done:
            raise RuntimeError("the trial has already ended")
        cfg, t = self.config, self.round
        start = time.perf_counter()
        cohort = self._cohort(t)
        data = self._view(cohort.clients.cpu())
        client_lr = self.hparams.client_lr * self.decay.client_scale
        server_lr = self.hparams.server_lr * self.decay.server_scale
        ctx = RoundContext(
            self.runner, self.loss_of, data, self.task, client_lr, server_lr, t, cfg.seed
        )
        measured = self._apply_measuring(cohort, ctx)
        if measured is None:
            x = self.algorithm.broadcast(self.state)
            losses = client_mean_losses(
                self.per_example_loss, x, data, cohort.clients.cpu(), cfg.train.eval_batch_size
            )
        else:
            state, diag, losses = measured
        client_loss = float((cohort.weights * losses).sum())
        self.initial_loss, why = divergence(
            client_loss, self.initial_loss, cfg.train.divergence_factor, t
        )
        if why is not None:
            self.outcome, self.reason = Outcome.DIVERGED, why
            return None
        if measured is None:
            state, diag = self.algorithm.apply(self.state, cohort, ctx)
        self.state = state
        # an algorithm that sets its own rates (e.g. MaSS with mass_auto) reports those in force
        client_lr = float(diag.pop("client_lr", client_lr))
        server_lr = float(diag.pop("server_lr", server_lr))
        del data, ctx
        self._last_view = None  # free the cohort's tensors before the population evaluation
        self.decay.observe(client_loss)
        self._examples += self._round_examples(cohort)
        train_loss, test, evaluated = None, {}, {}
        if t == 0 or (t + 1) % cfg.train.eval_every == 0 or t + 1 == cfg.train.rounds:
            train_loss, test, evaluated = self._evaluate(t)
        self._wall += time.perf_counter() - start
        extra = {k: float(v) for k, v in diag.items() if k != "update_norm"} | evaluated
        extra[RUNNER_METRIC] = float(self.runner_name == "vectorized")
        if cohort.steps is not None:
            extra.update(step_summary(cohort.steps))
        record = RoundRecord(
            round=t + 1,
            client_loss=client_loss,
            update_norm=float(diag["update_norm"]),
            client_lr=client_lr,
            server_lr=server_lr,
            examples=self._examples,
            wall_time=self._wall,
            train_loss=train_loss,
            test=test,
            extra=extra,
        )
        self.records.append(record)
        if self.round >= cfg.train.rounds:
            self.outcome = Outcome.COMPLETED
        return record

    def _apply_measuring(self, cohort: Cohort, ctx: RoundContext):
        """The round run by an algorithm whose first local steps give ℓ_t (new state,
        diagnostics, the clients' losses), or None: ℓ_t needs its own pass."""
        alg = self.algorithm
        if not (self.measure_in_first_step and isinstance(alg, MeasuringAlgorithm)):
            return None
        if not alg.measures_client_losses(cohort, ctx):
            return None
        return alg.apply_measuring(self.state, cohort, ctx)

    @staticmethod
    def _round_examples(cohort: Cohort) -> int:
        if cohort.steps is None:
            return cohort.size * int(cohort.batches.shape[1] * cohort.batches.shape[2])
        return int(cohort.steps.sum()) * int(cohort.batches.shape[2])

    def _evaluate(self, t: int) -> tuple[float | None, dict[str, float], dict[str, float]]:
        """Population loss per ``train.eval_population`` (full, a sample E_t from the data seed
        and round ``t``, or off), test metrics, and ``{"eval_clients": |E_t|}`` (0 when off)."""
        params, train = self.state.params, self.config.train
        bs = train.eval_batch_size
        train_loss, evaluated = None, 0
        population = evaluation_population(train, self.config.task.seed, t, self.data.num_clients)
        if population is not None:
            clients, evaluated = population
            train_loss = population_loss(self.per_example_loss, params, self.data, bs, clients)
        test: dict[str, float] = {}
        if self.test is not None:
            metrics = {k: self._metric(f) for k, f in self.task.metric_fns.items()}
            test = dataset_metrics(self.per_example_loss, metrics, params, self.test, bs)
        return train_loss, test, {EVAL_CLIENTS_METRIC: float(evaluated)}

    def stop(self, reason: str = "stopped by caller") -> None:
        """End the trial as ``stopped`` unless it has already ended.

        Args:
            reason: Why, as the result reports it.
        """
        if self.outcome is None:
            self.outcome = Outcome.STOPPED
            self.reason = reason

    @property
    def runner_name(self) -> str:
        """The runner that ran the last round: ``vectorized``, ``sequential`` or
        ``sequential(fallback)`` (the vectorized runner fell back)."""
        return getattr(self.runner, "effective_name", self.runner.name)

    def result(self) -> TrialResult:
        """Give the trial's result so far (``stopped`` while it has not ended).

        Returns:
            The outcome, the round records, the configuration and where it ran.
        """
        return TrialResult(
            outcome=self.outcome or Outcome.STOPPED,
            records=list(self.records),
            config=self.config.to_dict(),
            runner=self.runner_name,
            device=str(self.device),
            decays=self.decay.decays,
            reason=self.reason,
        )

    # -- checkpointing ----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Checkpoint the whole run state, to continue exactly as an uninterrupted run.

        Returns:
            A copy of the model, server-optimizer and algorithm state, the decay controller,
            the records and the configuration.
        """
        return copy.deepcopy(
            {
                "version": _STATE_VERSION,
                "config": self.config.to_dict(),
                "params": self.state.params,
                "opt_state": self.state.opt_state,
                "extra": self.state.extra,
                "decay": self.decay.state_dict(),
                "records": [r.as_dict() for r in self.records],
                "initial_loss": self.initial_loss,
                "wall": self._wall,
                "examples": self._examples,
                "outcome": None if self.outcome is None else str(self.outcome),
                "reason": self.reason,
            }
        )

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a checkpoint of :meth:`state_dict`.

        Args:
            state: The checkpoint; it may differ from this configuration only in
                ``train.rounds``, ``train.device`` and ``train.runner``.

        Raises:
            ConfigError: An unsupported checkpoint version, or a different configuration.
        """
        if state.get("version") != _STATE_VERSION:
            raise ConfigError(
                "checkpoint", f"unsupported checkpoint version {state.get('version')}"
            )
        mine = self.config
        try:
            theirs = parse_trial_config(state["config"])
        except ConfigError:
            theirs = None
        if theirs is not None:  # the fields a resumed run may change take this run's values
            free = {k: getattr(mine.train, k) for k in ("rounds", "device", "runner")}
            theirs = dataclasses.replace(theirs, train=dataclasses.replace(theirs.train, **free))
        if theirs != mine:
            raise ConfigError("checkpoint", "was written by a different configuration")
        state = copy.deepcopy(dict(state))
        self.state.params = _to_device(state["params"], self.device)
        self.state.opt_state = _to_device(state["opt_state"], self.device)
        self.state.extra = _to_device(state["extra"], self.device)
        self.decay.load_state_dict(state["decay"])
        self.records = [RoundRecord.from_dict(r) for r in state["records"]]
        self.initial_loss = state["initial_loss"]
        self._wall = float(state["wall"])
        self._examples = int(state["examples"])
        saved = state["outcome"]
        self.outcome = None if saved in (None, Outcome.STOPPED) else Outcome(saved)
        if self.outcome is None and self.round >= self.config.train.rounds:
            self.outcome = Outcome.COMPLETED
        self.reason = state["reason"]


def cohort_rows(
    config: TrialConfig,
    num_batches: int,
    local_steps: int,
    t: int,
    clients: torch.Tensor,
    data: InMemoryData,
    client_sizes: torch.Tensor,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Give the batch rows of round ``t``'s cohort for one trial (its seed and local work).

    With ``train.local_epochs`` client i runs τ_i = ⌈E·n_i/B⌉ steps and its rows are padded to
    ``[M, K_max + extra, B]`` (``extra`` = the batches the algorithm draws besides its local
    steps, e.g. FedGA's g_i(x) batch; see ``steps.py``); otherwise every client draws
    ``num_batches`` batches.

    Args:
        config: The trial's configuration (its seed and ``train`` section).
        num_batches: Batches the algorithm draws per client (K, or K + extra).
        local_steps: The algorithm's K.
        t: The round's index.
        clients: The cohort's global client indices ``[M]``.
        data: The cohort view (its clients addressed by global index).
        client_sizes: Every client's number of examples (the whole population).

    Returns:
        The local steps τ_i ``[M]`` (None: every client runs K) and the rows ``[M, nb, B]``.

    Raises:
        ConfigError: ``batch_sampling: full`` with sampled clients of unequal sizes.
    """
    train = config.train
    if train.local_epochs is not None:
        counts = data.counts[clients]
        steps = epoch_steps(counts, train.local_epochs, train.batch_size)
        batches = padded_batches(
            config.seed,
            t,
            clients,
            data.offsets[clients],
            counts,
            steps,
            num_batches - local_steps,
            train.batch_size,
            train.batch_sampling,
        )
        return steps, batches
    if train.batch_sampling == "full" and len(set(client_sizes[clients].tolist())) != 1:
        raise ConfigError("train.batch_sampling", "'full' needs sampled clients of equal size")
    batches = cohort_batch_indices(
        config.seed,
        t,
        clients,
        data.offsets[clients],
        data.counts[clients],
        num_batches,
        train.batch_size,
        train.batch_sampling,
    )
    return None, batches


def _to_device(tree: Any, device: torch.device) -> Any:
    if torch.is_tensor(tree):
        return tree.to(device)
    if isinstance(tree, dict):
        return {k: _to_device(v, device) for k, v in tree.items()}
    return tree


def run_trial(
    config: TrialConfig | Mapping[str, Any],
    on_round: OnRound | None = None,
    *,
    task: Task | None = None,
    resume_from: Mapping[str, Any] | None = None,
) -> TrialResult:
    """Train one configuration.

    Args:
        config: The trial's configuration, parsed or as a mapping.
        on_round: Called with each round's record; returning False stops the trial
            (``stopped``).
        task: The task, already built (None: built from ``config.task``).
        resume_from: A checkpoint of :meth:`Trainer.state_dict` to continue from.

    Returns:
        The trial's outcome and its round records.

    Raises:
        ConfigError: An invalid configuration or checkpoint.

    Example:
        ```python
        config = yaml.safe_load(Path("examples/train-quadratic-fedprox.yaml").read_text())
        result = run_trial(config, on_round=lambda record: record.round < 50)
        ```
    """
    trainer = Trainer(config, task=task)
    if resume_from is not None:
        trainer.load_state_dict(resume_from)
    while not trainer.done:
        record = trainer.step()
        if record is not None and on_round is not None and on_round(record) is False:
            trainer.stop()
    return trainer.result()
