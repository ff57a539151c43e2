"""The simulator's ``dynamo-python`` arm: Dynamo's Python port's rules."""

from __future__ import annotations

from dataclasses import replace

from dynamo_thunderagent.bench.sim.engine import (
    Cluster,
    EngineConfig,
    EventLoop,
    SimRequest,
    Worker,
)
from dynamo_thunderagent.bench.sim.python_port import DynamoPythonArm, PortParameters
from dynamo_thunderagent.bench.sim.run import regime_scenario
from dynamo_thunderagent.bench.sim.simulation import RunConfig, Simulation

# The arm never runs the engine; the workers only give it their pools.
_TIMING = regime_scenario("cheap-recompute").timing


class _Host:
    """Records what the arm dispatches; the clock is set by the test. Each worker holds
    ``blocks`` one-token blocks: 0.95 of 2,048 is 1,945.6, 0.85 is 1,740.8, 0.80 is 1,638.4."""

    def __init__(self, workers: int = 1, blocks: int = 2048) -> None:
        loop = EventLoop()
        self.cluster = Cluster([Worker(i, EngineConfig(blocks, 1, _TIMING), loop,
                                       lambda r: None, lambda r: None)
                                for i in range(workers)])
        self.clock = 0.0
        self.sent: dict[str, int] = {}
        self.requests: dict[str, SimRequest] = {}

    def turn(self, session: str, turn: int, prompt: int) -> SimRequest:
        """A turn of ``prompt`` tokens that generates none (its context is its prompt)."""
        request = SimRequest(f"{session}/{turn}", session, turn, prompt, 0, 0, self.clock)
        self.requests[request.request_id] = request
        return request

    def now(self) -> float:
        return self.clock

    def dispatch(self, request_id: str, worker: int) -> None:
        self.sent[request_id] = worker

    def reject(self, request_id: str, reason: str) -> None:
        raise AssertionError(f"the port rejects nothing: {request_id} {reason}")

    def done(self, session: str, turn: int, context: int) -> SimRequest:
        """The turn finished with ``context`` tokens; like the simulation, forget it first."""
        self.requests.pop(f"{session}/{turn}")
        return SimRequest(f"{session}/{turn}", session, turn, context, 0, 0, self.clock)

    def request(self, request_id: str) -> SimRequest:
        return self.requests[request_id]

    def in_flight(self, request_id: str) -> bool:
        return request_id in self.sent


def _arm(host: _Host, params: PortParameters | None = None) -> DynamoPythonArm:
    arm = DynamoPythonArm(params)
    arm.bind(host)  # type: ignore[arg-type]  # the host stub offers what the arm uses
    return arm


def _four_programs(host: _Host) -> DynamoPythonArm:
    """a 350 and b 300 tokens between turns, c 500 and d 450 in a turn: with the 100-token
    buffer each, 2,000 on one 2,048-token worker."""
    arm = _arm(host)
    for session, prompt in (("a", 350), ("b", 300), ("c", 500), ("d", 450)):
        arm.submit(host.turn(session, 0, prompt))
    for session in ("a", "b"):
        arm.completed(host.done(session, 0, arm.programs[session].tokens))
    return arm


def test_new_programs_are_admitted_up_to_the_whole_pool_though_it_pauses_above_095() -> None:
    host = _Host()
    arm = _four_programs(host)
    assert set(host.sent) == {"a/0", "b/0", "c/0", "d/0"}  # 2,000 > 1,945.6 admitted
    arm.submit(host.turn("e", 0, 0))  # 100 more: over the whole pool, so e waits
    assert "e/0" not in host.sent and arm.counters()["pauses"] == 1


def test_a_tick_pauses_the_smallest_program_out_on_a_tool_down_to_080() -> None:
    host = _Host()
    arm = _four_programs(host)
    arm.tick()  # b (400 with its buffer) brings 2,000 to 1,600 <= 1,638.4; a stays
    assert list(arm.paused) == ["b"]
    assert arm.programs["a"].worker == 0 and arm.programs["b"].worker is None
    assert not any(p.marked for p in arm.programs.values())


def test_when_pausing_every_acting_program_is_not_enough_every_reasoning_one_is_marked() -> None:
    host = _Host()
    arm = _arm(host)
    for session, prompt in (("a", 200), ("c", 750), ("d", 750)):  # 300 + 850 + 850
        arm.submit(host.turn(session, 0, prompt))
    arm.completed(host.done("a", 0, 200))
    arm.tick()  # a paused: 1,700 > 1,638.4, so c and d are marked
    assert list(arm.paused) == ["a"]
    assert arm.programs["c"].marked and arm.programs["d"].marked
    arm.completed(host.done("c", 0, 750))  # a marked program pauses when its turn ends
    assert list(arm.paused) == ["a", "c"] and not arm.programs["c"].marked


def test_new_programs_queue_behind_a_paused_one_even_with_room() -> None:
    host = _Host()
    arm = _four_programs(host)
    arm.tick()  # b paused between turns, no turn of it waiting; 448 tokens free
    arm.submit(host.turn("e", 0, 10))
    assert "e/0" not in host.sent and "e" in arm.paused


