"""The scheduler's vocabulary: programs, their phases and lifecycles, workers.

A *program* is one agent run, identified by its session id. It alternates
between REASONING (a turn is on the GPU) and ACTING (the agent runs a tool and
its KV cache sits idle). Independently of the phase it is ACTIVE (counted
against a worker's capacity, its turns are admitted) or PAUSED (not counted,
its next turn waits). Pausing is logical: nothing running is preempted; a
REASONING program that must pause is *marked* and pauses at its next tool
boundary.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple


class WorkerKey(NamedTuple):
    """A KV pool: one data-parallel rank of one worker instance.

    Capacity, usage and placement are all per rank, because each rank has its
    own KV cache; the pair sorts naturally, which gives every tie-break.
    """

    worker_id: int
    dp_rank: int = 0

    def __str__(self) -> str:
        return f"{self.worker_id}/{self.dp_rank}"


class Phase(enum.Enum):
    REASONING = "reasoning"
    ACTING = "acting"


class Lifecycle(enum.Enum):
    ACTIVE = "active"
    PAUSED = "paused"


class RequestState(enum.Enum):
    QUEUED = "queued"  # behind another turn of the same session
    DEFERRED = "deferred"  # its program is paused; waits for resume
    RELEASED = "released"  # admitted; routed or about to be


@dataclass(frozen=True, slots=True)
class PrefixBlocks:
    """Hashes of a prompt's leading KV blocks, ``block_tokens`` tokens each.

    Only shared-prefix accounting reads them: on a worker/rank, blocks that several
    programs hold (a common system prompt) are counted once. Equal hashes mean equal
    prefixes; the values themselves mean nothing.
    """

    hashes: tuple[int, ...] = ()
    block_tokens: int = 0

    def limited(self, max_blocks: int) -> PrefixBlocks:
        """The first ``max_blocks`` hashes (or none at all without a block size)."""
        if self.block_tokens <= 0:
            return NO_PREFIX
        if len(self.hashes) <= max_blocks:
            return self
        return PrefixBlocks(self.hashes[:max_blocks], self.block_tokens)


NO_PREFIX = PrefixBlocks()


@dataclass(slots=True)
class Program:
    """One agent run. Fields that enter usage change only through ProgramTable."""

    session_id: str
    seq: int  # creation order: the stable tie-break between equal programs
    phase: Phase = Phase.ACTING
    lifecycle: Lifecycle = Lifecycle.ACTIVE
    worker: WorkerKey | None = None
    tokens: int = 0
    # The leading KV blocks of the program's last prompt (shared-prefix accounting only).
    prefix: PrefixBlocks = NO_PREFIX
    steps: int = 0
    marked_for_pause: bool = False
    # The mark was made for turns that waited max_wait_seconds (aging_makes_room): it
    # stands only while such a turn still waits.
    marked_for_aged: bool = False
    acting_since: float | None = None
    deferred_since: float | None = None
    last_active: float = 0.0
    # The longest time between the end of one of its turns and the arrival of the next
    # (0: it has not come back after a turn yet); see dynamo_thunderagent.idle.
    max_gap: float = 0.0
    # Those gaps smoothed (0: not back yet): how soon it is expected back from a tool.
    gap_ewma: float = 0.0
    # Gave its room back at its tool boundary (acting_yield_factor): charged nothing
    # while ACTING. Set when it turns ACTING, cleared when its next turn starts.
    yielded: bool = False
    gone_counted: bool = False  # its first idle was counted as "did not come back"
    # The turn on the GPU or waiting for admission (at most one per session),
    # then the session's later turns in arrival order.
    current: str | None = None
    waiting: deque[str] = field(default_factory=deque)
    final_request: str | None = None  # a session-final request held behind ``current``
    active_since: float | None = None  # when it last became ACTIVE on a worker/rank
    pauses: int = 0
    resumes: int = 0
    moves: int = 0
    # The prompt of its last completed turn, expected cached on ``worker`` while it has been
    # neither paused nor moved since (0: nothing expected); see cache_loss.py.
    resident_prompt_tokens: int = 0

    @property
    def is_new(self) -> bool:
        """Never finished a turn: nothing of it is cached anywhere yet."""
        return self.steps == 0

    def expected_back_within(self, seconds: float) -> bool | None:
        """Whether it is expected back from its tool within ``seconds``: twice its smoothed
        gap between turns (for margin) fits. None until it has come back once. The hold
        (``acting_hold_factor``) and the yield (``acting_yield_factor``) both ask this."""
        if self.gap_ewma == 0.0:
            return None
        return 2.0 * self.gap_ewma <= seconds

    @property
    def busy(self) -> bool:
        return self.current is not None or bool(self.waiting) or self.final_request is not None


@dataclass(slots=True)
class TrackedRequest:
    request_id: str
    session_id: str
    input_tokens: int
    state: RequestState
    created_program: bool  # this request created its program (rolled back if it never runs)
    prefix: PrefixBlocks = NO_PREFIX
    # When it was released (the shell ends one that nobody forwards; see
    # RequestClassifier.admitted).
    released_at: float | None = None
    # The program as it was before this turn started, restored if the turn aborts: an
    # aborted turn put nothing new in the cache, so it must not leave its prompt size,
    # a move made at release or a reset tool clock behind.
    prior: ProgramSnapshot | None = None
    # Prefix tokens the engine should still hold for this turn (its program's last prompt,
    # when it runs where that ran and was not paused since; 0: none); see cache_loss.py.
    expected_cached: int = 0


@dataclass(frozen=True, slots=True)
class ProgramSnapshot:
    tokens: int
    worker: WorkerKey | None
    acting_since: float | None
    prefix: PrefixBlocks
