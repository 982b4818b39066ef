"""Read an experiment YAML and the search spaces it names into `SweepSpec`, with the checks that span
sections (the space's knobs and their `when` links, the server's flags against SGLang's, the objective,
the CPU engine).

Every user mistake becomes one `SpecError` naming the file, the field path, the rule and the value, with a
fix (did-you-mean for unknown keys and knobs). Nothing downstream re-checks what is validated here."""

from __future__ import annotations

import difflib
import graphlib
import os
from pathlib import Path

from pydantic import ValidationError

from orchestrator import redact
from orchestrator.config import flags, knobs, speculation, yamlfile
from orchestrator.config.messages import did_you_mean, format_errors
from orchestrator.config.sections import SweepSpec
from orchestrator.config.space import ParamSpec, SearchSpace, check_enumerable, when_order
from orchestrator.errors import SpecError


def _read_yaml(path: Path, what: str, *, named_in: str | None = None) -> dict:
    data = yamlfile.parse(yamlfile.read_text(path, what, named_in=named_in), str(path))
    if data is None:
        raise SpecError(f"{path}: the {what} file is empty; it must be a YAML mapping (key: value)")
    if not isinstance(data, dict):
        raise SpecError(f"{path}: the {what} file must be a YAML mapping (key: value), but got a {type(data).__name__}")
    return data


def _check_space_knobs(space: SearchSpace, where: str) -> None:
    for name, param in space.params.items():
        at = f"{where}: params.{name}"
        knob = knobs.KNOBS.get(name)
        if knob is None:
            raise SpecError(
                f"{at}: unknown knob; {did_you_mean(name, list(knobs.KNOBS), 'known knobs')} "
                f"(the catalogue is orchestrator/config/knobs.py)"
            )
        if param.choices is None:
            if knob.kind != "int":
                raise SpecError(
                    f"{at}: a low/high range needs an integer knob, but {name} is {knob.kind}; "
                    f"list its values with `choices:` ({knob.doc})"
                )
            for end in ("low", "high"):
                if problem := knob.check(getattr(param, end)):
                    raise SpecError(f"{at}.{end}: {name} {problem}; fix the bound ({name}: {knob.doc})")
        else:
            for value in param.choices:
                if problem := knob.check(value):
                    raise SpecError(f"{at}.choices: {name} {problem}; fix or remove that value ({name}: {knob.doc})")
        if not param.when and (param.choices is None or None not in param.choices):
            example = ", ".join(map(str, param.values()[:3]))
            raise SpecError(
                f"{at}: the baseline (engine defaults, nothing set) must be a point of the space; "
                f"add null (= not set) to its choices, e.g. choices: [null, {example}]"
            )
        for dep in param.when:
            if dep not in knobs.KNOBS:
                raise SpecError(f"{at}.when.{dep}: unknown knob; {did_you_mean(dep, list(knobs.KNOBS), 'known knobs')}")


def load_space(path: Path, *, named_in: str | None = None) -> SearchSpace:
    """Read and validate one search-space file against the knob catalogue."""
    data = _read_yaml(path, "search space", named_in=named_in)
    try:
        space = SearchSpace.model_validate(data)
    except ValidationError as err:
        raise SpecError(format_errors(err, SearchSpace, str(path))) from None
    _check_space_knobs(space, str(path))
    return space


def _check_links(space: SearchSpace, origin: dict[str, str], where: str) -> None:
    """`when` conditions name knobs of the merged space, with values those knobs take, without cycles."""
    for name, param in space.params.items():
        for dep, wanted in param.when.items():
            if problem := _link_problem(space, name, dep, wanted, where):
                raise SpecError(f"{origin[name]}: params.{name}.when.{dep}: {problem}")
    mode = space.params.get("speculative_attention_mode")
    algo_when = mode.when.get("speculative_algorithm") if mode is not None else None
    if mode is not None and (algo_when is None or None in (algo_when if isinstance(algo_when, list) else [algo_when])):
        raise SpecError(
            f"{origin['speculative_attention_mode']}: params.speculative_attention_mode: passed to SGLang "
            f"only with speculative decoding, so without it every value would be the same server "
            f"counted twice; add `when: {{speculative_algorithm: EAGLE3}}`"
        )
    try:
        when_order(space)
    except graphlib.CycleError as cycle:
        todo = [n for n in space.params if n in set(cycle.args[1])]
        raise SpecError(
            f"{origin[todo[0]]}: params.{todo[0]}.when: the `when` conditions of "
            f"{', '.join(todo)} depend on each other in a cycle; break the cycle"
        ) from None


