"""The words every view of a finished sweep shares, rendered from its one `Verdict`: the headline (which
configuration is deployed, and the search's pick where another one won), its knobs, the gain line
(confirmed only where a gate ran), the parts with whose they are, and the load levels.

Plain text: the CLI prints it (markup off), the MLflow descriptions wrap it in markdown (`markdown`).
"""

from __future__ import annotations

from orchestrator.results.figures import streams
from orchestrator.verdict.value import Configuration, Verdict


def knob_lines(config: Configuration | None, indent: str = "    ") -> list[str]:
    """`K = V` per knob the configuration sets, or that it runs the engine's defaults."""
    if config is None:
        return []
    # By name: the same order whether the Verdict is the run's own or read back from summary.json.
    return [f"{indent}{k} = {v}" for k, v in sorted(config.params.items())] or [f"{indent}(engine defaults)"]


def headline(v: Verdict) -> str:
    """Which configuration won, in one line: the deployed one (and the search's pick where it differs), or
    that none was deployed and why in a word."""
    if v.deployed is not None:
        other = f" (instead of {v.pick.label}, the search's pick)" if v.replaced and v.pick is not None else ""
        unconfirmed = " UNCONFIRMED" if not v.gated else ""
        return f"deployed{unconfirmed}: {v.deployed.label}{other}"
    outcome = v.outcome.words if v.outcome is not None else "interrupted"
    if v.pick is not None:
        return f"not deployed ({outcome}): the search's pick was {v.pick.label}"
    return f"not deployed ({outcome})"


def gain_line(v: Verdict) -> str | None:
    """The subject's own figures against the baseline: "confirmed over N interleaved rounds ..." where a
    gate ran, "UNCONFIRMED (search phase, one measurement) ..." where none did; None without figures."""
    return v.figures.text() if v.figures is not None else None


def gain_markdown(v: Verdict) -> str | None:
    """The gain in bold for the MLflow descriptions: "Confirmed gain" only where a gate ran."""
    f = v.figures
    if f is None:
        return None
    at = f" at {streams(f.concurrency)}" if f.concurrency is not None else ""
    if not v.gated:
        return (
            f"**Unconfirmed gain{at}: {f.gain * 100:+.1f}%** {f.metric} over the baseline (search phase, one "
            f"measurement each, no gate ran: promotion.max_rounds is 0)."
        )
    bounds = (
        f" (gate bounds {f.low * 100:+.1f}% to {f.high * 100:+.1f}%, {f.rounds} rounds)"
        if f.low is not None and f.high is not None
        else f" ({f.rounds} rounds)"
    )
    return f"**Confirmed gain{at}: {f.gain * 100:+.1f}%** {f.metric} over the baseline{bounds}."


def pick_line(v: Verdict) -> str | None:
    """The search's pick with its search-phase figure, where it is not what was deployed (or nothing was)."""
    if v.pick is None or (v.deployed is not None and not v.replaced):
        return None
    value = f": {v.metric} {v.pick_value:.2f} in one search-phase run (optimistic)" if v.pick_value is not None else ""
    return f"the search's pick: {v.pick.label}{value}"


def part_lines(v: Verdict) -> list[str]:
    """`<heading>: <part> <gain> [interval]` per part measured in the rounds."""
    return [f"{v.parts_heading()}: {p.text()}" for p in v.parts]


def lines(v: Verdict) -> list[str]:
    """The verdict as the run's final print and `sweep status` show it, top to bottom."""
    out = [headline(v), *knob_lines(v.deployed or v.pick)]
    if (gain := gain_line(v)) is not None:
        out.append(f"  {gain}")
    if v.replaced:
        out.append(f"  {v.replaced}")
    if (pick := pick_line(v)) is not None:
        out.append(f"  {pick}")
    out += [f"  {line}" for line in part_lines(v)]
    if v.by_load:
        out.append(f"  by load: {v.by_load}")
    out += [f"  not measured: {m}" for m in v.not_measured]
    return out


def markdown(v: Verdict) -> list[str]:
    """The verdict's blocks for an MLflow description (the parent run's and the model version's)."""
    blocks = [f"**{_first_up(headline(v))}**"]
    if (gain := gain_markdown(v)) is not None:
        blocks.append(gain)
    if v.replaced:
        blocks.append(v.replaced + ".")
    if (pick := pick_line(v)) is not None:
        blocks.append(_first_up(pick) + ".")
    config = v.deployed or v.pick
    if config is not None:
        knobs = "\n".join(f"- `{k}={val}`" for k, val in sorted(config.params.items())) or "- engine defaults"
        blocks.append(f"**Knobs of {config.label}**:\n{knobs}")
    if v.parts:
        blocks.append(f"**{_first_up(v.parts_heading())}**:\n" + "\n".join(f"- {p.text()}" for p in v.parts))
    if v.by_load:
        blocks.append(f"**By load**: {v.by_load}")
    if v.text:
        blocks.append(f"Verdict: {v.text}")
    return blocks


def _first_up(text: str) -> str:
    return text[:1].upper() + text[1:]
