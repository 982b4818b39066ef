"""A night's split scales with the night (issue 34): the confirmation's other arms fit the share of the
night and leave the search its floor (promotion.min_search_trials), least valuable first. Planned from the
cost model at real scale (simulator.time_scale 1: about 13-minute trials), as `sweep plan` prints it."""

from __future__ import annotations

from dataclasses import replace

from e2e_helpers import demo_experiment, write_experiment

from orchestrator.config import experiment as spec_mod
from orchestrator.verdict import schedule


def night(tmp_path, hours: float, **promotion: object) -> spec_mod.SweepSpec:
    """The demo experiment at real scale with the kimi experiment's confirmation, over a night of `hours`."""
    data = demo_experiment(
        name=f"night-{hours:g}h",
        simulator={"time_scale": 1.0},
        server={"startup_timeout_s": 1800},
        benchmark={"requests": 16, "input_len": 512, "output_len": 512, "warmup_requests": 2, "stall_timeout_s": 300},
        budget={"trials": 1000, "concurrent_trials": 1, "trial_timeout_s": 3600, "wall_time": f"{hours:g}h"},
        sampler={"kind": "tpe", "seed": 0, "startup_trials": 10},
        promotion={"min_rounds": 3, "max_rounds": 12, "explain": True, "concurrency": [1, 8, 32], **promotion},
    )
    return spec_mod.load(write_experiment(tmp_path, data, name=f"night-{hours:g}h.yaml"))


def kept(plan: schedule.NightPlan) -> set[str]:
    return {a.name for a in plan.confirmation.arms}


def test_a_short_night_keeps_the_search_its_floor_and_drops_the_least_valuable_arms_first(tmp_path):
    short = schedule.night_plan(night(tmp_path, 3.5))
    # 15 search trials (1.5 x sampler.startup_trials) and the gate's pair leave room for the runner-up,
    # the arm of most value; the ablations and the other load levels would cut into the search: dropped,
    # each with a line saying so.
    assert kept(short) == {"champion", "baseline", "runner_up"}
    assert short.fits and short.search_s >= 15 * short.trial_s and short.trials >= 15
    floor_lines = [line for line in short.lines() if "would leave the search fewer than 15 trials" in line]
    assert any(line.startswith("confirmation: no_speculation not measured") for line in floor_lines)
    assert any(line.startswith("confirmation: champion@8 not measured") for line in floor_lines)
    assert f"({15 * short.trial_s / 3600:.2f} h, promotion.min_search_trials)" in floor_lines[0]
    # An hour less and the runner-up goes too; the gate's pair is measured whatever the floor.
    shorter = schedule.night_plan(night(tmp_path, 2.5))
    assert kept(shorter) == {"champion", "baseline"}
    assert shorter.search_s == shorter.wall_s - shorter.probe_s - shorter.confirmation.seconds


def test_a_long_night_is_bounded_by_the_share_not_the_floor(tmp_path):
    long = schedule.night_plan(night(tmp_path, 8))
    # Eight hours leave the search its floor with the share spent: the arms of most value are measured,
    # the first one past the share is dropped for the share.
    assert kept(long) >= {"champion", "baseline", "runner_up", "no_speculation", "default_communication"}
    assert long.search_s >= 15 * long.trial_s
    assert any("past promotion.confirm_share" in line for line in long.lines())


def test_the_floor_is_the_users_and_never_above_the_trial_budget(tmp_path):
    # min_search_trials 0: the split as before (the share alone) keeps the ablations on a 3.5-hour night.
    none = schedule.night_plan(night(tmp_path, 3.5, min_search_trials=0))
    assert {"runner_up", "no_speculation"} <= kept(none)
    assert none.search_s < schedule.night_plan(night(tmp_path, 3.5)).search_s
    spec = night(tmp_path, 4)
    assert schedule.search_floor_trials(spec) == 15
    assert schedule.search_floor_trials(night(tmp_path, 4, min_search_trials=30)) == 30
    few = spec.model_copy(update={"budget": spec.budget.model_copy(update={"trials": 6})})
    assert schedule.search_floor_trials(few) == 6  # a search of 6 trials keeps no more than those


def test_a_reserve_of_the_pair_alone_holds_the_baselines_own_seconds():
    # The search's median trial speculates; the baseline decodes slower, so its rounds take longer: planned
    # at the median alone, the gate's third round did not fit a 4-hour night's reserve of the pair.
    arms = [("champion", 1, True), ("baseline", 1, True), ("runner_up", 1, False)]

    def fitted(arms: list[tuple[str, int, bool]]) -> schedule.ConfirmationPlan:
        return schedule.plan(
            arms, seconds=lambda c: 600.0, left_s=8 * 3600, share_s=8 * 3600, min_rounds=3, gate_level=1
        )

    pair = fitted(arms[:2])
    held = replace(pair, pair_s=3 * (600.0 + 800.0))
    assert pair.seconds == 3600.0 and held.seconds == 4200.0
    assert any("the gate's pair with the baseline at its own measured seconds" in line for line in held.lines())
    # With another arm beside it, that arm gives way to the pair at the confirmation: it covers the difference.
    three = replace(fitted(arms), pair_s=4200.0)
    assert three.seconds == 5400.0 and not any("own measured seconds" in line for line in three.lines())
