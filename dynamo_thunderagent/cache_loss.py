"""Does the engine evict at all? What it lost of the cache a program was expected to hold.

Our usage figures say when a worker/rank *should* be full; only the engine knows whether it
evicted. The signal is in every continuing turn: a program that ran its last turn on a
worker/rank and was neither paused nor moved since expects that turn's prompt to still be
cached there, and the engine reports how much of the new prompt it found cached. What is
missing was evicted (or never kept). This meter keeps, per worker/rank, an exponentially
decayed sum of the expected and of the missing tokens, so the loss ratio follows the recent
turns: near 0 where the engine keeps what our usage counts, rising as it evicts.

Only what the engine must have kept counts: the previous *prompt*, rounded down to whole
blocks (engines cache full blocks; generated tokens are not always reusable, e.g. the
mocker's), and only when the new prompt is at least as long (a compaction starts a new
prefix and expects nothing). Pure: callers pass every figure in.

The same meter, fed with the turns of paused programs resumed on the rank they were paused
on, says whether pausing saves anything there (:func:`keeps_paused`): an engine that gives
a paused program its prompt back (a host KV tier behind the GPU pool, or more room than
its capacity card says) would have kept it without the pause.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dynamo_thunderagent.program import WorkerKey

# Resumes a rank must have shown before :func:`keeps_paused` trusts what they found.
KEEPS_PAUSED_MIN_RESUMES = 5


@dataclass
class _Sums:
    expected: float = 0.0
    lost: float = 0.0
    turns: int = 0


@dataclass
class CacheLossMeter:
    """Decayed per-rank sums of the prefix tokens continuing turns expected and lost.

    ``alpha``: the weight of the newest turn (each older turn's weight decays by
    ``1 - alpha`` per turn on the same rank).
    """

    alpha: float = 0.1
    _ranks: dict[WorkerKey, _Sums] = field(default_factory=dict)

    def observe(self, worker: WorkerKey, expected_tokens: int, cached_tokens: int) -> None:
        """One continuing turn on ``worker``: ``expected_tokens`` should have been cached,
        the engine reported ``cached_tokens`` of the new prompt cached."""
        if expected_tokens <= 0:
            return
        lost = max(0, expected_tokens - max(0, cached_tokens))
        sums = self._ranks.setdefault(worker, _Sums())
        keep = 1.0 - self.alpha
        sums.expected = keep * sums.expected + expected_tokens
        sums.lost = keep * sums.lost + lost
        sums.turns += 1

    def loss_ratio(self, worker: WorkerKey) -> float | None:
        """Recent share of expected prefix tokens the engine no longer had (None: no
        continuing turn observed on ``worker`` yet)."""
        sums = self._ranks.get(worker)
        if sums is None or sums.expected <= 0:
            return None
        return sums.lost / sums.expected

    def turns(self, worker: WorkerKey) -> int:
        """Turns observed on ``worker`` so far."""
        sums = self._ranks.get(worker)
        return 0 if sums is None else sums.turns

    def forget(self, worker: WorkerKey) -> None:
        """``worker`` left: its engine's cache left with it."""
        self._ranks.pop(worker, None)

    def snapshot(self, key: str = "cache_loss_ratio") -> dict[str, dict[str, float | int | None]]:
        """Per rank: the loss ratio (under ``key``) and the turns observed."""
        return {str(worker): {key: self.loss_ratio(worker), "turns": sums.turns}
                for worker, sums in sorted(self._ranks.items())}


def expected_cached(previous_prompt_tokens: int, prompt_tokens: int, block_size: int) -> int:
    """Tokens of a continuing turn's prompt the engine should still hold: the previous
    prompt in whole blocks, or 0 where the new prompt does not extend it (compaction)."""
    if previous_prompt_tokens <= 0 or prompt_tokens < previous_prompt_tokens or block_size <= 0:
        return 0
    return (previous_prompt_tokens // block_size) * block_size


def keeps_paused(resumed: CacheLossMeter, continuing: CacheLossMeter, worker: WorkerKey,
                 max_loss: float, min_resumes: int) -> bool:
    """Whether ``worker``'s engine keeps what a pause there would save
    (``pause_min_resume_loss``): paused programs resumed on it lost less than ``max_loss``
    of the prompt they left cached (over at least ``min_resumes`` such turns, the recent
    ones weighing most), and continuing turns there lose less than that too, so the room
    it holds is not running out now. Either meter's loss rising ends it."""
    if resumed.turns(worker) < min_resumes:
        return False
    paused_loss = resumed.loss_ratio(worker)
    running_loss = continuing.loss_ratio(worker)
    return (paused_loss is not None and paused_loss < max_loss
            and (running_loss is None or running_loss < max_loss))
