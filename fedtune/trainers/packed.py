"""Packed trials: one process trains P configurations of the same task and algorithm at once.

A study's configurations differ only in searched scalars (γ, η, β, α, the server optimizer's
constants, the decay rule, K or E, the trial seed); the data, the split and each round's cohort
come from the data seed and are the same for all of them (Charles & Konečný 2020
(arXiv:2007.00878) §8). :class:`PackedTrainer` runs :class:`~fedtune.trainers.engine.Trainer`'s
round (docs/explanation/algorithms.md §1.3 and §2) for P configurations at once, the members
(and, for the local steps, their clients) being a leading batch dimension:

1. the cohort I_t is sampled once (the data seed and t); every member's ℓ_t is evaluated at its
   broadcast model in one pass, ``[M, P]``;
2. a member with non-finite ℓ_t or ℓ_t > divergence_factor·ℓ_1 ends as ``diverged`` and leaves
   the pack (its rows are dropped from the stacked state, so it consumes no more compute and
   cannot spoil the others: no reduction mixes members);
3. each member's batches are drawn from its own trial seed, K_p (or τ_i = ⌈E_p·n_i/B⌉) local
   steps padded to the pack's K_max with a step mask, and its Θ row; the masked client function
   (:func:`~fedtune.trainers.client.make_packed_client_fn`) runs the P·M (member, client) pairs
   as one batch, with γ_t and α per pair: their losses vmapped, their gradients from one
   backward pass of the losses' sum (each pair's loss depends on its own parameters only);
4. the weighted mean q_p = Σ_i w_i q_{p,i}, taken per chunk of members right after their local
   steps (or the recipe's ``packed_aggregator`` over every member's messages), and the server
   optimizer's step (:func:`~fedtune.trainers.server_opt.make_server_opt`, built inside the
   vmap with β, β₁, β₂, ε as per-member tensors), vmapped over the members;
5. each member's :class:`~fedtune.trainers.decay.DecayController` (a small Python state
   machine) observes its ℓ_t and gives the next round's [P] rate multipliers;
6. on evaluation rounds the population loss and the test metrics of every evaluated member come
   from one pass over the data, ``[N, P]``.

Each member's curve equals its own unpacked run up to float rounding (≤ 1e-12 relative in
float64: tests/unit/test_packed_exactness.py). Members are stopped individually
(:meth:`PackedTrainer.stop`) and a pack takes new members (:meth:`PackedTrainer.add`); members
at different rounds (after a refill) form one group per round index, since their cohorts
differ, and with in-memory data the local steps of every group still run as one batch of pairs
(each pair reads its own rows of the same data).

What packs is what the recipe declares (``Recipe.round_form``, ``Recipe.packable``,
``Recipe.member_hparams``): the LocalUpdate family with the weighted mean, or with an aggregator
that comes with its form over stacked members (``packed_aggregator``), and a recipe's own
``build`` that says ``packable=True`` and returns such a LocalUpdate (checked as each member
joins: :func:`~.pack_rules.packed_round`). :func:`pack_refusal` says why anything else does not,
in one line, and the caller runs it one configuration per process. Imports nothing from Ray,
MLflow or FastAPI.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import torch
from torch.func import functional_call, vmap
from torch.utils import _pytree as pytree

from fedtune.errors import ConfigError

from .algorithms import get_recipe, resolve
from .allocator import keep_freed_memory
from .config import TrialConfig
from .decay import DecayController
from .engine import EVAL_CLIENTS_METRIC, RUNNER_METRIC, Trainer, pick_device
from .evaluation import client_mean_losses, members_evaluation
from .model_check import check_model_outputs
from .module_loss import ModuleLoss
from .pack_batches import BatchRows, round_clients
from .pack_clients import PackedClients
from .pack_graph import Capture, ReplayedCalls, capture_for
from .pack_rules import pack_key, pack_refusal, packed_round, parse
from .pack_state import Group, Index, Member, Params, member_weights, pad_steps, stacked_rows
from .records import Outcome, RoundRecord, TrialResult
from .server_opt import make_server_opt
from .steps import step_summary
from .tasks import InMemoryData, Task, build_task

__all__ = ["PACKED_RUNNER", "PackedTrainer", "pack_key", "pack_refusal"]

#: the runner name a packed member's result reports
PACKED_RUNNER = "packed"
#: the server optimizer's constants, passed to it as per-member tensors
_SERVER_CONSTS = ("server_momentum", "server_beta1", "server_beta2", "server_eps")


class PackedTrainer:
    """Train P configurations of one task and algorithm in one process, round by round.

    Args:
        configs: The configurations (parsed or mappings); every one packable
            (:func:`pack_refusal`) with the same :func:`pack_key`.
        task: The task, already built (None: built from the first configuration).
        chunk: Run the clients of at most this many members per vmapped call. None: all at
            once on a GPU; on a CPU as many as keep one client state ``[chunk, M, parameters]``
            within :data:`~.pack_clients.CPU_CHUNK_BYTES` (the digits MLP's pack of 64 ran 2×
            faster in chunks of 16 than all at once while its freed memory went back to the
            kernel; now that a CPU pack keeps it, chunks of 16, 32 and 64 run within 10 % of
            one another: benchmarks/results/packing_chunks.json). The numbers do not change.
        graphs: On a GPU, with the data in memory, record the local steps of a round as a
            CUDA graph, once per shape, and replay it (:mod:`~fedtune.trainers.pack_graph`).
            The numbers do not change.
        rows_ahead: With the data in memory, draw the next round's batch rows while a round's
            local steps run (on a GPU they are queued and the host is free:
            :class:`~.pack_batches.BatchRows`). The rows do not change.

    Raises:
        ConfigError: No configuration, one that cannot be packed, or keys that differ.
    """

    def __init__(
        self,
        configs: Sequence[TrialConfig | Mapping[str, Any]],
        task: Task | None = None,
        chunk: int | None = None,
        graphs: bool = True,
        rows_ahead: bool = True,
    ) -> None:
        self.chunk, self.graphs = chunk, graphs
        parsed = [parse(c) for c in configs]
        if not parsed:
            raise ConfigError("pack", "needs at least one configuration")
        first = parsed[0]
        self.key = pack_key(first)
        #: the recipe's aggregator over stacked members; None: the weighted mean, taken per
        #: chunk of members right after their local steps
        recipe = get_recipe(first.algorithm)
        self._aggregate = recipe.packed_aggregator
        #: what the aggregator reads of each member's hyperparameters (``aggregator_hparams``)
        self._aggregate_reads = recipe.aggregator_hparams
        self.task = (
            task
            if task is not None
            else build_task(first.task.name, first.task.params, first.task.seed)
        )
        self.device = pick_device(first.train.device)
        if self.device.type == "cpu":
            keep_freed_memory()
        self.dtype = torch.float64 if first.train.dtype == "float64" else torch.float32
        self.data = self.task.train.to(self.device, self.dtype)
        self.test = None if self.task.test is None else self.task.test.to(self.device, self.dtype)
        self._rows = BatchRows(self.data, rows_ahead, self.dtype, self.device)
        self._module = self.task.model_fn(torch.Generator().manual_seed(first.seed)).to(
            device=self.device, dtype=self.dtype
        )
        self.loss_of = ModuleLoss(self._module, self.task.loss_fn)
        self._server_name: tuple[str, str] | None = None
        self._members: list[Member] = []
        self._slots: list[int] = []  # member index of each row of the stacked state
        self.params: Params = {}
        self.opt_state: Any = None
        self._local: PackedClients | None = None  # the local steps, built with the first member
        self._packed_loss = vmap(self.loss_of.per_example, in_dims=(0, None, None), out_dims=1)
        self._metrics = {
            name: vmap(self._metric(fn), in_dims=(0, None, None), out_dims=1)
            for name, fn in self.task.metric_fns.items()
        }
        self._wall = 0.0
        for cfg in parsed:
            self.add(cfg)

    # -- membership -----------------------------------------------------------------------
    def add(self, config: TrialConfig | Mapping[str, Any]) -> int:
        """Take a new member (a refill): it starts at round 0 with its own initial model.

        Args:
            config: Its configuration; packable, with this pack's :func:`pack_key`.

        Returns:
            The member's index (for :meth:`stop`, :meth:`result`, :meth:`step`'s list).

        Raises:
            ConfigError: It cannot be packed, or its key differs from the pack's.
        """
        cfg = parse(config)
        reason = pack_refusal(cfg)
        if reason:
            raise ConfigError("pack", reason)
        if pack_key(cfg) != self.key:
            raise ConfigError(
                "pack", "configurations differ in more than their searched scalars (pack_key)"
            )
        algorithm, hp, local_steps = resolve(cfg, self.task)
        packed_round(cfg, algorithm, hp)  # the form the pack runs in its place
        gen = torch.Generator().manual_seed(cfg.seed)
        model = self.task.model_fn(gen).to(device=self.device, dtype=self.dtype)
        params = {n: p.detach().clone() for n, p in model.named_parameters()}
        if not self._members:
            check_model_outputs(self.task, self._module, params, self.data)
            self._server_name = (hp.server_opt, hp.nesterov_form)
        state = algorithm.init(params)
        decay = DecayController(cfg.decay, base_rates=(hp.client_lr, hp.server_lr))
        self._members.append(Member(cfg, hp, algorithm, local_steps, decay))
        row = {"params": state.params, "opt": state.opt_state}
        if not self._slots:
            stacked = pytree.tree_map(lambda v: v.unsqueeze(0), row)
        else:
            current = {"params": self.params, "opt": self.opt_state}
            stacked = pytree.tree_map(lambda s, v: torch.cat([s, v.unsqueeze(0)]), current, row)
        self.params, self.opt_state = stacked["params"], stacked["opt"]
        self._slots.append(len(self._members) - 1)
        return len(self._members) - 1

    def stop(self, i: int, reason: str = "stopped by caller") -> None:
        """End member ``i`` as ``stopped`` unless it has ended; it consumes no more compute.

        Args:
            i: The member's index.
            reason: Why, as its result reports it.
        """
        member = self._members[i]
        if member.outcome is None:
            member.outcome = Outcome.STOPPED
            member.reason = reason
        self._drop([i])

    def _drop(self, members: Sequence[int]) -> None:
        """Remove members' rows from the stacked state."""
        gone = set(members)
        keep = [pos for pos, i in enumerate(self._slots) if i not in gone]
        if len(keep) == len(self._slots):
            return
        self._slots = [self._slots[pos] for pos in keep]
        stacked = stacked_rows({"params": self.params, "opt": self.opt_state}, keep)
        self.params, self.opt_state = stacked["params"], stacked["opt"]

    @property
    def size(self) -> int:
        """The number of members (ended ones included)."""
        return len(self._members)

    @property
    def active(self) -> list[int]:
        """The indices of the members still training."""
        return list(self._slots)

    @property
    def step_graphs(self) -> ReplayedCalls | None:
        """The recorded local steps (None: not recorded, or no round has run yet)."""
        return None if self._local is None else self._local.replayed

    @property
    def done(self) -> bool:
        """Whether every member has ended."""
        return not self._slots

    def outcome(self, i: int) -> tuple[Outcome | None, str]:
        """Give member ``i``'s outcome (None while it trains) and the reason it ended."""
        m = self._members[i]
        return m.outcome, m.reason

    def decays(self, i: int) -> int:
        """Give how many times member ``i``'s rates have decayed."""
        return self._members[i].decay.decays

    def member_params(self, i: int) -> Params:
        """Give an active member's model parameters.

        Args:
            i: The member's index.

        Returns:
            Its parameters by name (views into the stacked state).
        """
        pos = self._slots.index(i)
        return {k: v[pos] for k, v in self.params.items()}

    # -- one round ------------------------------------------------------------------------
    def _metric(self, fn):
        return lambda params, x, y: fn(functional_call(self._module, params, (x,)), y)

    def _server_opt(self, consts: Mapping[str, torch.Tensor]):
        assert self._server_name is not None
        name, form = self._server_name
        hp = SimpleNamespace(
            server_opt=name, nesterov_form=form, server_bias_correction=False, **consts
        )
        return make_server_opt(hp)

    def _broadcast(self, params, opt_state, consts):
        return vmap(lambda p, s, c: self._server_opt(c).broadcast(p, s))(params, opt_state, consts)

    def _server_step(self, params, opt_state, q, lr, consts):
        return vmap(lambda p, s, g, r, c: self._server_opt(c).step(p, s, g, r))(
            params, opt_state, q, lr, consts
        )

    def _vector(self, values: Sequence[float], dtype=torch.float64) -> torch.Tensor:
        return torch.tensor(list(values), dtype=dtype, device=self.device)

    def step(self) -> list[RoundRecord | None]:
        """Run one round of every active member.

        Members at different rounds (after a refill) form one group per round index, each with
        its own cohort; their local steps still run as one batch of (member, client) pairs when
        the data is in memory (every cohort is then a view of the same rows).

        Returns:
            One entry per member (by index): its round's record, or None when it did not run
            a round (ended before, or diverged in this round).

        Raises:
            RuntimeError: Every member has ended.
        """
        if self.done:
            raise RuntimeError("every member of the pack has ended")
        start = time.perf_counter()
        out: list[RoundRecord | None] = [None] * len(self._members)
        by_round: dict[int, list[int]] = {}
        for pos, i in enumerate(self._slots):
            by_round.setdefault(self._members[i].round, []).append(pos)
        groups = [g for t in sorted(by_round) if (g := self._open(t, by_round[t])) is not None]
        messages = self._local_steps(groups)  # on a GPU queued: the host is free until _close
        self._rows.ahead(
            (g.t + 1, [m for m in g.members if g.t + 1 < m.config.train.rounds]) for g in groups
        )
        for group, q in zip(groups, messages, strict=True):
            self._close(group, q, out, start)
        self._wall += time.perf_counter() - start
        self._drop([i for i in self._slots if self._members[i].done])
        return out

    def _take(self, tree: Any, positions: list[int]) -> Any:
        if positions == list(range(len(self._slots))):
            return tree
        return stacked_rows(tree, positions)

    def _put(self, positions: list[int], params: Params, opt_state: Any) -> None:
        if positions == list(range(len(self._slots))):
            self.params, self.opt_state = params, opt_state
            return
        index = Index(positions)
        pytree.tree_map(
            lambda dst, src: dst.index_copy_(0, index.on(dst.device), src),
            {"params": self.params, "opt": self.opt_state},
            {"params": params, "opt": opt_state},
        )

    def _open(self, t: int, positions: list[int]) -> Group | None:
        """Round ``t`` of the members at ``positions`` up to their local steps: the cohort, the
        broadcast, ℓ_t and the divergence test, every member's batch rows (None: all diverged)."""
        members = [self._members[self._slots[p]] for p in positions]
        train = members[0].config.train
        clients = round_clients(members, t, self.data.num_clients)
        data = self.data.cohort(clients)
        counts = self.data.client_sizes[clients].to(self.dtype)
        weights = counts if train.weighting == "examples" else torch.ones_like(counts)
        weights = (weights / weights.sum()).to(self.device)
        params, opt_state = (
            self._take(self.params, positions),
            self._take(self.opt_state, positions),
        )
        consts = {k: self._vector([getattr(m.hparams, k) for m in members]) for k in _SERVER_CONSTS}
        x = self._broadcast(params, opt_state, consts)
        losses = client_mean_losses(self._packed_loss, x, data, clients, train.eval_batch_size)
        client_loss = (weights * losses.T.contiguous()).sum(1).tolist()
        alive = [g for g, m in enumerate(members) if not m.diverges(t, client_loss[g])]
        if not alive:
            return None
        if len(alive) < len(members):
            params, opt_state, x, consts = stacked_rows((params, opt_state, x, consts), alive)
            members = [members[g] for g in alive]
            positions = [positions[g] for g in alive]
            client_loss = [client_loss[g] for g in alive]
        rows, steps, thetas, cohorts = self._rows.group(members, t, clients, data, weights)
        return Group(
            t=t,
            positions=positions,
            members=members,
            data=data,
            weights=weights,
            params=params,
            opt_state=opt_state,
            consts=consts,
            x=x,
            client_loss=client_loss,
            client_lr=[m.hparams.client_lr * m.decay.client_scale for m in members],
            rows=rows,
            steps=steps,
            thetas=thetas,
            cohorts=cohorts,
        )

    def _local_steps(self, groups: list[Group]) -> list[Params]:
        """Every group's aggregated client message ``q [G, …]``: all groups' (member, client)
        pairs in one batch when they read the same rows (in-memory data), else group by group."""
        if len(groups) > 1 and all(g.data is groups[0].data for g in groups):
            k_max = max(g.rows.shape[2] for g in groups)
            merged = self._clients()(
                client_lr=[lr for g in groups for lr in g.client_lr],
                alphas=[m.hparams.prox_alpha for g in groups for m in g.members],
                x={k: torch.cat([g.x[k] for g in groups]) for k in groups[0].x},
                rows=torch.cat([pad_steps(g.rows, k_max) for g in groups]),
                steps=torch.cat([g.steps for g in groups]),
                thetas=torch.cat([pad_steps(g.thetas, k_max, zero=True) for g in groups]),
                weights=torch.cat([member_weights(g) for g in groups]),
                data=groups[0].data,
            )
            split = {k: torch.split(v, [len(g.members) for g in groups]) for k, v in merged.items()}
            return [{k: split[k][j] for k in merged} for j in range(len(groups))]
        return [
            self._clients()(
                g.client_lr,
                [m.hparams.prox_alpha for m in g.members],
                g.x,
                g.rows,
                g.steps,
                g.thetas,
                member_weights(g),
                g.data,
            )
            for g in groups
        ]

    def _clients(self) -> PackedClients:
        """The pack's local steps (built with its first member's client rule)."""
        if self._local is None:
            units, averaged = self._members[0].algorithm.rule.units, self._aggregate is None
            self._local = PackedClients(
                self.loss_of, units, averaged, self.device, self.dtype, self.chunk, self._capture()
            )
        return self._local

    def _capture(self) -> Capture | None:
        """How the local steps are recorded (:func:`~.pack_graph.capture_for`)."""
        return capture_for(self.device, isinstance(self.data, InMemoryData), self.graphs)

    def _close(self, group: Group, q: Params, out: list, start: float) -> None:
        """Round ``group.t`` of a group after its local steps: the aggregation ``q`` (the
        weighted mean, already taken, or the recipe's ``packed_aggregator`` of the messages
        ``[G, M, …]``), the server step, the evaluation and every member's record."""
        t, members, train = group.t, group.members, group.members[0].config.train
        client_lr = group.client_lr
        diagnostics: dict[str, list[float]] = {}
        if self._aggregate is not None:
            reads = {
                name: self._vector([float(getattr(m.hparams, name)) for m in members])
                for name in self._aggregate_reads
            }
            q, diag = self._aggregate(
                q, group.weights, group.steps, self._vector(client_lr, self.dtype), **reads
            )
            diagnostics = {k: [float(x) for x in v.tolist()] for k, v in diag.items()}
        server_lr = [m.hparams.server_lr * m.decay.server_scale for m in members]
        norms = torch.sqrt(
            sum((v.double() ** 2).reshape(v.shape[0], -1).sum(1) for v in q.values())
        ).tolist()
        params, opt_state = self._server_step(
            group.params, group.opt_state, q, self._vector(server_lr), group.consts
        )
        self._put(group.positions, params, opt_state)
        evaluate = [
            g
            for g, m in enumerate(members)
            if t == 0 or (t + 1) % train.eval_every == 0 or t + 1 == m.config.train.rounds
        ]
        evaluated = {}
        if evaluate:
            seed = self._members[0].config.task.seed
            found = members_evaluation(
                self._packed_loss,
                self._metrics,
                params,
                evaluate,
                self.data,
                self.test,
                train,
                t,
                seed,
            )
            evaluated = {
                g: (loss, test, {EVAL_CLIENTS_METRIC: n}) for g, (loss, test, n) in found.items()
            }
        for g, m in enumerate(members):
            m.decay.observe(group.client_loss[g])
            m.examples += Trainer._round_examples(group.cohorts[g])
            train_loss, test, extra = evaluated.get(g, (None, {}, {}))
            extra = {**{k: v[g] for k, v in diagnostics.items()}, **extra}
            extra[RUNNER_METRIC] = 1.0
            if group.cohorts[g].steps is not None:
                extra.update(step_summary(group.cohorts[g].steps))
            record = RoundRecord(
                round=t + 1,
                client_loss=group.client_loss[g],
                update_norm=norms[g],
                client_lr=client_lr[g],
                server_lr=server_lr[g],
                examples=m.examples,
                wall_time=m.wall + time.perf_counter() - start,
                train_loss=train_loss,
                test=test,
                extra=extra,
            )
            m.wall = record.wall_time
            m.records.append(record)
            if m.round >= m.config.train.rounds:
                m.outcome = Outcome.COMPLETED
            out[self._slots[group.positions[g]]] = record

    # -- results --------------------------------------------------------------------------
    def result(self, i: int) -> TrialResult:
        """Give member ``i``'s result so far (``stopped`` while it has not ended).

        Args:
            i: The member's index.

        Returns:
            Its outcome, round records and configuration, as :meth:`Trainer.result` gives.
        """
        m = self._members[i]
        return TrialResult(
            outcome=m.outcome or Outcome.STOPPED,
            records=list(m.records),
            config=m.config.to_dict(),
            runner=PACKED_RUNNER,
            device=str(self.device),
            decays=m.decay.decays,
            reason=m.reason,
        )

    def results(self) -> list[TrialResult]:
        """Give every member's result, by index."""
        return [self.result(i) for i in range(len(self._members))]
