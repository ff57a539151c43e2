"""A host KV tier: the simulator's model of it, and the scheduler's use of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynamo_thunderagent.bench.sim.engine import EngineConfig, EventLoop, SimRequest, Worker
from dynamo_thunderagent.bench.sim.kv import HostCache, KvPool
from dynamo_thunderagent.bench.sim.timing import TimingModel
from dynamo_thunderagent.catalog import default_catalog, load_policy
from dynamo_thunderagent.config import with_host_tier
from dynamo_thunderagent.costs import EngineCosts, HostTierCosts, MeasuredRecompute
from dynamo_thunderagent.policy_files import EXTENDED_POLICY

from .conftest import W0, make

# ---- the simulator's host tier ------------------------------------------------------------


def test_the_host_keeps_one_range_per_chain_and_evicts_the_oldest_from_its_tail() -> None:
    host = HostCache(10)
    host.store("a", 4, 6)
    host.store("a", 2, 4)  # the chain's GPU prefix shrank further: one range [2, 6)
    assert host.reach("a", 2) == 6 and host.reach("a", 1) == 1  # a gap: unreachable
    host.store("b", 0, 8)  # 6 + 8 > 10: "a" (stored first) loses its tail
    host.check()
    assert host.reach("a", 2) == 4 and host.reach("b", 0) == 8
    host.drop("b")
    assert host.used_blocks == 2 and host.reach("b", 0) == 0


def test_blocks_evicted_from_the_gpu_come_back_from_the_host() -> None:
    kv = KvPool(10, 16, host_blocks=40)
    kv.acquire(0, "a", 8)
    kv.release(0, "a", keep_blocks=8)
    taken = kv.acquire(0, "b", 6)  # evicts 4 of a's blocks (its tail) to the host
    assert taken.offloaded_blocks == 4
    kv.release(0, "b", keep_blocks=6)
    back = kv.plan(0, "a", 8)
    assert (back.chain_hit, back.loaded_blocks, back.hit_blocks) == (4, 4, 8)
    assert kv.acquire(0, "a", 8).loaded_blocks == 4
    kv.check()
    without = KvPool(10, 16)
    without.acquire(0, "a", 8)
    without.release(0, "a", keep_blocks=8)
    assert without.acquire(0, "b", 6).offloaded_blocks == 0
    without.release(0, "b", keep_blocks=6)
    assert without.plan(0, "a", 8).hit_blocks == 4  # the tail is recomputed


def test_a_compacted_chain_is_not_served_from_the_host() -> None:
    kv = KvPool(4, 16, host_blocks=8)
    kv.acquire(0, "a", 4)
    kv.release(0, "a", keep_blocks=4)
    kv.acquire(0, "b", 4)  # a goes to the host
    kv.release(0, "b", keep_blocks=4)
    kv.retire("a")
    assert kv.plan(0, "a", 4).hit_blocks == 0


def _request(rid: str, session: str, prompt: int, output: int = 2) -> SimRequest:
    return SimRequest(rid, session, 0, prompt, output, system_tokens=0, sent_at=0.0)


def test_a_turn_found_on_the_host_waits_for_its_copy_and_the_engine_does_not() -> None:
    timing = TimingModel(name="t", prefill_pass_s=0.0, prefill_per_token_s=1e-3,
                         decode_base_s=0.01)
    config = EngineConfig(total_blocks=16, block_size=16, timing=timing, host_blocks=64,
                          host_copy_s_per_token=1e-2)
    loop = EventLoop()
    worker = Worker(0, config, loop, lambda r: None, lambda r: None)
    worker.submit(_request("a1", "a", 100))  # 7 blocks
    loop.run(until=10)
    worker.submit(_request("b1", "b", 200))  # 13 blocks: 4 of a's go to the host
    loop.run(until=20)
    busy = _request("c1", "c", 16, output=40)  # 4 blocks: the rest of a's go to the host
    worker.submit(busy)
    loop.run(until=20.001)
    again = _request("a2", "a", 100)
    worker.submit(again)
    loop.run(until=60)
    # Its 6 full blocks, all copied back: only the partial last block is computed.
    assert again.cached_tokens == 96 and again.loaded_tokens == 96
    assert again.scheduled_at is not None and again.ready_at > again.scheduled_at
    assert again.first_token_at is not None and again.first_token_at >= again.ready_at
    # The decode beside it ran on while the copy lasted.
    assert busy.finished_at is not None and busy.finished_at < again.ready_at
    worker.kv.check()


# ---- the scheduler: a pause saves nothing while the tier has room -------------------------


def test_the_tier_absorbs_what_a_pause_would_save_until_it_is_full() -> None:
    costs = HostTierCosts(MeasuredRecompute(0.5))
    costs.set_costs(EngineCosts(prefill_seconds_per_token=1e-3, decode_seconds=1.0))
    costs.set_spare(tier_tokens=1_000, gpu_tokens=2_000, held_tokens=2_500)  # 500 spare
    assert not costs.pause_pays(500, batch=1)  # all of it survives on the host
    assert costs.pause_pays(1_200, batch=1)  # 700 recomputed: 0.7 s >= 0.5 x 1 s
    assert costs.stall_seconds(500, 1) == pytest.approx(0.5)  # a move leaves the copy behind
    costs.set_spare(tier_tokens=1_000, gpu_tokens=2_000, held_tokens=4_000)
    assert costs.pause_pays(100, batch=10)


@pytest.mark.parametrize(("host_kv_blocks", "paused"), [(0, ["small"]), (10_000, []),
                                                         (100, ["small"])])  # fmt: skip
def test_pressure_pauses_nobody_while_the_host_tier_keeps_the_overflow(
    host_kv_blocks: int, paused: list[str]
) -> None:
    h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9,
             pause_min_recompute_ratio=0.5, host_kv_blocks=host_kv_blocks)
    h.scheduler.observe_costs(EngineCosts(prefill_seconds_per_token=1e-3, decode_seconds=1.0))
    h.workers({W0: 2_000})
    h.acting_on("small", W0, 600)
    h.acting_on("big", W0, 1_200)
    h.workers({W0: 1_500})  # 1,800 held on a 1,500 pool: 300 spill to a tier, if any
    assert h.tick().paused == paused


def test_a_policy_without_host_kv_blocks_learns_the_clusters_tier() -> None:
    resolved = load_policy(EXTENDED_POLICY, default_catalog())
    assert resolved.classifier is not None
    told = with_host_tier(resolved.classifier, 4096)
    assert told.parameters.host_kv_blocks == 4096  # type: ignore[attr-defined]
    assert with_host_tier(resolved.classifier, 0) is resolved.classifier


def test_a_policy_that_sets_host_kv_blocks_keeps_its_choice(tmp_path: Path) -> None:
    policy = tmp_path / "blind.yaml"
    policy.write_text("request_classifier:\n  type: thunderagent\n"
                      "  parameters:\n    host_kv_blocks: 0\n")  # fmt: skip
    resolved = load_policy(policy, default_catalog())
    assert resolved.classifier is not None
    assert with_host_tier(resolved.classifier, 4096) is resolved.classifier


def test_a_benchmark_hands_ours_a_policy_told_of_the_tier_and_leaves_others_alone(
    tmp_path: Path,
) -> None:
    from dynamo_thunderagent.bench import live_cli
    from dynamo_thunderagent.bench.live import prepare_regime
    from dynamo_thunderagent.bench.live_sweep import ArmSpec
    from dynamo_thunderagent.policy_files import PARITY_POLICY

    from .test_live import _args  # the CLI's own parsing, as a user runs it

    config = live_cli.config_from_args(_args("--regime", "tiered", "--workload", "toy",
                                         "--policy-clock", "wall"))  # the tier alone
    tiered = prepare_regime(config, "tiered", tmp_path)
    assert tiered.host_blocks > 0
    assert f"{tiered.host_blocks}" in tiered.mocker_args
    told = tiered.policy_for(ArmSpec("ours", "ours"))
    assert told is not None and told != EXTENDED_POLICY
    resolved = load_policy(told, default_catalog())
    assert resolved.classifier is not None
    assert resolved.classifier.parameters.host_kv_blocks == tiered.host_blocks  # type: ignore[attr-defined]
    builtin = ArmSpec("builtin", "builtin", PARITY_POLICY)  # Dynamo's plugin: not ours to tell
    assert tiered.policy_for(builtin) == PARITY_POLICY
    calibrated = prepare_regime(config, "calibrated", tmp_path)
    assert calibrated.host_blocks == 0 and calibrated.policy_for(ArmSpec("ours", "ours")) is None


def test_a_tiered_regime_without_a_work_dir_refuses_to_derive_a_policy(tmp_path: Path) -> None:
    import dataclasses

    from dynamo_thunderagent.bench import live_cli
    from dynamo_thunderagent.bench.live import prepare_regime
    from dynamo_thunderagent.bench.live_sweep import ArmSpec

    from .test_live import _args

    config = live_cli.config_from_args(_args("--regime", "tiered", "--workload", "toy",
                                         "--policy-clock", "wall"))  # the tier alone
    tiered = dataclasses.replace(prepare_regime(config, "tiered", tmp_path), work_dir=None)
    with pytest.raises(ValueError, match="needs a work_dir"):
        tiered.policy_for(ArmSpec("ours", "ours"))


def test_a_reload_that_turns_on_the_host_tier_sizes_its_room_at_once() -> None:
    h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9,
             pause_min_recompute_ratio=0.5)
    h.scheduler.observe_costs(EngineCosts(prefill_seconds_per_token=1e-3, decode_seconds=1.0))
    h.workers({W0: 2_000})
    h.acting_on("small", W0, 600)
    h.acting_on("big", W0, 1_200)
    h.workers({W0: 1_500})  # 1,800 held on a 1,500 pool
    h.scheduler.reconfigure(h.scheduler.params.model_copy(update={"host_kv_blocks": 10_000}))
    tier = h.scheduler.host_tier
    assert tier is not None
    # Sized by the reload itself, not at the next tick: what the table holds past the GPU
    # pool (300 tokens) is already counted against the tier.
    assert tier.spare_tokens == 10_000 - 300


def test_a_reload_sizes_the_tier_over_the_reservations_it_leaves() -> None:
    h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9, host_kv_blocks=10_000,
             sessionless_kv="reserve")
    h.workers({W0: 2_000})
    h.acting_on("a", W0, 1_500)
    h.scheduler.sessionless_started("chat", W0, 800, h.now)  # 800 of the pool reserved
    h.scheduler.reconfigure(h.scheduler.params.model_copy(update={"sessionless_kv": "ignore"}))
    tier = h.scheduler.host_tier
    assert tier is not None
    at_reload = tier.spare_tokens
    h.tick()
    assert at_reload == tier.spare_tokens  # what the next tick makes of it, at once
