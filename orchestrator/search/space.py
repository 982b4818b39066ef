"""The search space as Optuna distributions, plus the feasibility rules checked before any launch.

SGLang's EAGLE rules (reference INTERFACE.md 1.2), enforced here so an infeasible point costs no
server start:
  1. all three of steps, top-k and draft tokens are given, or none (SGLang asserts on a partial
     set; with none it picks its own per-model defaults), and none without an algorithm;
  2. top-k 1 forces draft tokens = steps + 1 (SGLang silently overrides any other value, so a
     sweep that varied draft tokens at top-k 1 would measure the same server under two names);
  3. draft tokens - 1 <= top-k + (steps - 1) * top-k^2 (torch.topk over the candidate tree
     fails at CUDA-graph capture otherwise).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Mapping

from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution

from orchestrator.config.experiment import ParamSpec, SearchSpace
from orchestrator.records import ParamValue

EAGLE_KNOBS = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")


def distribution(param: ParamSpec) -> BaseDistribution:
    if param.choices is not None:
        return CategoricalDistribution(param.choices)
    assert param.low is not None and param.high is not None
    return IntDistribution(param.low, param.high, step=param.step, log=param.log)


def distributions(space: SearchSpace) -> dict[str, BaseDistribution]:
    return {name: distribution(p) for name, p in space.params.items()}


def is_active(param: ParamSpec, chosen: Mapping[str, ParamValue]) -> bool:
    """A conditional parameter exists only when every `when` knob has one of the given values."""
    for knob, wanted in param.when.items():
        options = wanted if isinstance(wanted, list) else [wanted]
        if chosen.get(knob) not in options:
            return False
    return True


def ordered(space: SearchSpace) -> list[str]:
    """Parameter names with every `when` dependency before its dependents (stable otherwise)."""
    names = list(space.params)
    done: list[str] = []
    while names:
        progressed = False
        for n in list(names):
            if all(d in done for d in space.params[n].when):
                done.append(n)
                names.remove(n)
                progressed = True
        if not progressed:
            raise ValueError(f"`when` conditions form a cycle among {names}")
    return done


def complete(space: SearchSpace, chosen: Mapping[str, ParamValue]) -> dict[str, ParamValue]:
    """Every knob of the space, inactive ones as None (not set), in space order."""
    return {name: chosen.get(name) for name in space.params}


def baseline_params(space: SearchSpace) -> dict[str, ParamValue]:
    """No speculation, no NCCL variables, engine defaults everywhere: every knob None."""
    return {name: None for name in space.params}


def effective(params: Mapping[str, ParamValue]) -> dict[str, ParamValue]:
    """The point as SGLang will run it: at top-k 1 draft tokens is not a free knob (SGLang forces
    steps + 1), so a space may leave it out there (`when: {speculative_eagle_topk: [2, 4]}`) and the
    value is filled in here, for the launch plan and the model alike."""
    out = dict(params)
    if (out.get("speculative_algorithm") is not None and out.get("speculative_eagle_topk") == 1
            and out.get("speculative_num_steps") is not None and out.get("speculative_num_draft_tokens") is None):
        out["speculative_num_draft_tokens"] = int(out["speculative_num_steps"]) + 1  # type: ignore[arg-type]
    return out


def infeasible_reason(params: Mapping[str, ParamValue]) -> str | None:
    """The rule a point breaks, in words, or None when SGLang would run it as asked."""
    params = effective(params)
    algo = params.get("speculative_algorithm")
    eagle = {k: params.get(k) for k in EAGLE_KNOBS}
    given = [k for k, v in eagle.items() if v is not None]
    if algo is None:
        if given:
            return f"{', '.join(given)} set without speculative_algorithm"
        return None
    if not given:
        return None  # SGLang chooses steps, top-k and draft tokens for the model itself
    if len(given) != 3:
        missing = [k for k in EAGLE_KNOBS if eagle[k] is None]
        return (f"EAGLE needs steps, top-k and draft tokens all together or none (SGLang asserts); "
                f"missing {', '.join(missing)}")
    steps, topk, ndt = (int(eagle[k]) for k in EAGLE_KNOBS)  # type: ignore[arg-type]
    if topk == 1 and ndt != steps + 1:
        return (f"top-k 1 forces draft tokens = steps + 1 = {steps + 1}, but got {ndt} "
                f"(SGLang would silently run {steps + 1})")
    capacity = topk + (steps - 1) * topk * topk
    if ndt - 1 > capacity:
        return (f"draft tokens - 1 <= topk + (steps - 1) * topk^2 must hold, but got "
                f"{ndt} - 1 > {topk} + {steps - 1}*{topk}^2 = {capacity}")
    return None


def points(space: SearchSpace) -> Iterator[dict[str, ParamValue]]:
    """Every distinct point of the space (inactive knobs None), feasible or not."""
    names = ordered(space)
    seen: set[tuple] = set()

    def expand(i: int, chosen: dict[str, ParamValue]) -> Iterator[dict[str, ParamValue]]:
        if i == len(names):
            key = tuple(sorted((k, repr(v)) for k, v in chosen.items()))
            if key not in seen:
                seen.add(key)
                yield complete(space, chosen)
            return
        name = names[i]
        param = space.params[name]
        if not is_active(param, chosen):
            yield from expand(i + 1, {**chosen, name: None})
            return
        for v in param.values():
            yield from expand(i + 1, {**chosen, name: v})

    yield from expand(0, {})


def random_point(space: SearchSpace, rng) -> dict[str, ParamValue]:
    """One point drawn uniformly per dimension (inactive knobs None); may be infeasible."""
    chosen: dict[str, ParamValue] = {}
    for name in ordered(space):
        param = space.params[name]
        chosen[name] = rng.choice(param.values()) if is_active(param, chosen) else None
    return complete(space, chosen)


def size(space: SearchSpace) -> int:
    """Upper bound of distinct points (product of dimension sizes), without enumerating."""
    return math.prod(len(p.values()) for p in space.params.values())


def _components(space: SearchSpace) -> list[list[str]]:
    """Groups of knobs linked by `when` conditions or by the EAGLE feasibility rules."""
    parent = {n: n for n in space.params}

    def find(n: str) -> str:
        while parent[n] != n:
            n = parent[n]
        return n

    def union(a: str, b: str) -> None:
        parent[find(a)] = find(b)

    for name, param in space.params.items():
        for dep in param.when:
            if dep in parent:
                union(name, dep)
    rule_knobs = [k for k in ("speculative_algorithm", *EAGLE_KNOBS) if k in parent]
    for a, b in zip(rule_knobs, rule_knobs[1:]):
        union(a, b)
    groups: dict[str, list[str]] = {}
    for name in space.params:
        groups.setdefault(find(name), []).append(name)
    return list(groups.values())


def census(space: SearchSpace) -> tuple[int, int, Counter]:
    """(distinct points, feasible points, infeasible count per rule).

    Feasibility only involves the EAGLE knobs, so the space is split into independent groups and
    only the group holding those knobs is enumerated; the other groups multiply the counts.
    """
    total, feasible = 1, 1
    reasons: Counter = Counter()
    for names in _components(space):
        sub = SearchSpace(params={n: space.params[n] for n in names})
        n_total = n_feasible = 0
        sub_reasons: Counter = Counter()
        for p in points(sub):
            n_total += 1
            why = infeasible_reason(p)
            if why is None:
                n_feasible += 1
            else:
                sub_reasons[_rule_of(why)] += 1
        total *= n_total
        feasible *= n_feasible
        reasons = Counter({rule: count * n_total for rule, count in reasons.items()})
        reasons.update({rule: count * (total // n_total) for rule, count in sub_reasons.items()})
    return total, feasible, reasons


def _rule_of(reason: str) -> str:
    """Group reasons by the rule they break (drop the numbers) for a summary."""
    if reason.startswith("top-k 1"):
        return "top-k 1 forces draft tokens = steps + 1"
    if reason.startswith("draft tokens - 1"):
        return "draft tokens - 1 <= topk + (steps - 1) * topk^2"
    if reason.startswith("EAGLE needs"):
        return "EAGLE needs steps, top-k and draft tokens all together or none"
    if reason.endswith("set without speculative_algorithm"):
        return "EAGLE knobs set without speculative_algorithm"
    return reason


def key(params: Mapping[str, ParamValue]) -> str:
    """A stable identity for a point, to find repeats of failed or measured configurations."""
    return ";".join(f"{k}={params[k]!r}" for k in sorted(params))
