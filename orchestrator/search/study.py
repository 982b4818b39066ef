"""The Optuna study in RDB storage, ask and tell (search/ is the only room that imports Optuna: here,
sampler.py, space.py and plots.py).

Optuna's storage is the source of truth for resume. Each trial carries user attributes (role,
failure kind, reason, MLflow run id) so another process (`sweep status`) can read progress from the
storage alone. Trials created by ask() record no heartbeat (Optuna 5), so resume finds trials a
killed driver left RUNNING itself and closes them.
"""

from __future__ import annotations

import functools
import random
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import optuna
import sqlalchemy.exc
from optuna.study import StudyDirection
from optuna.trial import TrialState

from orchestrator.config import eagle
from orchestrator.config.experiment import SamplerSpec, SearchSpace
from orchestrator.config.space import check_enumerable
from orchestrator.errors import StorageError, StorageWriteError
from orchestrator.fsio import disk_failing
from orchestrator.records import ParamValue
from orchestrator.redact import mask_url_password
from orchestrator.search import space as sp
from orchestrator.search.refine import SHORT_SEARCH
from orchestrator.search.sampler import (
    FAILED_CONSTRAINT,
    NCCL_SETTING,
    PROBE_FIXED_ATTR,
    PROBE_SETTINGS_ATTR,
    StageTwoSampler,
    point_of,
)

T = TypeVar("T")

optuna.logging.set_verbosity(optuna.logging.WARNING)

IN_MEMORY = "memory:"
"""A storage URL that keeps the study in this process only (the search benchmark's: no sqlite round trips)."""

_DIRECTIONS = {"maximize": StudyDirection.MAXIMIZE, "minimize": StudyDirection.MINIMIZE}


@dataclass(frozen=True)
class TrialView:
    """A read-only view of one Optuna trial in our terms."""

    number: int
    state: str
    params: dict[str, ParamValue]
    values: tuple[float, ...] | None
    attrs: dict[str, Any]
    start: float | None
    end: float | None

    @property
    def role(self) -> str:
        return self.attrs.get("role", "search")


def _sampler(cfg: SamplerSpec, space: SearchSpace, search_trials: int | None) -> optuna.samplers.BaseSampler:
    if cfg.kind == "random" or cfg.kind == "grid":
        # grid: the points are enqueued one by one (see Study.ask); random covers nothing else.
        return optuna.samplers.RandomSampler(seed=cfg.seed)
    # failure-aware TPE; once the probe kept NCCL settings, alternated with the local refinement
    breadth = search_trials is not None and search_trials <= SHORT_SEARCH  # a short night goes breadth first
    return StageTwoSampler(space, seed=cfg.seed, n_startup_trials=cfg.startup_trials, breadth=breadth)


def _storage_op(fn: Callable[..., T]) -> Callable[..., T]:
    """A Study method whose storage failures (a full disk, a locked or damaged database, a lost server)
    become one StorageWriteError saying what, where and the fix, instead of SQLAlchemy's traceback."""

    @functools.wraps(fn)
    def wrapper(self: Study, *args: Any, **kwargs: Any) -> T:
        try:
            return fn(self, *args, **kwargs)
        except (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError) as exc:
            cause = exc.__cause__ if isinstance(exc, optuna.exceptions.StorageInternalError) and exc.__cause__ else exc
            if self.storage_url.startswith("sqlite:///"):
                what = sqlite_problem(self.storage_url.removeprefix("sqlite:///"), cause)
            else:
                what = (
                    f"Optuna storage {mask_url_password(self.storage_url)} failed: {type(cause).__name__}: "
                    f"{str(cause).splitlines()[0][:300]}"
                )
            raise StorageWriteError(
                f"{what}. What was measured is kept: once fixed, `sweep run ... --resume` continues"
            ) from None

    return wrapper


