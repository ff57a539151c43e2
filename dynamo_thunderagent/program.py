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
import functools
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


# Hashes per level of a spanning prefix layout: the first level's hashes cover one KV block
# each, every next level's twice as many blocks as the last. A shared prefix of any length is
# then resolved to within about 1/32 of it (one block below 32 blocks), at a bounded count.
PREFIX_LEVEL_HASHES = 32


def _span(block_tokens: int, level_hashes: int, index: int) -> int:
    """Tokens under hash ``index`` of a layout (``level_hashes`` 0: one block each)."""
    return block_tokens << (index // level_hashes) if level_hashes > 0 else block_tokens


@dataclass(frozen=True, slots=True)
class PrefixBlocks:
    """Chained hashes of a prompt's leading KV blocks, ``block_tokens`` tokens each.

    Only shared-prefix accounting reads them: on a worker/rank, blocks that several
    programs hold (a common system prompt) are counted once. Equal hashes mean equal
    prefixes; the values themselves mean nothing. ``level_hashes`` 0: each hash covers
    one block; otherwise the layout of :func:`prefix_ends`, spans doubling every
    ``level_hashes`` hashes.
    """

    hashes: tuple[int, ...] = ()
    block_tokens: int = 0
    level_hashes: int = 0

    def limited(self, max_blocks: int) -> PrefixBlocks:
        """The first ``max_blocks`` hashes (or none at all without a block size)."""
        if self.block_tokens <= 0:
            return NO_PREFIX
        if len(self.hashes) <= max_blocks:
            return self
        return PrefixBlocks(self.hashes[:max_blocks], self.block_tokens, self.level_hashes)

    def groups(self) -> list[tuple[int, tuple[int, ...]]]:
        """``(tokens each hash covers, those hashes)`` for each run of equal spans."""
        if not self.hashes:
            return []
        step = self.level_hashes if self.level_hashes > 0 else len(self.hashes)
        return [(self.span_of(start), self.hashes[start:start + step])
                for start in range(0, len(self.hashes), step)]

    @property
    def tokens(self) -> int:
        """Prompt tokens under the hashes."""
        return self.tokens_of(len(self.hashes))

    def span_of(self, index: int) -> int:
        """Tokens under hash ``index``."""
        return _span(self.block_tokens, self.level_hashes, index)

    def tokens_of(self, count: int) -> int:
        """Prompt tokens under the first ``count`` hashes."""
        step = self.level_hashes
        if step <= 0:
            return self.block_tokens * count
        levels, rest = divmod(count, step)
        # Whole levels hold step * (1 + 2 + ... + 2^(levels-1)) blocks.
        return self.block_tokens * (step * ((1 << levels) - 1) + rest * (1 << levels))


NO_PREFIX = PrefixBlocks()


def prefix_levels(max_tokens: int) -> int:
    """The ``level_hashes`` of the layout :func:`prefix_ends` makes for ``max_tokens``."""
    return PREFIX_LEVEL_HASHES if max_tokens > 0 else 0


@functools.lru_cache(maxsize=32)
def prefix_ends(block_tokens: int, max_hashes: int, max_tokens: int) -> tuple[int, ...]:
    """Where each leading-prefix hash ends, in tokens from the prompt's start.

    ``max_tokens`` 0: ``max_hashes`` hashes of one KV block each. Otherwise hashes over
    whole blocks, spans doubling every :data:`PREFIX_LEVEL_HASHES` hashes (one block
    each for the first, then two, four, ...), as long as they end within ``max_tokens``
    (the first always counts) and number at most ``max_hashes``: however long a shared
    system prompt, what a program keeps stays bounded, and a shared prefix is still
    found to within about 1/32 of its length. Empty: nothing to hash (no block size, or
    no hashes wanted).
    """
    if block_tokens <= 0 or max_hashes <= 0:
        return ()
    levels = prefix_levels(max_tokens)
    ends: list[int] = []
    end = 0
    while len(ends) < max_hashes:
        end += _span(block_tokens, levels, len(ends))
        if 0 < max_tokens < end and ends:
            break
        ends.append(end)
    return tuple(ends)


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
    # Those gaps smoothed, a geometric mean (0: not back yet; idle.smoothed_gap): how soon
    # it is expected back from a tool.
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
    # The prompt it left cached when it was last paused, until its next turn is released
    # (0: none, or it moved since); see cache_loss.keeps_paused.
    paused_prompt_tokens: int = 0

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
    # a move made at release, a reset tool clock or a cleared expectation of its cache
    # behind (a pause or a lost worker while the turn is out rewrites the expectation).
    prior: ProgramSnapshot | None = None
    # Prefix tokens the engine should still hold for this turn (its program's last prompt,
    # when it runs where that ran and was not paused since; 0: none); see cache_loss.py.
    expected_cached: int = 0
    # For the turn of a program paused since its last turn, run where it was paused: the
    # prompt it left there, in whole blocks (0: none); see cache_loss.keeps_paused.
    expected_after_pause: int = 0


@dataclass(frozen=True, slots=True)
class ProgramSnapshot:
    tokens: int
    worker: WorkerKey | None
    acting_since: float | None
    prefix: PrefixBlocks
    # What it expected cached on ``worker`` (Program's fields of the same names): a move
    # or a release clears them, and an abort that sends it back restores them.
    resident_prompt_tokens: int = 0
    paused_prompt_tokens: int = 0
