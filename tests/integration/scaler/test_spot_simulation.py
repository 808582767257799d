"""GPU dollars in the elasticity simulation (bench/sim_spot.py): Spot prices, interruptions, shortages, on-demand
stand-ins (the real rule of inferq/scaling/capacity.py) and continuation, on the real scaling policy."""

from __future__ import annotations

from bench import sim_fleet, sim_market, sim_spot, sim_terms, simulate
from bench.sim_strategies import InferqPolicy
from bench.sim_work import with_tokens
from inferq.scaling.capacity import Fallback
from inferq.scaling.policy import ScalePolicy


def _day(seed: int = 20240601, quick: bool = True) -> tuple[sim_fleet.Scenario, sim_fleet.Trace, int]:
    sc = sim_fleet.Scenario(seed=seed)
    sc = sc.quick() if quick else sc
    trace = with_tokens(sim_fleet.make_trace(sc), sc.seed)
    return sc, trace, sim_fleet.peak_fleet(trace, sc)


def test_an_on_demand_market_is_the_fleet_as_it_was_priced() -> None:
    sc, trace, peak = _day()
    policy = simulate._policy(sc, 2 * peak)
    plain = sim_fleet.Sim(trace, sc).run(InferqPolicy(policy, every_s=10.0))
    priced, _ = sim_market.run_market(trace, sc, InferqPolicy(policy, every_s=10.0), sim_terms.Market())
    for key in ("gpu_minutes", "p50_wait_s", "p95_wait_s", "max_wait_s", "scale_changes", "jobs"):
        assert priced[key] == plain[key], key
    assert abs(priced["dollars"] - plain["gpu_minutes"] / 60 * sim_terms.ON_DEMAND_PER_H) < 1e-9
    assert priced["on_demand_share"] == 1.0 and priced["interruptions"] == 0


def test_the_seeded_day_on_spot_costs_at_most_40_percent_at_a_p95_no_worse_than_always_on() -> None:
    sc, trace, peak = _day(quick=False)
    rows = sim_spot.market_rows(trace, sc, simulate._policy(sc, 2 * peak), peak, keys=("spot",))
    goals = sim_spot.goals(rows, sim_spot.work_floor_minutes(trace, sc))
    assert goals["dollars_met"], goals
    assert rows["spot"]["jobs"] == rows["inferq"]["jobs"] == 10860  # every job served
    assert round(sim_spot.work_floor_minutes(trace, sc)) == 450


def test_interruptions_hand_work_back_and_continuation_throws_none_of_it_away() -> None:
    """Long generations, every Spot instance interrupted about once an hour: each job still ends once; handed-back
    jobs continue (nothing thrown away) or start over (their run so far thrown away); keeping every job for the
    drain and then releasing it, as before, throws away more."""
    sc = sim_fleet.Scenario().quick()
    trace = sim_spot.long_trace(sc)
    peak = sim_fleet.peak_fleet(trace, sc)
    rows = sim_spot.market_rows(trace, sc, simulate._policy(sc, 2 * peak), peak,
                                keys=("spot_stress", "spot_stress_restart", "spot_stress_before"))
    continued, restarted, before = rows["spot_stress"], rows["spot_stress_restart"], rows["spot_stress_before"]
    for row in (continued, restarted, before):
        assert row["jobs"] == len(trace.arrivals) and row["interruptions"] > 0 and row["handed_back"] > 0
    assert continued["thrown_gpu_s"] == 0 and continued["continued"] == continued["handed_back"]
    assert 0 < restarted["thrown_gpu_s"] < before["thrown_gpu_s"]
    assert continued["dollars"] < restarted["dollars"] < before["dollars"]


def test_a_spot_shortage_waits_without_stand_ins_and_is_covered_on_demand_with_them() -> None:
    sc, trace, peak = _day(quick=False)
    rows = sim_spot.market_rows(trace, sc, simulate._policy(sc, 2 * peak), peak,
                                keys=("spot_shortage", "spot_shortage_wait"))
    covered, waits = rows["spot_shortage"], rows["spot_shortage_wait"]
    assert waits["on_demand_share"] == 0 and covered["on_demand_share"] > 0
    assert covered["p95_wait_s"] < waits["p95_wait_s"] / 3
    assert covered["dollars"] < rows["inferq"]["dollars"] / 2