def _link_problem(space: SearchSpace, name: str, dep: str, wanted: object, where: str) -> str | None:
    """Why knob `name`'s condition on `dep` can never hold, or None."""
    if dep not in space.params:
        return (
            f"the condition refers to knob {dep}, which no search space of {where} "
            f"defines; add {dep} to a search space or drop the condition"
        )
    values = space.params[dep].values()
    for w in wanted if isinstance(wanted, list) else [wanted]:
        if w not in values:
            shown = (
                f"{values[0]} to {values[-1]}"
                if isinstance(values, range)
                else yamlfile.shorten(", ".join(map(str, values)), 200)
            )
            return (
                f"{dep} never takes the value {yamlfile.shorten(repr(w))} (its values: "
                f"{shown}), so {name} would never be swept; fix the value"
            )
    return None


# Metrics the baseline (no speculation) cannot have: an objective must be defined for every trial.
_SPECULATION_ONLY = ("accept_length", "accept_rate", "verify_ms")


def _objective_load(spec: SweepSpec, where: str) -> SweepSpec:
    """The experiment with benchmark.concurrency at the objective's level (see ObjectiveSpec)."""
    level = spec.objective.concurrency
    if level is None or level == spec.benchmark.concurrency and spec.benchmark.requests >= level:
        return spec
    if "concurrency" in spec.benchmark.model_fields_set and spec.benchmark.concurrency != level:
        raise SpecError(
            f"{where}: benchmark.concurrency: {spec.benchmark.concurrency} conflicts with "
            f"objective.concurrency: {level}, the load the objective is judged at (the search "
            f"trials and the promotion gate run there); remove benchmark.concurrency, or set "
            f"objective.concurrency to {spec.benchmark.concurrency}"
        )
    bench = spec.benchmark.model_copy(update={"concurrency": level, "requests": max(spec.benchmark.requests, level)})
    return spec.model_copy(update={"benchmark": bench})


def _check_adaptive(spec: SweepSpec, origin: dict[str, str], where: str) -> None:
    param = spec.space.params.get("speculative_adaptive")
    if param is None or spec.sglang_version in knobs.ADAPTIVE_VERSIONS or not any(param.values()):
        return
    raise SpecError(
        f"{origin['speculative_adaptive']}: params.speculative_adaptive: --speculative-adaptive is "
        f"known in sglang {', '.join(knobs.ADAPTIVE_VERSIONS)}, not in sglang_version "
        f"{spec.sglang_version} of {where}; remove the knob or set sglang_version: "
        f'"{knobs.ADAPTIVE_VERSIONS[-1]}"'
    )


def _check_objective(spec: SweepSpec, where: str) -> None:
    for field in ("metric", "secondary"):
        name = getattr(spec.objective, field)
        if name in _SPECULATION_ONLY:
            raise SpecError(
                f"{where}: objective.{field}: {name} exists only with speculative decoding, but the "
                f"baseline runs without it; use cycle_ms (one decode iteration, defined for every "
                f"trial), decode_tok_s, or a latency percentile"
            )


