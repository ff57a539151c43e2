"""``stack --regime``: a local stack sized and timed exactly as ``bench live`` runs a regime.

The point is that any client (the OpenAI SDK, aiperf, one's own agent harness) can drive
the regime the benchmark measures, so nothing here decides a number of its own: the KV pool
per worker is the one ``bench live`` fixes for the regime's default workload and its default
sweep (``LiveConfig.plan``: the largest agent count at the largest pressure factor), and the
mocker flags are the ones ``bench live`` writes for it (``prepare_regime``). ``--blocks``
overrides the pool, as it does in ``bench live``.

What the stack cannot do for the client is scale the workload: in a regime with a token
scale below 1 one mocker token stands for several real ones, so prompts and ``max_tokens``
must be given in mocker tokens, and durations (tool calls) run on the regime's clock. The
start banner (:func:`banner`) says so with the numbers.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynamo_thunderagent.bench.live import LiveConfig, PreparedRegime, prepare_regime
from dynamo_thunderagent.bench.live_sweep import ArmSpec
from dynamo_thunderagent.bench.regimes import REGIME_NAMES, Regime, regime_named
from dynamo_thunderagent.stack.arms import arm_named
from dynamo_thunderagent.stack.config import StackConfig

# What the stack runs without --regime: the mocker's built-in timing, ten times faster than
# its model of the GPU, on a small pool. Not a benchmark regime; kept as it always was.
DEFAULT_BLOCKS = 256
DEFAULT_SPEEDUP_RATIO = 10.0


@dataclass(frozen=True)
class StackRegime:
    """A benchmark regime sized for a stack of ``workers`` workers (see the module docstring)."""

    regime: Regime
    prepared: PreparedRegime
    workers: int
    block_size: int
    blocks_given: bool  # --blocks overrode the benchmark's sizing

    @property
    def name(self) -> str:
        return self.regime.name

    @property
    def num_gpu_blocks(self) -> int:
        return self.prepared.sweep.num_gpu_blocks

    @property
    def speedup_ratio(self) -> float:
        return self.prepared.setup.speedup_ratio

    @property
    def token_scale(self) -> float:
        return self.prepared.setup.token_scale

    @property
    def time_scale(self) -> float:
        return self.prepared.setup.time_scale

    @property
    def mocker_args(self) -> list[str]:
        """The regime's own mocker flags (timing tables, host tier), after the pool's."""
        return list(self.prepared.mocker_args)

    @property
    def capacity_tokens(self) -> int:
        """KV tokens of the whole stack, in mocker tokens."""
        return self.workers * self.num_gpu_blocks * self.block_size

    @property
    def host_blocks(self) -> int:
        """Host KV tier blocks per worker (0 when the regime has no host tier)."""
        tier = self.regime.host_tier
        return 0 if tier is None else tier.host_blocks(self.num_gpu_blocks)

    def apply(self, config: StackConfig) -> None:
        """Set ``config``'s pool, clock and mocker flags to the regime's (in place), and its
        policy and router flags as ``bench live`` derives them (``PreparedRegime.policy_for``
        and ``router_args_for``): told of a host tier where its policy can say how large one
        is, and with its durations on the regime's clock unless ``--policy-clock wall``."""
        config.num_gpu_blocks = self.num_gpu_blocks
        config.speedup_ratio = self.speedup_ratio
        config.mocker_args = [*config.mocker_args, *self.mocker_args]
        arm = ArmSpec(config.arm, config.arm, config.policy)
        config.policy = self.prepared.policy_for(arm)
        # The caller's own flags last: where both set one, the caller's wins.
        config.router_args = [*self.prepared.router_args_for(arm), *config.router_args]

    def describe(self) -> dict[str, Any]:
        """The sizing as plain data (the JSON summary the stack prints once it is up)."""
        sweep = self.prepared.sweep
        return {
            "name": self.name,
            "workers": self.workers,
            "blocks_per_worker": self.num_gpu_blocks,
            "block_size": self.block_size,
            "capacity_tokens": self.capacity_tokens,
            "real_capacity_tokens": round(self.capacity_tokens / self.token_scale),
            "blocks_given": self.blocks_given,
            "token_scale": self.token_scale,
            "time_scale": self.time_scale,
            "speedup_ratio": self.speedup_ratio,
            "workload": self.prepared.setup.workload,
            "bench_live_agents": list(sweep.agents),
            "bench_live_pressures": [round(p, 2) for p in sweep.pressures],
            "host_blocks_per_worker": self.host_blocks,
            "mocker_args": self.mocker_args,
        }