class Study:
    """An Optuna study in RDB storage driven by ask/tell."""

    def __init__(
        self,
        storage_url: str,
        name: str,
        space: SearchSpace,
        sampler: SamplerSpec,
        directions: Sequence[str],
        search_trials: int | None = None,
    ):
        self.storage_url = storage_url
        self.search_trials = search_trials
        """budget.trials: a search of at most refine.SHORT_SEARCH goes breadth first (None: not short)."""
        self.name = name
        self.space = space
        self.sampler_cfg = sampler
        self.directions = list(directions)
        self._study: optuna.Study | None = None
        self._asked: dict[int, optuna.Trial] = {}
        self._grid: Iterator[dict[str, ParamValue]] | None = None
        self._settings: dict[str, dict[str, ParamValue]] = {}
        """The probe's kept NCCL settings by label (empty: the NCCL knobs are searched one by one)."""
        self._fixed: dict[str, ParamValue] = {}
        """Knobs the probe left one value of (fix): fresh proposals take it and do not ask the sampler."""

    # -- lifecycle

    def exists(self) -> bool:
        """Whether the storage holds this study; StorageError when the storage cannot be used at all."""
        try:
            names = optuna.study.get_all_study_names(storage=self.storage_url)
        except ImportError as exc:
            raise StorageError(
                f"Optuna storage {mask_url_password(self.storage_url)}: its database driver is not installed "
                f"({str(exc).splitlines()[0][:200]}); for PostgreSQL: pip install 'sglang-sweep[postgres]'"
            ) from None
        except Exception as exc:  # noqa: BLE001 - SQLAlchemy's many connection errors
            if self.storage_url.startswith("sqlite"):
                return False  # a fresh sqlite file has no schema yet
            raise StorageError(
                f"Optuna storage {mask_url_password(self.storage_url)} is unreachable: "
                f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            ) from None
        return self.name in names

    @_storage_op
    def open(self) -> None:
        if self.sampler_cfg.kind == "grid":
            check_enumerable(self.space, "sampler kind grid")  # before anything is created
        storage = None if self.storage_url == IN_MEMORY else _rdb(self.storage_url)
        self._study = optuna.create_study(
            study_name=self.name,
            storage=storage,
            directions=[_DIRECTIONS[d] for d in self.directions],
            sampler=_sampler(self.sampler_cfg, self.space, self.search_trials),
            load_if_exists=True,
        )
        self._settings = {str(k): dict(v) for k, v in (self.get_attr(PROBE_SETTINGS_ATTR) or {}).items()}
        self._fixed = dict(self.get_attr(PROBE_FIXED_ATTR) or {})
        if self.sampler_cfg.kind == "grid":
            order = [p for p in sp.points(self.space) if eagle.infeasible(p) is None]
            random.Random(self.sampler_cfg.seed).shuffle(order)
            self._grid = iter(order)

    def delete(self) -> None:
        """Remove the study from its storage (a start that failed must leave nothing behind)."""
        if self._study is not None and self.storage_url != IN_MEMORY:
            optuna.delete_study(study_name=self.name, storage=self._study._storage)
        self._study = None

    @property
    def study(self) -> optuna.Study:
        if self._study is None:
            raise RuntimeError("Study.open() must be called first")
        return self._study

    # -- attributes of the whole sweep

    @_storage_op
    def get_attr(self, key: str, default: Any = None) -> Any:
        return self.study.user_attrs.get(key, default)

    @_storage_op
    def set_attr(self, key: str, value: Any) -> None:
        self.study.set_user_attr(key, value)

    # -- the probe's restriction

    def restrict_nccl(self, settings: Mapping[str, Mapping[str, ParamValue]]) -> None:
        """From now on search trials choose their NCCL knobs as one of `settings` ({label: {knob: value}},
        every NCCL knob of the space in each, fastest first) instead of knob by knob. Kept in the study
        for resume."""
        self._settings = {label: dict(values) for label, values in settings.items()}
        self.set_attr(PROBE_SETTINGS_ATTR, self._settings)

    def fix(self, values: Mapping[str, ParamValue]) -> None:
        """From now on fresh search trials take `values` ({knob: its one value left}) without asking the
        sampler (Optuna keeps a knob's distribution for the whole study, so a value cannot be taken out of
        its choices; an unasked knob is simply absent from those trials). Enqueued trials keep what they
        were enqueued with. Kept in the study for resume."""
        self._fixed = dict(values)
        self.set_attr(PROBE_FIXED_ATTR, self._fixed)

    @property
    def fixed(self) -> dict[str, ParamValue]:
        return dict(self._fixed)

    @property
    def nccl_settings(self) -> dict[str, dict[str, ParamValue]]:
        return dict(self._settings)

    def nccl_label(self, params: Mapping[str, ParamValue]) -> str | None:
        """The kept setting `params` uses, or None (not restricted, or a setting the probe did not keep)."""
        for label, values in self._settings.items():
            if all(params.get(k) == v for k, v in values.items()):
                return label
        return None

    # -- ask / tell

    @_storage_op
    def enqueue(self, params: Mapping[str, ParamValue], attrs: Mapping[str, Any]) -> None:
        """Queue exact parameters (baseline, re-measure); the next ask() returns them first."""
        attrs = dict(attrs)
        label = self.nccl_label(params) if self._settings and attrs.get("role", "search") == "search" else None
        if label is not None:
            dims = self._settings[label]
            params = {
                NCCL_SETTING: list(self._settings).index(label) + 1,
                **{k: v for k, v in params.items() if k not in dims},
            }
        elif self._settings:
            attrs["nccl_fixed"] = True  # asked knob by knob (see ask)
        fixed = {k: v for k, v in params.items() if v is not None or _none_allowed(self.space, k)}
        self.study.enqueue_trial(fixed, user_attrs=dict(attrs), skip_if_exists=False)

    @_storage_op
    def ask(self) -> tuple[int, dict[str, ParamValue], dict[str, Any]] | None:
        """A new trial: (number, every knob of the space, user attrs it was enqueued with), or None
        when a grid sweep has measured every point."""
        if self._grid is not None and not self._waiting() and not self._enqueue_next_grid_point():
            return None
        trial = self.study.ask()
        chosen: dict[str, ParamValue] = {}
        restricted = (
            self._settings
            and trial.user_attrs.get("role", "search") == "search"
            and not trial.user_attrs.get("nccl_fixed")
        )
        nccl = set(next(iter(self._settings.values()))) if restricted else set()
        for name in sp.ordered(self.space):
            if name not in chosen:
                chosen.update(self._choose(trial, name, chosen, nccl))
        self._asked[trial.number] = trial
        return trial.number, sp.complete(self.space, chosen), dict(trial.user_attrs)

    def _enqueue_next_grid_point(self) -> bool:
        """Queue the grid's next untried point (an NCCL setting the probe kept, where it restricted them);
        False when every one was tried."""
        tried = {sp.key(sp.complete(self.space, t.params)) for t in self.trials()}
        for point in self._grid or ():
            if self._settings and self.nccl_label(point) is None:
                continue  # an NCCL setting the probe did not keep
            if sp.key(point) not in tried:
                self.enqueue(point, {"role": "search"})
                return True
        return False

    def _choose(
        self, trial: optuna.Trial, name: str, chosen: Mapping[str, ParamValue], nccl: set[str]
    ) -> dict[str, ParamValue]:
        """Knob `name`'s value for `trial` (with the knobs already `chosen`): unset where inactive, the probe's
        one value for a fresh proposal, the NCCL knobs as one kept setting, else the sampler's."""
        param = self.space.params[name]
        if not sp.is_active(param, chosen):
            return {name: None}
        if name in self._fixed and "role" not in trial.user_attrs:  # a fresh proposal: the probe's one value
            return {name: self._fixed[name]}
        if name in nccl:  # the NCCL knobs come as one kept setting, where they are active (their `when`)
            rank = trial.suggest_int(NCCL_SETTING, 1, len(self._settings))
            return dict(list(self._settings.values())[rank - 1])
        dist = sp.distribution(param)
        if isinstance(dist, optuna.distributions.CategoricalDistribution):
            return {name: trial.suggest_categorical(name, list(dist.choices))}
        return {name: trial.suggest_int(name, dist.low, dist.high, step=dist.step, log=dist.log)}

    def _waiting(self) -> bool:
        return any(t.state == TrialState.WAITING for t in self.study.get_trials(deepcopy=False))

    @_storage_op
    def set_trial_attrs(self, number: int, attrs: Mapping[str, Any]) -> None:
        trial = self._asked.get(number)
        if trial is not None:
            for k, v in attrs.items():
                trial.set_user_attr(k, v)
            return
        frozen = self.study.get_trials(deepcopy=False)[number]
        for k, v in attrs.items():
            self.study._storage.set_trial_user_attr(frozen._trial_id, k, v)  # no public API for old trials

    @_storage_op
    def tell_complete(self, number: int, values: Sequence[float], attrs: Mapping[str, Any]) -> None:
        self.set_trial_attrs(number, attrs)
        self.study.tell(number, list(values) if len(values) > 1 else values[0])
        self._asked.pop(number, None)

    @_storage_op
    def tell_failed(self, number: int, attrs: Mapping[str, Any], *, learn: bool = False) -> None:
        """A failure. `learn`: the parameters caused it (an OOM, a hang), so the sampler is told to avoid
        them (a violated constraint TPE reads, see search/sampler.py); otherwise it ignores the trial."""
        self.set_trial_attrs(number, attrs)
        if learn:
            trial = self._asked.get(number)
            if trial is not None:
                trial.set_constraint(FAILED_CONSTRAINT, 1.0)
            else:
                frozen = self.study.get_trials(deepcopy=False)[number]
                self.study._storage.set_trial_system_attr(  # no public API for old trials
                    frozen._trial_id, f"constraints:{FAILED_CONSTRAINT}", 1.0
                )
        self.study.tell(number, state=TrialState.FAIL)
        self._asked.pop(number, None)

    # -- reading

    @_storage_op
    def trials(self) -> list[TrialView]:
        return [_view(t, self._settings) for t in self.study.get_trials(deepcopy=False)]

    def running(self) -> list[TrialView]:
        return [t for t in self.trials() if t.state == "RUNNING"]

    def importances(self) -> dict[str, float]:
        """Optuna's parameter importances for the first objective (fANOVA over the complete trials),
        largest first; empty when too few trials completed to tell."""
        complete = [t for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
        if len(complete) < 2:
            return {}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                found = optuna.importance.get_param_importances(
                    self.study,
                    target=lambda t: t.values[0],
                    evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0),
                )
        except (ValueError, RuntimeError):  # e.g. no parameter shared by every complete trial
            return {}
        return dict(sorted(((k, float(v)) for k, v in found.items()), key=lambda kv: -kv[1]))