def _check_server(spec: SweepSpec, origin: dict[str, str], where: str) -> None:
    algo = spec.space.params.get("speculative_algorithm")
    drafter = bool(spec.server.draft_model) or "speculative_draft_model_path" in spec.space.params
    if algo is not None and speculation.drafter_missing(algo.values(), drafter):
        raise SpecError(
            f"{where}: server.draft_model: required field is missing: the search space turns "
            f"speculative decoding on (speculative_algorithm in {origin['speculative_algorithm']}); "
            f"add the EAGLE-3 draft model path"
        )
    for i, fault in enumerate(spec.simulator.faults):
        for knob in getattr(fault, "when", {}):
            if knob not in spec.space.params:
                raise SpecError(
                    f"{where}: simulator.faults.{i}.when.{knob}: not a knob of the search space, so "
                    f"the fault would never fire; "
                    f"{did_you_mean(knob, list(spec.space.params), 'knobs of the space')}"
                )
    for name in spec.server.env:
        if name in spec.space.params:
            raise SpecError(
                f"{where}: server.env.{name}: also swept by the search space ({origin[name]}), so the "
                f"baseline would not run the engine defaults; remove it from server.env"
            )
    _check_dashes(spec, where)
    for name in spec.server.flags:
        if problem := _fixed_flag_problem(spec, origin, name):
            raise SpecError(f"{where}: server.flags.{name}: {problem}")
    _check_backend_flags(spec, origin, where)


def _fixed_flag_problem(spec: SweepSpec, origin: dict[str, str], name: str) -> str | None:
    """What is wrong with server.flags.`name` and how to fix it, or None."""
    flag = "--" + name.lstrip("-")
    known = flags.known_flags(spec.sglang_version)
    if redact.is_secret_name(name.lstrip("-").replace("-", "_")):
        return (
            "looks like a secret, and experiments, launch plans, MLflow and the exported env file are all "
            "written to disk; pass it to the server through its deployment environment instead"
        )
    if flag in flags.MANAGED_FLAGS:
        return f"set by the sweep itself from {flags.MANAGED_FLAGS[flag]}; remove it from server.flags"
    if known is not None and flag not in known:
        return f"not a flag of sglang {spec.sglang_version} (launch_server --help); {_flag_hint(flag, known)}"
    if problem := flags.value_problem(flag, spec.server.flags[name]):
        return problem
    knob = flags.knob_flags(spec.sglang_version).get(flag)
    if knob in spec.space.params:
        return (
            f"the search space sweeps {knob} ({origin[knob]}), which sets this flag; "
            f"remove it from server.flags or {knob} from the space"
        )
    for knob in flags.OVERRIDING_FLAGS.get(flag, ()):
        if knob in spec.space.params:
            return (
                f"SGLang lets this flag win over the swept knob {knob} ({origin[knob]}), so "
                f"every value of {knob} would run the same server; remove it from server.flags "
                f"or {knob} from the space"
            )
    return None


def _check_backend_flags(spec: SweepSpec, origin: dict[str, str], where: str) -> None:
    """Fixed flags that defeat a swept all_reduce_backend value (flags.BACKEND_CONFLICTS)."""
    backend = spec.space.params.get("all_reduce_backend")
    swept = backend.values() if backend is not None else ()
    for name in spec.server.flags:
        if problem := flags.backend_conflict("--" + name.lstrip("-"), swept):
            raise SpecError(f"{where}: server.flags.{name}: {problem} ({origin['all_reduce_backend']})")


def _check_dashes(spec: SweepSpec, where: str) -> None:
    """server.model, draft_model and host are each the word after a flag on the command line."""
    for field in ("model", "draft_model", "host"):
        value = getattr(spec.server, field)
        if value is not None and (problem := flags.dash_problem(value)):
            raise SpecError(f"{where}: server.{field}: {problem}")


_DEVICE_TIMER = "SGLANG_ENABLE_METRICS_DEVICE_TIMER"


