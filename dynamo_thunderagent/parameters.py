"""The plugin types' parameters: names, defaults and bounds, each documented where it is
declared (the reference that docs/architecture.md's parameter table summarizes).

``config`` reads a router-policy file and validates each component's ``parameters`` mapping
against the model the catalog registers for its type: :class:`ThunderAgentParameters` for
the request classifier, :class:`ThunderAgentSelectorParameters` for the worker selector.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# Bounds on durations (seconds) and sizes: a value outside them is a typo, and some
# (a scheduler interval of a nanosecond) would burn a core while idle.
DAY = 86_400.0


class StrictModel(BaseModel):
    """Frozen, and unknown keys are an error (every level of a policy file)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ThunderAgentParameters(StrictModel):
    """ThunderAgent parameters, with Dynamo 1.6's names, defaults and rules.

    Fractions are in [0, 1]; durations are > 0; the ACTING weight and decay
    constant are finite and > 0; limits are > 0. On top of Dynamo's rules, types
    are strict (``"0.9"`` or ``true`` is not a number) and every duration and size
    has an upper bound (and the scheduler interval a lower one), so that a typo
    fails at load time instead of misbehaving later.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    pause_threshold: float = Field(0.95, ge=0.0, le=1.0)
    pause_target: float = Field(0.80, ge=0.0, le=1.0)
    resume_hysteresis: float = Field(0.10, ge=0.0, le=1.0)
    resume_timeout_seconds: float = Field(1800.0, gt=0.0, le=7 * DAY)
    session_retention_seconds: float = Field(1800.0, gt=0.0, le=7 * DAY)
    scheduler_interval_seconds: float = Field(5.0, ge=0.01, le=3600.0)
    acting_token_weight: float = Field(1.0, gt=0.0, le=1000.0)
    # A very large tau turns the decay off (2^(-idle/tau) stays 1), hence its wide bound.
    acting_decay_tau_seconds: float = Field(1.0, gt=0.0, le=1e12)
    buffer_per_program: int = Field(100, ge=0, le=10_000_000)
    max_tracked_requests: int = Field(10_000, gt=0, le=10_000_000)
    max_turns_per_session: int = Field(32, gt=0, le=100_000)
    """Turns one session may have tracked at once (in flight plus queued behind it), so
    that no single session can take every tracked-request slot. Not a Dynamo parameter;
    its default only bounds misbehaving clients (an agent sends one turn at a time)."""

    # ---- Extensions beyond Dynamo's parameter set --------------------------------
    # Each defaults to the parity behaviour; policies/thunderagent-extended.yaml turns
    # on the ones the benchmarks show to help (docs/benchmarks.md). Dynamo's builtin
    # does not know them, so they never appear in policies/thunderagent.yaml.
    resume_on_events: bool = False
    """Resume waiting programs as soon as room appears (completion, abort, session end,
    worker join or capacity growth), not only at the next tick."""
    pressure_decay: bool = False
    """Use the decayed usage (ACTING tokens weighted by 2^(-idle/tau)) on the pause side
    too, so that pausing and resuming agree on how full a worker/rank is."""
    placement: Literal["least_used", "least_busy"] = "least_used"
    """Where a program without a live worker goes, among the ranks with room for it: the
    least used (parity), or the one serving the fewest prompt tokens right now, so that
    turns spread over workers by current load, not by idle programs' charge."""
    concurrent_turns: Literal["queue", "alongside"] = "queue"
    """A turn that arrives while its session's current turn is running: it waits for that
    turn to finish (parity: a program's turns are sequential), or it runs alongside it at
    once, on the same worker/rank (where their shared prompt is cached), not tracked as a
    turn and not held back for room, as plain KV routing would run it (a parallel
    branch, such as an agent's parallel calls under one session id: it does not extend the
    running turn's prompt). A turn that arrives while the session's turn waits for room
    (its program is paused) waits with it and then goes alongside it."""
    pause_order: Literal["smallest", "longest_idle", "expected_return"] = "smallest"
    """Which ACTING programs pause first under pressure: the smallest (parity), the ones
    whose tool has run longest (least likely to return soon), or the ones expected back
    latest from their own history (their longest gap between turns so far, less the time
    their tool has run; programs with no history count as due now)."""
    pause_min_cache_loss: float | None = Field(None, ge=0.0, le=1.0)
    """Pause on a worker/rank over its threshold only while its engine is seen to evict:
    the share of the prefix tokens continuing turns expected cached there that the engine
    no longer had (cache_loss.py) is at least this. Until a continuing turn was seen there
    the rank pauses as without it. None (parity): our usage alone decides."""
    hold_max_cache_loss: float | None = Field(None, gt=0.0, le=1.0)
    """Hold a paused program's turn back for room only where holding it keeps a cache: a
    worker/rank whose programs hold more than its capacity and whose engine lost at least
    this share of the prefix tokens continuing turns expected cached there
    (cache_loss.py) is evicting whatever is held back. The waiting turns of its paused
    programs run there without room, as plain KV routing would, once they have waited as
    long as the stall their re-prefill causes (the cost model's price of a move; no wait
    until the engine's costs are measured), at the next resume pass (an event with
    ``resume_on_events``, else the tick); while every rank is like that, so do waiting
    turns with no live home (new programs held back), each on the rank with the most room
    left once this pass's earlier releases are booked.
    A release adds to the overfill, so where re-prefill is dear the pause rule gets that
    long to drain the rank first. Pauses themselves go on: where they bring a rank back
    under its capacity, holding pays again. None (parity): turns wait for room."""
    hold_excludes_let_in: bool = False
    """With ``hold_max_cache_loss``: a worker/rank counts as holding more than its
    capacity only without the programs it let in there without room (each until it pauses
    again, moves or leaves; what each adds, a shared prefix counted once). Otherwise the
    turns let in keep the rank over its capacity, so it stays "evicting anyway" and each
    pause is undone by the next release: with tool calls that return within a second,
    pauses and releases alternate and the rank never drains. A rank that keeps paused
    programs (``pause_min_resume_loss``) counts them all: no pause drains it. Off: every
    program on the rank counts."""
    pause_min_resume_loss: float | None = Field(None, gt=0.0, le=1.0)
    """Pause and hold back only where the engine would lose what a pause keeps: a
    worker/rank where paused programs, resumed there, came back with more than ``1 -
    this`` of the prompt they left cached (over at least 5 such turns, the recent ones
    weighing most), and where continuing turns lose less than this share too, keeps them
    anyway (a host KV tier, vLLM's CPU offload, LMCache, or more room than its capacity
    card says; cache_loss.py). There the pressure rule pauses nobody (marks set before
    lapse; idle programs still give way, and aging still makes room) and, once its
    programs hold more than its capacity, waiting turns run as for
    ``hold_max_cache_loss``. Continuing turns losing this share ends it, and the rank then
    needs five fresh resumes before it is judged again. The tier needs no
    ``host_kv_blocks`` to be found this way; that parameter still prices it from the
    first turn. None (parity): our usage alone decides."""
    shared_prefix_accounting: bool = False
    """Count KV blocks shared by several programs on a worker/rank (a common system
    prompt) once, from the leading block hashes of each request."""
    shared_prefix_max_tokens: int = Field(32_768, gt=0, le=16_777_216)
    """How many leading tokens of each prompt are compared for shared-prefix accounting (up
    to the last hash that ends within them: 32,256 of the default at 16-token blocks).
    Agents' shared system prompts and tool definitions run to tens of thousands of tokens
    (aiperf's agentic-code dataset: 32k); past the window each program is charged in full
    for blocks the engine holds once. Hashing costs the router about 0.35 ms for a prompt
    that fills the default window (0.1 ms for the first 4,096 tokens)."""
    shared_prefix_max_blocks: int = Field(256, gt=0, le=65_536)
    """At most this many hashes per program for shared-prefix accounting (its memory).
    They cover whole KV blocks, spans doubling every 32 hashes (one block each, then two,
    four, ...), so a shared prefix is found to within about 1/32 of its length: at
    16-token blocks the default window takes 192, and 256 reach 130,560 tokens at most."""
    resume_affinity: bool = False
    """Resume a paused program on the worker/rank that served it last when that rank
    has room (its KV blocks may still be resident), else where there is most room."""
    max_wait_seconds: float | None = Field(None, gt=0.0, le=7 * DAY)
    """Aging bound: a turn deferred this long goes to the head of the resume order and
    reserves room (nothing behind it resumes until it fits). None: off."""
    aging_makes_room: bool = False
    """With ``max_wait_seconds``: a turn that has waited that long has room made for it.
    Reserving room only keeps others from taking what frees up; on a rank below its pause
    threshold nothing frees up until a resident program ends, so the wait had no bound
    but ``resume_timeout_seconds``. Instead, at each tick, after the resume pass, the pause
    rule pauses ACTING programs of a still-waiting aged turn's rank (its home, else the
    rank with the most room) until it fits below the resume level, and marks REASONING ones
    if that is not enough; a second resume pass lets it in. A program whose turn has
    waited that long goes before one idle in a tool call. Only programs whose pause pays
    (the cost model) and that became active at least ``min_residency_seconds`` ago give
    way, in the pause rule's order (``pause_order``). The longest wait is then about
    ``max_wait_seconds`` plus a tick and the turns of the marked programs, at a price in
    throughput where programs are large (docs/benchmarks.md, "Bounded waits"). False
    (parity): aging only reserves."""
    sessionless_kv: Literal["ignore", "reserve"] = "ignore"
    """Requests without a session id (other tenants' chat, health checks) pass through with
    plain KV routing and are no program's. ``reserve``: while one runs, its prompt tokens
    are taken off the capacity of the worker/rank serving it, so admission, resume and the
    pause rule leave it that room (a rank filled by such traffic pauses its tool-waiting
    programs first, as for any pressure) instead of letting the engine evict programs'
    caches to find it. ``ignore`` (parity): programs are charged against the whole
    capacity, as if no other traffic shared the workers."""
    sessionless_kv_full_loss: float | None = Field(None, gt=0.0, le=1.0)
    """With ``sessionless_kv: reserve``, how much of that room a rank takes off follows
    what its engine is losing of the caches programs expect there (``cache_loss``: the
    recent share of a continuing turn's expected prefix the engine no longer had): that
    loss divided by this value, all of it from this loss up, none while the engine loses
    nothing. Where the engine keeps programs' caches anyway (it has room the usage figures
    do not see, as with many small programs sharing a prompt), a reservation only holds
    programs back. A rank with no continuing turn measured yet takes off all of it; the loss
    moves only with continuing turns, so a rank none of whose programs runs a turn keeps its
    last share. None: all of it, whatever the engine does."""
    min_residency_seconds: float = Field(0.0, ge=0.0, le=DAY)
    """A program resumed or admitted less than this long ago is not paused (churn guard)."""
    idle_horizon_factor: float | None = Field(None, gt=0.0, le=1000.0)
    """Idle programs give way first: an ACTIVE program with no turn in flight or waiting
    that has been idle longer than this many times the longest gap between turns it has
    shown (for a program that finished one turn only: the population's typical gap, or
    none when recent programs rarely came back) is *dormant*, and is paused before anyone
    waits for room or any other program is paused. Idle paused programs are then resumed
    when their next turn arrives, not ahead of it, and never hold anyone back. None: off
    (parity: an idle program stays charged until ``session_retention_seconds``)."""
    idle_horizon_min_seconds: float = Field(0.5, ge=0.0, le=DAY)
    """Lower bound of every idle horizon (used while there is no evidence at all)."""
    price_moves: bool = False
    """A move is a decision with a price: moving a paused program off the worker/rank
    that holds its cache costs a re-prefill of its context there (measured from the
    engine's timings), which holds up every turn running on that rank. Its turn waits
    for room at home until it has waited as long as that stall (re-prefill time x turns
    running per rank), then moves: waiting longer could cost more than the move, moving
    sooner pays for room that home may free in time. A program whose pause would not
    pay resumes at home. Until the engine's costs are measured, moves are free (parity)."""
    leave_for_empty_rank: bool = False
    """A program whose next turn arrives on a worker/rank it shares with other programs
    runs that turn on a live rank that holds no program at all (none assigned, nothing
    reserved there), when one exists, the program fits it and no program is paused (an
    empty rank is for paused programs first): its re-prefill there holds up nobody, and it
    and the programs it leaves decode in smaller batches and no longer crowd one KV pool.
    The case of a batch's tail, where the last agents share one rank while another has
    emptied. Off: a continuing turn always runs where its program's cache is."""
    pause_rule: Literal["parity", "upstream"] = "parity"
    """Which pause rule relieves pressure (dynamo_thunderagent.pressure): the paper's
    (parity), or the upstream ThunderAgent proxy's, which marks every REASONING program
    of a rank once no ACTING one is left (kept for comparison; the simulator's upstream
    arm uses it)."""
    acting_hold_factor: float | None = Field(None, gt=0.0, le=100.0)
    """Tool time is information: an ACTING program whose own gaps between turns are short
    keeps its charge undecayed (``acting_token_weight`` x its tokens) in the decayed usage
    (the resume side; the pause side too with ``pressure_decay``) for a *hold* of this
    many times the time the engine takes to prefill a worker/rank's whole KV pool
    (measured: prefill time per token x the mean rank capacity). Evicting its KV costs a
    re-prefill when it returns; the room its KV holds is worth about that much engine
    time over the hold, so a program expected back within it (twice its smoothed gap
    within the hold) and never away longer than it (its longest gap within the hold too)
    keeps its room, and the others give room back at once, as without it: one long wait
    (a build, a person, its own subagents) says the next may be long as well, which a
    smoothed gap soon forgets. Where re-prefill is cheap the hold is short and nothing
    changes. The hold is priced at a full re-prefill even with ``host_kv_blocks`` (where
    the tier keeps a paused program's KV, nobody is paused and the hold changes little).
    None: off (parity); 0 hold until the engine's prefill cost and a capacity are known."""
    acting_yield_factor: float | None = Field(None, gt=0.0, le=100.0)
    """Do no harm where holding room costs more than a re-prefill: at its tool boundary, a
    program expected back later than this many times the time the engine takes to prefill
    a worker/rank's whole KV pool (twice its smoothed gap between turns past it, the gaps'
    geometric mean, so one long tool among short ones does not count as a habit; the pool
    priced as for ``acting_hold_factor``) *yields* its room: while its tool runs it is
    charged nothing (only ``buffer_per_program``), is never paused, and its next turn is
    admitted where it ran, as plain KV routing would (the engine may evict its KV
    meanwhile). Holding a program's room over its gap costs the turns that room could run
    meanwhile, its share of the running batch (its tokens over the pool's); it saves one
    re-prefill of its context, which holds up that whole batch: the first outgrows the
    second once the gap passes the pool's re-prefill time, whatever the program's size
    and the batch. Programs with no gap history
    yet, programs whose next request is already queued, and every program until the
    engine's prefill cost and a capacity are known, are charged as without it; a program
    marked for pause that yields is not paused, and no idle program that yielded is. A
    reload that turns it off leaves programs that already yielded uncharged until their
    next turn. None: off (parity)."""
    pause_min_recompute_ratio: float | None = Field(None, ge=0.0, le=1000.0)
    """Pause only when pausing pays: a program is paused (or held back for lack of room)
    only if the re-prefill it avoids, times the turns running on a worker/rank (a
    re-prefill holds them all up), costs at least this fraction of a turn's decode time,
    both measured on agent turns (the prefill from the engine's timing, the decode by the
    router's clock). Where recompute is cheap, admission then
    behaves like plain KV routing. None: always (parity)."""

    host_kv_blocks: int = Field(0, ge=0, le=1 << 32)
    """A host-memory KV tier behind each worker/rank, in the rank's KV blocks (0: none):
    what the engine's offload holds (vLLM's native CPU offload, Dynamo's KV block manager,
    LMCache; the mocker's ``--num-host-blocks``). Evicted KV that the tier keeps comes back
    by a copy, not a re-prefill, and the copy holds up only its own turn, so a pause saves
    nothing while the tier has room for what the fleet's programs hold beyond the GPU
    pools: programs then stay on their worker/rank (where their copy is) and nobody waits.
    Past the tier's room, only the tokens it cannot keep count as recompute a pause
    avoids. Dynamo 1.6's capacity cards do not publish the tier, so it is configured."""

    @field_validator(
        "resume_timeout_seconds",
        "session_retention_seconds",
        "scheduler_interval_seconds",
        "acting_token_weight",
        "acting_decay_tau_seconds",
        "idle_horizon_factor",
        "idle_horizon_min_seconds",
    )
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value

    @model_validator(mode="after")
    def _ordered(self) -> ThunderAgentParameters:
        if self.pause_target > self.pause_threshold:
            raise ValueError(
                f"pause_target ({self.pause_target}) must be <= pause_threshold "
                f"({self.pause_threshold})"
            )
        if self.max_wait_seconds is not None and not (
            math.isfinite(self.max_wait_seconds)
            and self.max_wait_seconds < self.resume_timeout_seconds
        ):
            raise ValueError(
                f"max_wait_seconds ({self.max_wait_seconds}) must be finite and below "
                f"resume_timeout_seconds ({self.resume_timeout_seconds})"
            )
        if self.aging_makes_room and self.max_wait_seconds is None:
            raise ValueError("aging_makes_room needs max_wait_seconds (the wait after which "
                             "room is made); set it, or turn aging_makes_room off")
        if self.sessionless_kv_full_loss is not None and self.sessionless_kv != "reserve":
            raise ValueError("sessionless_kv_full_loss scales the room reserved for requests "
                             "without a session id, which sessionless_kv: "
                             f"{self.sessionless_kv} does not reserve; set sessionless_kv: "
                             "reserve, or remove sessionless_kv_full_loss")
        if self.aging_makes_room and self.pause_rule == "upstream":
            raise ValueError("aging_makes_room works with pause_rule parity only (the "
                             "upstream rule has no aging); turn one of them off")
        if self.resume_hysteresis > self.pause_threshold:
            raise ValueError(
                f"resume_hysteresis ({self.resume_hysteresis}) must be <= pause_threshold "
                f"({self.pause_threshold})"
            )
        return self


class EmptyParameters(StrictModel):
    """For plugin types that take no parameters."""


class ThunderAgentSelectorParameters(StrictModel):
    """The ``thunderagent`` worker selector's parameters (an extension: Dynamo's builtin
    selector takes none, so they never appear in policies/thunderagent.yaml)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    preferred_load_slack: float | None = Field(None, ge=0.0, le=100.0)
    """Route a turn away from the classifier's preferred worker/rank (where its program's
    cache is) when the KV router predicts that rank costs more than ``1 +`` this times
    the cheapest candidate for this request. The prediction (the KV router's potential
    loads: prefill tokens it would still compute there, its own uncached ones included,
    plus decode blocks) prices the re-prefill a move causes, so a program moves only
    where its home is that much busier than another rank with its re-prefill counted,
    as soft session affinity does in plain KV routing. It costs the router one load
    prediction on every turn with a preferred rank. None (parity): a live preferred
    worker/rank is always honoured."""
