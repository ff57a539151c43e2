"""What a closed-loop run records: one :class:`TurnRecord` per request, and for a live run one
:class:`RunResult` holding them with the run's bookkeeping. The live driver (``bench/driver.py``)
and the simulator (``bench/sim/simulation.py``) both write turn records; ``bench/metrics.py``
and the simulator's figures read them.

Times are seconds since the run started (the live driver's monotonic clock, the simulator's
fake one). Fields only one side can know are optional: the live driver records failures and
cancellations, the simulator also when the arm released a turn, to which worker, and how many
of its prompt tokens the previous turn left reusable.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

RecordKind = Literal["turn", "final", "release"]


@dataclass
class TurnRecord:
    """One request of the run.

    ``kind``: ``turn`` (an LLM turn of a plan), ``final`` (the session-final request of an
    agent that finished every turn), ``release`` (a session-final request for an agent the
    run stopped early). ``error`` is ``"<ExceptionType>: <message>"`` or None;
    ``cancelled`` marks a request cut off at the end of the drain. ``released``, ``worker``
    and ``reusable_tokens`` are the simulator's (None in a live run). ``parent_session_id``:
    the session that spawned this one, for a subagent's requests (None otherwise).
    ``compaction``: the turn started a new history (it does not extend the previous prompt).
    ``joined``: the agent joined its program mid-way (a warm start): not a whole agent run.
    """

    kind: RecordKind
    agent: int
    session_id: str
    turn: int
    start: float
    end: float
    planned_prompt_tokens: int
    planned_output_tokens: int
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    error: str | None = None
    error_type: str | None = None
    cancelled: bool = False
    released: float | None = None
    worker: int | None = None
    reusable_tokens: int | None = None
    parent_session_id: str | None = None
    compaction: bool = False
    joined: bool = False

    @property
    def latency(self) -> float:
        return self.end - self.start

    @property
    def ok(self) -> bool:
        return self.error is None and not self.cancelled


@dataclass
class RunResult:
    """Everything a run recorded, plus the run's own bookkeeping."""

    records: list[TurnRecord]
    agents: int
    window_s: float
    drain_s: float
    elapsed_s: float
    agents_started: int
    agents_completed: int
    template_overhead: dict[str, int] = field(default_factory=dict)
    # Sessionless requests sent beside the agents (workload.Background); {} when none.
    background: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["records"] = [asdict(r) for r in self.records]
        return data