def _check_cpu_device(spec: SweepSpec, origin: dict[str, str], where: str) -> None:
    """server.device cpu: what SGLang 0.5.23's CPU engine needs, and what cannot run there."""
    at = f"{where}: server.device"
    if spec.engine == "simulator":
        raise SpecError(
            f"{at}: cpu: the simulator models GPU hosts only; use engine: sglang for SGLang's CPU "
            f"engine, or remove server.device"
        )
    if spec.server.env.get("SGLANG_USE_CPU_ENGINE") != "1":
        raise SpecError(
            f"{at}: cpu: SGLang 0.5.23 takes its CPU paths only with SGLANG_USE_CPU_ENGINE=1 "
            f'(sglang/srt/utils/common.py::is_cpu); add server.env.SGLANG_USE_CPU_ENGINE: "1"'
        )
    timer = spec.server.env.get(_DEVICE_TIMER) == "1" or any(
        str(v) == "1" for v in (spec.space.params[_DEVICE_TIMER].values() if _DEVICE_TIMER in spec.space.params else ())
    )
    if timer:
        src = origin.get(_DEVICE_TIMER, "server.env")
        raise SpecError(
            f"{at}: cpu: {_DEVICE_TIMER}=1 ({src}) times forward passes with CUDA events, and SGLang "
            f'exits at start-up without a GPU ("Found no NVIDIA driver"); remove it (verify_ms then '
            f"comes from the log and the request timings)"
        )


def _flag_hint(flag: str, known: frozenset[str]) -> str:
    """did-you-mean for a flag: the full name of an argparse abbreviation, else the closest spelling."""
    longer = sorted((f for f in known if f.startswith(flag)), key=len)
    close = longer[:1] or difflib.get_close_matches(flag, sorted(known), n=1, cutoff=0.6)
    if close:
        return f"did you mean {close[0].removeprefix('--')!r}?"
    return "see the --help dump in orchestrator/reference/ for the flags of this version"


def load(path: str | Path) -> SweepSpec:
    """Read, merge and validate an experiment and its search spaces; raise SpecError on any mistake."""
    try:
        return _load(Path(path))
    except SpecError as exc:  # a value quoted back is cut, however long the user made it
        raise SpecError(yamlfile.bounded(str(exc))) from None


def _load(path: Path) -> SweepSpec:
    data = _read_yaml(path, "experiment")
    where = str(path)
    fields = [f for f in SweepSpec.model_fields if f not in ("space", "source")]
    for key in data:  # first, so that a misspelt `search_space` is reported as such
        if key not in fields:
            raise SpecError(f"{where}: {key}: unknown key; {did_you_mean(str(key), fields)}")
    spaces = _space_files(data.get("search_space"), where)
    params, origin = _merged_space(path, spaces)
    data = {
        **data,
        "search_space": spaces,
        "source": where,
        "space": {"name": "+".join(Path(s).stem for s in spaces), "params": params},
    }
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as err:
        raise SpecError(format_errors(err, SweepSpec, where)) from None
    _check_links(spec.space, origin, where)
    if spec.sampler.kind == "grid":
        try:
            check_enumerable(spec.space, "sampler.kind grid")
        except SpecError as exc:
            raise SpecError(f"{where}: sampler.kind: {exc}") from None
    _check_server(spec, origin, where)
    if spec.server.device == "cpu":
        _check_cpu_device(spec, origin, where)
    _check_adaptive(spec, origin, where)
    _check_objective(spec, where)
    return _objective_load(spec, where)


def _space_files(spaces: object, where: str) -> list[str]:
    """The experiment's `search_space`: one file or a list of them."""
    if isinstance(spaces, str):
        spaces = [spaces]
    if not isinstance(spaces, list) or not spaces or not all(isinstance(s, str) for s in spaces):
        got = "nothing" if spaces is None else repr(spaces)
        raise SpecError(
            f"{where}: search_space: must be a list of search-space files, but got {got}; "
            f"e.g. search_space: [../search_spaces/nccl.yaml]"
        )
    return spaces


def _merged_space(path: Path, spaces: list[str]) -> tuple[dict[str, ParamSpec], dict[str, str]]:
    """The knobs of every search-space file (relative to the experiment `path`), and the file each came from."""
    params: dict[str, ParamSpec] = {}
    origin: dict[str, str] = {}
    for rel in spaces:
        file = Path(os.path.normpath(path.parent / rel))  # experiments/../search_spaces/x -> search_spaces/x
        for name, p in load_space(file, named_in=str(path)).params.items():
            if name in params:
                raise SpecError(
                    f"{path}: search_space: knob {name} is defined in both {origin[name]} and "
                    f"{file}; keep it in one of them"
                )
            params[name] = p
            origin[name] = str(file)
    return params, origin