def test_a_task_waiting_for_spot_costs_nothing_and_a_reclaimed_instance_is_paid_to_the_end_of_its_notice() -> None:
    """One 400 s job on one Spot worker, a shortage until t=100, the worker interrupted at t=300: it waited 100 s
    unbilled, booted, ran the job 80 s, handed it back (it would not end within the drain) and was billed to the
    notice's end; the replacement continued the rest."""
    sc = sim_fleet.Scenario(seed=1, day_s=2000.0, bursts=0, boot_s=120.0)
    trace = sim_fleet.Trace(arrivals=[0.0], service=[400.0], bursts=[])
    market = sim_terms.Market(spot=True, shortages=((0.0, 100.0),))

    class OneThenInterrupt(sim_fleet.Controller):
        def start(self, sim: sim_fleet.Sim) -> None:
            sim.at(0.0, sim_fleet.TICK)

        def on_tick(self, sim: sim_fleet.Sim, now: float, tag: object) -> None:
            sim.set_desired(1, now)
            assert isinstance(sim, sim_market.MarketSim)
            sim.at(300.0, sim_market.INTERRUPT, sim.workers[0])

    sim = sim_market.MarketSim(trace, sc, market=market)
    result = sim.run(OneThenInterrupt())
    first, replacement = sim.workers
    assert isinstance(first, sim_market.Instance) and isinstance(replacement, sim_market.Instance)
    assert first.billed_from == 100.0 and first.reclaimed_at == 300.0 + sim_terms.NOTICE_S
    assert replacement.billed_from == 300.0
    assert result["interruptions"] == 1 and result["continued"] == 1 and result["thrown_gpu_s"] == 0
    # the job ran 80 s, then the rest (320 s + the re-read) once the replacement booted at 420 s
    assert sim.turnaround == [420.0 + 320.0 + sim_terms.CONTINUE_OVERHEAD_S]
    assert sim.waits == [220.0]  # the first attempt's start: 100 s for capacity, 120 s of boot


def test_stand_ins_follow_the_real_rule_in_the_sim() -> None:
    """The sim's scaler gives a Spot task that waited the delay an on-demand stand-in on the fallback service."""
    sc = sim_fleet.Scenario(seed=1, day_s=3000.0, bursts=0)
    trace = sim_fleet.Trace(arrivals=[0.0], service=[30.0], bursts=[])
    market = sim_terms.Market(spot=True, fallback_after_s=180.0, shortages=((0.0, 2000.0),))
    policy = ScalePolicy(gather_s=0.0)
    sim = sim_market.MarketSim(trace, sc, market=market)
    result = sim.run(sim_market.SpotPolicy(policy, every_s=10.0, fallback=Fallback(180.0)))
    assert result["jobs"] == 1
    fallback = [w for w in sim.workers if isinstance(w, sim_market.Instance) and w.service == "fallback"]
    assert len(fallback) == 1 and fallback[0].market == "od"
    # the Spot task was asked for at the first tick (t=0, with the job); its stand-in at the first tick once it
    # had waited the 180 s delay (ticks every 10 s), served after its boot
    assert 180.0 <= fallback[0].asked_at < 190.0
    assert sim.waits[0] == fallback[0].asked_at + sc.boot_s


def test_the_report_prints_the_dollar_rows_and_the_goals() -> None:
    sc, trace, peak = _day()
    section = sim_spot.dollars_section(sc, trace, peak, simulate._policy(sc, 2 * peak),
                                       long_policy=lambda p: simulate._policy(sc, 2 * p))
    text = sim_spot.render_dollars(section)
    assert "GPU dollars" in text and "always-on, on-demand" in text and "Spot mix" in text
    assert set(section["spot_share_at_price"]) == {"0.30", "0.40", "0.50"}
    assert set(section["long"]["rows"]) == {"always_on", "inferq", *sim_spot.LONG_KEYS}
    for key, row in section["rows"].items():
        assert row["jobs"] == len(trace.arrivals), key