def _none_allowed(space: SearchSpace, name: str) -> bool:
    param = space.params.get(name)
    return param is not None and param.choices is not None and None in param.choices


def _view(t: optuna.trial.FrozenTrial, settings: Mapping[str, Mapping[str, ParamValue]] | None = None) -> TrialView:
    return TrialView(
        number=t.number,
        state=t.state.name,
        params=point_of(t.params, settings or {}),
        values=tuple(t.values) if t.values is not None else None,
        attrs=dict(t.user_attrs),
        start=t.datetime_start.timestamp() if t.datetime_start else None,
        end=t.datetime_complete.timestamp() if t.datetime_complete else None,
    )


SQLITE_BUSY_S = 30.0
"""How long a write waits for sqlite's lock (`sweep status` reading while the driver writes) before it fails."""


def _engine_kwargs(url: str) -> dict[str, Any]:
    # sqlite: wait for the lock instead of failing when `sweep status` reads while the driver writes.
    return {"connect_args": {"timeout": SQLITE_BUSY_S}} if url.startswith("sqlite") else {}


def _rdb(url: str, **kwargs: Any) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage at `url`; StorageError (what, and the fix) when it cannot be opened."""
    shown = mask_url_password(url)
    if url.startswith("sqlite:///"):
        folder = Path(url.removeprefix("sqlite:///")).parent
        if not folder.is_dir():
            raise StorageError(
                f"Optuna storage {shown}: the folder {folder} does not exist; create it, or "
                f"leave --storage out (the work directory's optuna.db)"
            )
    try:
        return _open_rdb(url, **kwargs)
    except ImportError as exc:
        raise StorageError(
            f"Optuna storage {shown}: its database driver is not installed "
            f"({str(exc).splitlines()[0][:200]}); for PostgreSQL: pip install 'sglang-sweep[postgres]'"
        ) from None
    except (sqlalchemy.exc.SQLAlchemyError, ValueError) as exc:
        if url.startswith("sqlite:///") and isinstance(exc, sqlalchemy.exc.SQLAlchemyError):
            raise StorageError(sqlite_problem(url.removeprefix("sqlite:///"), exc)) from None
        raise StorageError(
            f"Optuna storage {shown} cannot be opened: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:300]}; pass a URL such as sqlite:////abs/path/optuna.db "
            f"or postgresql://user@host/db"
        ) from None


# Optuna's RDBStorage creates its tables on open (metadata.create_all: look, then CREATE TABLE), so two
# processes opening a new database at once race: the slower one's CREATE meets the table the faster one just
# made ("table studies already exists"; or the version row twice, "UNIQUE constraint failed"). `sweep status`
# beside a starting sweep is such a pair (CI met it in tests/hardening/test_disk_full.py). The tables are then
# there, so opening again succeeds.
_CONCURRENT_CREATION = ("already exists", "UNIQUE constraint failed")
_OPEN_ATTEMPTS = 5


def _open_rdb(url: str, **kwargs: Any) -> optuna.storages.RDBStorage:
    for attempt in range(1, _OPEN_ATTEMPTS):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=_engine_kwargs(url), **kwargs)
        except sqlalchemy.exc.SQLAlchemyError as exc:
            if not any(word in _db_error_text(exc) for word in _CONCURRENT_CREATION):
                raise
            time.sleep(0.05 * attempt)  # the other process's creation is finishing
    return optuna.storages.RDBStorage(url, engine_kwargs=_engine_kwargs(url), **kwargs)


def _db_error_text(exc: BaseException) -> str:
    """The database's own words: SQLAlchemy keeps the driver's error as `orig`."""
    return str(getattr(exc, "orig", None) or exc)


def sqlite_problem(path: str, exc: BaseException) -> str:
    """One message for a sqlite database file that cannot be used: what, where and how to fix it."""
    text = _db_error_text(exc).splitlines()[0][:200]
    if "locked" in text:
        return (
            f"{path} is locked by another process ({text}); wait for the sweep or command using it to "
            "finish, or stop it, and run this again"
        )
    if disk_failing(text):
        return f"{path}: the disk is full or failing ({text}); free space and run this again"
    if "unable to open" in text or "readonly" in text:
        return (
            f"{path} cannot be opened ({text}); check that it is a file you can read and write "
            "(not a directory) in a folder you can write to"
        )
    return (
        f"{path} is not a readable SQLite database ({text}): it was cut short, overwritten or damaged; "
        "restore it from a backup, or start a new sweep in another --workdir"
    )


def read_only(storage_url: str, name: str) -> tuple[list[TrialView], dict[str, Any]] | None:
    """Trials of study `name` for `sweep status`, or None when there is no such study."""
    storage = _rdb(storage_url, skip_compatibility_check=True)
    try:
        study = optuna.load_study(study_name=name, storage=storage)
        settings = study.user_attrs.get(PROBE_SETTINGS_ATTR) or {}
        return [_view(t, settings) for t in study.get_trials(deepcopy=False)], dict(study.user_attrs)
    except KeyError:
        return None
    except (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError) as exc:
        if storage_url.startswith("sqlite:///"):
            raise StorageError(sqlite_problem(storage_url.removeprefix("sqlite:///"), exc)) from None
        raise StorageError(
            f"Optuna storage {mask_url_password(storage_url)} cannot be read: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:300]}"
        ) from None


def name_objectives(storage_url: str, name: str, metrics: Sequence[str]) -> bool:
    """Name study `name`'s objectives after the sweep's metrics (`decode_tok_s`, what optuna-dashboard then
    shows instead of "Objective 0"); False when there is no such study or its objectives are not these."""
    storage = _rdb(storage_url, skip_compatibility_check=True)
    try:
        study = optuna.load_study(study_name=name, storage=storage)
        if len(study.directions) != len(metrics):
            return False
        if study.metric_names != list(metrics):
            with warnings.catch_warnings():  # experimental since Optuna 3.2, and what the dashboard reads
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                study.set_metric_names(list(metrics))
        return True
    except KeyError:
        return False
    except (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError) as exc:
        raise StorageError(
            f"Optuna storage {mask_url_password(storage_url)} cannot be read: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:300]}"
        ) from None