def prepare_stack_regime(
    name: str, work_dir: Path, *, workers: int = 2, block_size: int = 16,
    blocks: int | None = None, policy_clock: str = "regime",
) -> StackRegime:  # fmt: skip
    """Size regime ``name`` as ``bench live`` does and write its mocker profile under
    ``work_dir``; ``blocks`` overrides the blocks per worker; ``policy_clock`` as
    ``bench live --policy-clock``.

    Raises ValueError naming the choices for an unknown regime, or what else is wrong.
    """
    regime = regime_named(name)
    if workers < 1 or block_size < 1 or (blocks is not None and blocks < 1):
        raise ValueError("workers, block size and blocks must be >= 1")
    config = LiveConfig(
        regimes=(name,), workers=workers, block_size=block_size, num_gpu_blocks=blocks,
        out_dir=work_dir, policy_clock=policy_clock,
    )  # fmt: skip
    prepared = prepare_regime(config, name, work_dir)
    return StackRegime(regime, prepared, workers, block_size, blocks_given=blocks is not None)


def _tokens(n: float) -> str:
    return f"{round(n):,}"


def _times(values: Sequence[float]) -> str:
    return ", ".join(f"{v:.2g}x" for v in values)


def mocker_flags(config: StackConfig) -> str:
    """The flags every worker of ``config`` gets, as one shell line."""
    return shlex.join([
        "--num-gpu-blocks-override", str(config.num_gpu_blocks),
        "--block-size", str(config.block_size),
        "--speedup-ratio", f"{config.speedup_ratio:g}",
        *config.mocker_args,
    ])  # fmt: skip


def banner(
    regime: StackRegime | None, config: StackConfig, url: str, model_path: Path
) -> str:
    """What the stack prints before it starts: regime, KV sizing, scales, what to send, URL."""
    pool = (
        f"{config.num_workers} workers x {config.num_gpu_blocks:,} blocks x "
        f"{config.block_size} tokens = "
        f"{_tokens(config.num_workers * config.num_gpu_blocks * config.block_size)} KV tokens"
    )
    lines: list[str] = []
    if regime is None:
        lines += [
            "regime: none (the mocker's built-in timing at --speedup-ratio "
            f"{config.speedup_ratio:g}; not a benchmark regime: --regime "
            f"{'|'.join(REGIME_NAMES)} runs one)",
            f"KV: {pool}",
        ]
    else:
        sweep = regime.prepared.sweep
        setup = regime.prepared.setup
        sizing = (
            "given by --blocks" if regime.blocks_given else
            f"sized as `bench live --regime {regime.name}` sizes it for its {setup.workload} "
            f"workload (mean peak context {_tokens(sweep.mean_peak_tokens)} tokens, "
            f"largest {_tokens(sweep.max_peak_tokens)})"
        )  # fmt: skip
        agents = ", ".join(str(n) for n in sweep.agents)
        lines += [
            f"regime: {regime.name}: {regime.regime.summary}",
            f"KV: {pool} ({_tokens(regime.capacity_tokens / regime.token_scale)} real tokens); "
            f"{sizing}",
            f"  bench live drives {agents} agents on this pool: {_times(sweep.pressures)} "
            "its capacity in peak contexts",
        ]
        if regime.host_blocks:
            told = (f"arm {config.arm} runs {config.policy}" if config.policy is not None
                    and arm_named(config.arm).configures_host_tier else
                    "a policy for our router should set it")
            lines.append(
                f"  host KV tier: {regime.host_blocks:,} blocks per worker; Dynamo's cards do "
                f"not publish it, so request_classifier.parameters.host_kv_blocks says it "
                f"({told})"
            )
        scale = regime.token_scale
        lines.append(
            f"scales: token {scale:g}, time {regime.time_scale:g} (mocker --speedup-ratio "
            f"{regime.speedup_ratio:g})"
        )
        if scale != 1:
            lines.append(
                f"  prompts are in mocker tokens: one stands for {1 / scale:g} real tokens, so "
                f"send {scale:g}x the real prompt and max_tokens (a real 40,000-token context "
                f"is {_tokens(40_000 * scale)} tokens here)"
            )
        if regime.time_scale != 1:
            lines.append(
                f"  durations are scaled by {regime.time_scale:g} (the mocker runs "
                f"{1 / regime.time_scale:g}x as fast as the GPU): a real 1 s tool call is "
                f"{regime.time_scale:g} s here"
            )
        clock = regime.prepared.policy_clock
        if clock != 1:
            lines.append(
                f"  so are the routers' durations (policy seconds, the Python port's timing "
                f"flags): a 60 s wait in a policy file is {60 * clock:g} s here "
                "(--policy-clock wall: as written)"
            )
            if config.policy is not None:
                lines.append(
                    f"  the router reads a copy of the policy on this clock, {config.policy}: "
                    "to reload a change, edit that copy and send the router SIGHUP (its pid "
                    "is in the summary); an edit of the original file is not seen"
                )
        overhead = setup.client_overhead_s
        if overhead:
            lines.append(
                f"  bench live adds the trace's client overhead, {overhead:g} s a call "
                f"({overhead * regime.time_scale:g} s here), to every tool gap"
            )
    lines += [
        f"mocker flags: {mocker_flags(config)}",
        f"send: model {config.model_name!r} at {url} (OpenAI API: chat/completions), "
        "header X-Dynamo-Session-ID: <agent id> on every turn of an agent; tokenizer "
        f"{model_path}",
        f"url: {url}",
    ]
    return "\n".join(f"stack: {line}" for line in lines)