def test_a_placed_program_is_never_held_whatever_the_usage() -> None:
    host = _Host()
    arm = _four_programs(host)
    arm.tick()
    arm.submit(host.turn("a", 1, 1500))  # a stays placed: its turn goes at once, over the pool
    assert host.sent["a/1"] == 0


def test_a_paused_programs_turn_waits_for_a_tick_with_room_below_085() -> None:
    host = _Host()
    arm = _four_programs(host)
    arm.tick()  # b paused; 1,600 used
    arm.submit(host.turn("b", 1, 200))
    arm.tick()  # room below 0.85: 1,740 - 1,600 = 140 < 300 (below 0.95 it would fit)
    assert "b/1" not in host.sent
    arm.completed(host.done("c", 0, 500))
    arm.session_final("c")  # 600 freed, but only a tick resumes
    assert "b/1" not in host.sent
    arm.tick()
    assert host.sent["b/1"] == 0 and not arm.paused
    assert arm.counters() == {"pauses": 1, "resumes": 1, "forced_resumes": 0}


def test_a_resume_picks_the_worker_with_most_room_so_the_program_moves() -> None:
    host = _Host(workers=2)
    arm = _arm(host)
    arm.submit(host.turn("p", 0, 400))  # worker 0 (a tie goes to the first)
    arm.submit(host.turn("q", 0, 800))  # worker 1, the less used
    arm.submit(host.turn("r", 0, 1400))  # worker 0: 500 + 1,500 = 2,000 fits the whole pool
    assert [host.sent[r] for r in ("p/0", "q/0", "r/0")] == [0, 1, 0]
    arm.completed(host.done("p", 0, 400))
    arm.tick()  # worker 0 above 0.95: p paused
    arm.submit(host.turn("p", 1, 450))
    arm.tick()  # worker 0 has 240 below 0.85, worker 1 has 840: p goes there
    assert host.sent["p/1"] == 1


def test_a_wait_past_the_timeout_from_its_turns_arrival_is_cut_off_on_the_least_used() -> None:
    host = _Host(workers=2)
    arm = _arm(host, PortParameters(resume_timeout_seconds=10.0))
    arm.submit(host.turn("p", 0, 150))  # worker 0: 250
    arm.submit(host.turn("big1", 0, 1550))  # worker 1, the less used: 1,650
    arm.submit(host.turn("big2", 0, 1600))  # worker 0: 1,950, above 0.95
    arm.completed(host.done("p", 0, 150))
    arm.tick()  # p paused at t=0; below 0.85 neither worker has its 250 again
    assert list(arm.paused) == ["p"]
    host.clock = 6.0
    arm.submit(host.turn("p", 1, 150))  # its turn starts waiting now
    host.clock = 10.0
    arm.tick()  # 10 s after the pause, 4 s after the turn came: not yet
    assert "p/1" not in host.sent
    host.clock = 16.0
    arm.tick()  # room left: worker 0 2,048 - 1,700 = 348, worker 1 2,048 - 1,650 = 398
    assert host.sent["p/1"] == 1 and arm.counters()["forced_resumes"] == 1


def test_a_turn_in_flight_counts_what_it_has_generated_so_far() -> None:
    host = _Host()
    arm = _arm(host)
    arm.submit(host.turn("b", 0, 300))
    arm.completed(host.done("b", 0, 300))  # b between turns: 400 with its buffer
    arm.submit(host.turn("a", 0, 1400))  # 1,500: 1,900 in all, below 0.95
    arm.tick()
    assert not arm.paused
    host.requests["a/0"].generated = 100  # 2,000 with a's reply so far: above 0.95
    arm.tick()
    assert list(arm.paused) == ["b"]


def test_a_paused_programs_waiting_turn_resumes_before_a_new_program_that_is_smaller() -> None:
    host = _Host()
    arm = _arm(host)
    for session, prompt in (("a", 300), ("c", 1000), ("d", 400)):  # 400 + 1,100 + 500
        arm.submit(host.turn(session, 0, prompt))
    arm.completed(host.done("a", 0, 300))
    arm.tick()  # a paused: 1,600
    arm.submit(host.turn("a", 1, 300))  # a's turn waits: 400
    arm.submit(host.turn("y", 0, 200))  # new, queued behind a: 300
    arm.completed(host.done("d", 0, 400))
    arm.session_final("d")  # 1,100 used: 640 below 0.85, room for one of the two
    arm.tick()
    assert "a/1" in host.sent and "y/0" not in host.sent and list(arm.paused) == ["y"]


def test_a_full_run_drains_every_program_and_leaves_no_turn_waiting() -> None:
    scenario = replace(regime_scenario("cheap-recompute"), warmup_s=30.0, window_s=90.0)
    config = RunConfig(agents=30, workers=scenario.workers, engine=scenario.engine(),
                       warmup_s=scenario.warmup_s, window_s=scenario.window_s)
    arm = DynamoPythonArm()
    result = Simulation(config, arm, scenario.plans(0)).run()
    assert result.pauses > 0 and result.resumes > 0  # the gate was exercised
    assert result.drained and result.problems == ()
    assert not arm.programs and not arm.paused
