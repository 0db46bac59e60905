"""The study spec, :class:`StudySpec`: a trial configuration plus what to search and how."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import (
    Field,
    FieldSerializationInfo,
    PrivateAttr,
    ValidationError,
    field_serializer,
    model_validator,
)

from fedtune.errors import ConfigError
from fedtune.search_spaces import SearchSpace, resolve_path
from fedtune.trainers.algorithms.registry import (
    get_recipe,
)
from fedtune.trainers.code import CodeSpec, LoadReport, load_code
from fedtune.trainers.config import (
    DecayConfig,
    TaskConfig,
    TrainConfig,
    TrialConfig,
)
from fedtune.trainers.typed import config_error, replace_fields, to_dict

from ..strategies import DEFAULT_STRATEGY, STRATEGIES, SamplerName, SchedulerName, Strategy
from . import checks
from .sections import (
    NAME_PATTERN,
    BudgetSpec,
    Count,
    ObjectiveSpec,
    ResourcesSpec,
    SamplerSpec,
    SchedulerSpec,
    SearchSpec,
    TrackingSpec,
    TradeoffSpec,
    _Spec,
    default_round_counts,
)
from .trial_parts import GIVEN_SECTIONS, Decay, Task, Train, written_keys

__all__ = ["StudySpec"]


class StudySpec(_Spec):
    """A study: a trial configuration plus what to search, how, and what to measure.

    Build one with :meth:`from_dict` or :meth:`from_file`, which also validate it.
    """

    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    description: str = ""
    task: Task
    algorithm: str
    train: Train = Field(default_factory=TrainConfig)
    hparams: dict[str, Any] = Field(default_factory=dict)
    decay: Decay = Field(default_factory=DecayConfig)
    seed: Annotated[int, Field(strict=True)] | None = None
    seeds: list[Annotated[int, Field(strict=True)]] | None = None
    search: SearchSpec = Field(default_factory=SearchSpec)
    objective: ObjectiveSpec = Field(default_factory=ObjectiveSpec)
    sampler: SamplerSpec = Field(default_factory=SamplerSpec)
    scheduler: SchedulerSpec = Field(default_factory=SchedulerSpec)
    budget: BudgetSpec = Field(default_factory=BudgetSpec)
    report_every: Count = 1
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    tracking: TrackingSpec = Field(default_factory=TrackingSpec)
    tradeoff: TradeoffSpec = Field(default_factory=TradeoffSpec)
    code: CodeSpec | None = None
    #: the service's project the study belongs to (who may see and change it, whose quota it
    #: uses; default ``default``) and its priority within the project (bounded by the project's
    #: ``max_priority``). ``fedtune tune`` keeps them and ignores them.
    project: (
        Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)] | None
    ) = None
    priority: Annotated[int, Field(strict=True, ge=-1000, le=1000)] = 0

    _base_dir: Path | None = PrivateAttr(default=None)
    _source: str | None = PrivateAttr(default=None)
    #: the keys the user wrote in each of :data:`GIVEN_SECTIONS`, in their order
    _given: dict[str, tuple[str, ...]] = PrivateAttr(default_factory=dict)
    _base_config: TrialConfig | None = PrivateAttr(default=None)

    @model_validator(mode="wrap")
    @classmethod
    def _keep_given_keys(cls, data: Any, handler: Any) -> StudySpec:
        spec = handler(data)
        if isinstance(data, Mapping):
            given = {}
            for section in GIVEN_SECTIONS:
                given[section] = written_keys(data.get(section))
            spec._given = given
        return spec

    @model_validator(mode="after")
    def _defaults_fit_the_rounds(self) -> StudySpec:
        """Unwritten round counts are :func:`default_round_counts` of ``train.rounds`` where
        the fixed defaults would exceed it (a written one is kept, and refused by
        :meth:`validate_deep` under its own name if it does not fit)."""
        last, grace = default_round_counts(self.train.rounds, self.scheduler.reduction_factor)
        for section, key, value in (
            ("objective", "last_rounds", last),
            ("scheduler", "grace_rounds", grace),
        ):
            part = getattr(self, section)
            if key not in part.model_fields_set and getattr(part, key) != value:
                object.__setattr__(self, section, part.model_copy(update={key: value}))
        return self

    @field_serializer(*GIVEN_SECTIONS)
    def _write_given_keys(self, value: Any, info: FieldSerializationInfo) -> dict[str, Any]:
        return self.section(info.field_name)

    @model_validator(mode="after")
    def _seeds(self) -> StudySpec:
        if self.seeds is not None:
            if self.seed is not None:
                raise ConfigError("seeds", "give either seed or seeds")
            if not self.seeds or len(set(self.seeds)) != len(self.seeds):
                raise ConfigError("seeds", "must be a non-empty list of distinct seeds")
        return self

    @model_validator(mode="after")
    def _strategy(self) -> StudySpec:
        chosen = self.search.strategy
        if chosen is None:
            return self
        for section, part in (("sampler", self.sampler), ("scheduler", self.scheduler)):
            if part.name is not None:
                raise ConfigError(
                    "search.strategy",
                    f"strategy {chosen} sets the sampler and the scheduler; remove "
                    f"{section}.name = {part.name} (or the strategy, to combine them freely)",
                )
        if STRATEGIES[chosen].own_stop_rule and self.objective.is_multi:
            raise ConfigError(
                "search.strategy",
                f"{chosen} stops trials on one selection-rule value; with objective.metrics use "
                "tpe, random or sampler/scheduler",
            )
        return self

    # ------------------------------------------------------------ strategy

    @property
    def strategy(self) -> Strategy | None:
        """The search strategy (None: ``sampler`` and ``scheduler`` as given).

        A single-objective study that names none of the three gets :data:`DEFAULT_STRATEGY`.
        """
        if self.search.strategy is not None:
            return self.search.strategy
        named = self.sampler.name is not None or self.scheduler.name is not None
        return None if named or self.objective.is_multi else DEFAULT_STRATEGY

    @property
    def sampler_name(self) -> SamplerName:
        """The sampler the study uses (the strategy's, else ``sampler.name``)."""
        strategy = self.strategy
        if strategy is None:
            return self.sampler.name or SamplerName.TPE
        return STRATEGIES[strategy].sampler

    @property
    def scheduler_name(self) -> SchedulerName | None:
        """The named scheduler: ``asha``, ``median`` or ``none`` (None: the strategy's own stop
        rule)."""
        strategy = self.strategy
        if strategy is None:
            return self.scheduler.name or SchedulerName.ASHA
        return STRATEGIES[strategy].scheduler

    # ------------------------------------------------------------ construction

    @classmethod
    def parse(
        cls, data: Any, *, base_dir: str | Path | None = None, source: str | None = None
    ) -> StudySpec:
        """Build a spec from its decoded YAML or JSON, checking its shape only.

        Every section is parsed into its type (the engine's ``TaskConfig``, ``TrainConfig`` and
        ``DecayConfig`` for ``task``, ``train`` and ``decay``); nothing is imported or read, so
        this is cheap. :meth:`check` completes the validation.

        Args:
            data: The spec, a mapping.
            base_dir: The directory that paths of user space files and of ``code.path`` are
                relative to (None: the working directory).
            source: The file the spec came from, named in errors.

        Returns:
            The spec.

        Raises:
            ConfigError: An invalid field, named by its dotted path.
        """
        try:
            spec = cls.model_validate(data)
        except ValidationError as exc:
            error = config_error(exc, model=cls)
            raise (error.with_source(source) if source else error) from None
        spec._base_dir = Path(base_dir) if base_dir is not None else None
        spec._source = source
        return spec

    def check(self) -> None:
        """Import the ``code`` section, then run :meth:`validate_deep`.

        Raises:
            ConfigError: An invalid field, named by its dotted path (a ``CodeError`` for user
                code that fails to import or register), attributed to the spec's file.
        """
        try:
            self.load_code()
            self.validate_deep()
        except ConfigError as exc:
            if self._source and not exc.source:
                raise exc.with_source(self._source) from None
            raise

    @classmethod
    def from_dict(
        cls,
        data: Any,
        *,
        base_dir: str | Path | None = None,
        source: str | None = None,
        import_code: bool = True,
    ) -> StudySpec:
        """Build and validate a spec from its decoded YAML or JSON (:meth:`parse`, :meth:`check`).

        Args:
            data: The spec, a mapping.
            base_dir: The directory that paths of user space files and of ``code.path`` are
                relative to (None: the working directory).
            source: The file the spec came from, named in errors.
            import_code: Import the ``code`` section and run :meth:`validate_deep`; False
                with a ``code`` section checks the shape only (the caller validates in a
                subprocess with :meth:`load_code` and :meth:`validate_deep`).

        Returns:
            The spec.

        Raises:
            ConfigError: An invalid field, named by its dotted path (a ``CodeError`` for user
                code that fails to import or register).
        """
        spec = cls.parse(data, base_dir=base_dir, source=source)
        if spec.code is None or import_code:
            spec.check()
        return spec

    def load_code(self) -> LoadReport | None:
        """Import the study's ``code`` section; idempotent.

        Returns:
            What was imported and registered, or None without a ``code`` section.

        Raises:
            CodeError: The code fails to import or to register.
        """
        return None if self.code is None else load_code(self.code, self._base_dir)

    @property
    def resolved_code(self) -> CodeSpec | None:
        """``code`` with its path made absolute (as trial configurations carry it)."""
        return None if self.code is None else self.code.resolved(self._base_dir or ".")

    @classmethod
    def from_file(cls, path: str | Path) -> StudySpec:
        """Read, build and validate a spec from a YAML (or ``.json``) file.

        Args:
            path: The study file; relative paths in it are relative to its directory.

        Returns:
            The spec.

        Raises:
            ConfigError: The file cannot be read or parsed, or a field is invalid.
        """
        path = Path(path)
        try:
            text = path.read_text()
            data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        except (OSError, ValueError, yaml.YAMLError) as exc:
            raise ConfigError("<file>", f"cannot read the study spec: {exc}", str(path)) from None
        return cls.from_dict(data, base_dir=path.parent, source=str(path))

    def to_dict(self) -> dict[str, Any]:
        """Give the spec as JSON-ready data, every default filled in.

        ``task``, ``train``, ``hparams`` and ``decay`` hold the keys the user wrote (their
        defaults are the engine's, and a written key, even at its default, stays written).

        Returns:
            The spec, accepted back by :meth:`from_dict` as the same spec.
        """
        return self.model_dump(mode="json")

    def given(self, section: str) -> tuple[str, ...]:
        """Name the keys the user wrote in one section of the trial configuration.

        Args:
            section: ``task``, ``train``, ``hparams`` or ``decay``.

        Returns:
            The keys, in the order written (empty for another section).
        """
        return self._given.get(section, ())

    def section(self, section: str) -> dict[str, Any]:
        """Give one section of the trial configuration as plain data, the written keys only.

        Args:
            section: ``task``, ``train``, ``hparams`` or ``decay``.

        Returns:
            The section as the spec writes it (parsed values).
        """
        keys = self.given(section)
        if section == "task":
            return self.task.to_dict(keys)
        if section == "hparams":
            return copy.deepcopy(dict(self.hparams))
        part = getattr(self, section)
        return {k: to_dict(getattr(part, k)) for k in keys}

    def __eq__(self, other: object) -> bool:
        """Equal specs have equal fields and the same written keys (:meth:`given`) and base
        directory; the file named in errors and the cached :attr:`base_config` do not count."""
        if not isinstance(other, StudySpec):
            return NotImplemented

        def written(spec: StudySpec) -> dict[str, frozenset[str]]:
            return {k: frozenset(v) for k, v in spec._given.items()}

        return (self.__dict__, written(self), self._base_dir) == (
            other.__dict__,
            written(other),
            other._base_dir,
        )

    def __hash__(self) -> int:
        return super().__hash__()

    def model_copy(
        self, *, update: Mapping[str, Any] | None = None, deep: bool = False
    ) -> StudySpec:
        """A copy (pydantic's), without the cached :attr:`base_config` of the original."""
        copied = super().model_copy(update=update, deep=deep)
        copied._base_config = None
        return copied

    # ------------------------------------------------------------ trial configurations

    def trial_seeds(self) -> list[int]:
        """List the seeds each configuration is trained with (the objective averages them).

        Returns:
            ``seeds``, else ``[seed]``, else ``[0]``.
        """
        return list(self.seeds) if self.seeds else [0 if self.seed is None else self.seed]

    def base_trial_config(self) -> dict[str, Any]:
        """Give the fixed part of every trial's configuration.

        Returns:
            A trial configuration, as ``fedtune.trainers.parse_trial_config`` accepts it, with
            the keys the user wrote (:meth:`section`).
        """
        base = {
            "task": self.section("task"),
            "algorithm": self.algorithm,
            "train": self.section("train"),
            "hparams": self.section("hparams"),
            "decay": self.section("decay"),
            "seed": self.trial_seeds()[0],
        }
        if self.code is not None:
            base["code"] = self.resolved_code.model_dump()
        return base

    @property
    def base_config(self) -> TrialConfig:
        """The typed :meth:`base_trial_config`, built once from the parsed sections.

        ``hparams`` are typed against the algorithm's recipe here, so the algorithm must be
        registered (:meth:`load_code` first for user code).

        Raises:
            ConfigError: The algorithm is unknown, or a hyperparameter does not suit its recipe.
        """
        if self._base_config is None:
            self._base_config = TrialConfig(
                task=self.task,
                algorithm=self.algorithm,
                train=self.train,
                hparams=get_recipe(self.algorithm).given_hparams(self.section("hparams")),
                decay=self.decay,
                seed=self.trial_seeds()[0],
                code=self.resolved_code,
            )
        return self._base_config

    def trial(self, sampled: Mapping[str, Any], seed: int | None = None) -> TrialConfig:
        """Give one trial's typed configuration.

        Args:
            sampled: The sampled values, ``{path: value}`` (``train.<field>``,
                ``decay.<field>``, ``hparams.<name>``, ``task.<name>``).
            seed: The trial's seed (None: the first of :meth:`trial_seeds`).

        Returns:
            :attr:`base_config` with each sampled value in its field, checked as the base's
            own values are, and ``seed``.

        Raises:
            ConfigError: A path outside those sections, or a value its field refuses.
        """
        base = self.base_config
        by_section: dict[str, dict[str, Any]] = {}
        for path, value in sampled.items():
            if "." not in path or resolve_path(path) != path:  # the search space's own rule
                raise ConfigError(path, "is not a path a search may set")
            section, _, name = path.partition(".")
            by_section.setdefault(section, {})[name] = value
        typed = {
            "task": lambda v: TaskConfig.from_dict({**base.task.to_dict(), **v}),
            "train": lambda v: replace_fields(base.train, v, "train"),
            "decay": lambda v: replace_fields(base.decay, v, "decay"),
            "hparams": lambda v: get_recipe(self.algorithm).given_hparams(
                {**self.section("hparams"), **v}
            ),
        }
        changes = {section: typed[section](v) for section, v in by_section.items()}
        if seed is not None:
            changes.update(seed=seed)
        return dataclasses.replace(base, **changes) if changes else base

    @property
    def experiment(self) -> str:
        """The MLflow experiment (``tracking.experiment``, else the study's name)."""
        return self.tracking.experiment or self.name

    # ------------------------------------------------------------ search space, deep checks

    def search_space(self) -> SearchSpace:
        """Resolve the study's search space (:func:`.checks.search_space`)."""
        return checks.search_space(self)

    def param_origin(self, path: str) -> str:
        """Say where the spec defines a searched parameter (:func:`.checks.param_origin`)."""
        return checks.param_origin(self, path)

    def validate_deep(self) -> None:
        """Check the spec against the registries, the algorithm's recipe and the search
        space (:func:`.checks.validate_deep`).

        Raises:
            ConfigError: The first problem (or all conflicts of the space), named by its
                dotted path.
        """
        checks.validate_deep(self)
