"""The simulator's ``dynamo-python`` arm: Dynamo 1.6.1's Python ThunderAgent port, its rules.

The ``upstream`` arm runs the upstream proxy's pause rule inside our scheduler, and ties or
beats ours on shapes where the port that ships with Dynamo (``python -m
dynamo.thunderagent_router``, live's ``dynamo-python`` arm) loses to ours live. This arm
models the port's own rules instead, as its installed code reads (our summary, in our words):

* **Levels.** Usage per worker is the tokens of its ACTIVE programs (REASONING and ACTING
  alike, no decay; a turn in flight counts its prompt and what it has generated so far) plus
  100 per program, against the GPU pool's tokens. A tick (every 5 s)
  first resumes, then pauses: above 0.95 of the pool it pauses the smallest ACTING programs
  until usage is at most 0.80; if that is not enough it marks every REASONING program on the
  worker, and each marked one pauses when its turn ends.
* **Admission.** A new program waits (paused) while any program is paused, and otherwise takes
  the least used worker that has room for its prompt up to the *whole* pool; with none, it
  waits. A program that is placed and not paused is never held: its turns go to its worker
  whatever the usage.
* **Resume only on the tick.** Best-fit decreasing into the room each worker has below 0.85 of
  its pool; the worker is picked afresh, so a resumed program may move. A wait is cut off
  (forced resume on the least used worker) after 1,800 s, checked on the tick here.
* **Placement.** Every turn is pinned to the program's worker: the one admission chose, or
  the one its last resume chose. (The port also sends a turn unpinned when its program lost
  its worker without pausing, which takes a worker leaving; the simulated ones never do.)

Not modelled: the engine priority offsets it sends (soft demotion between 0.80 and 0.95,
a boost after a wait), which the simulated engine has no queue order for; the host tier the
port adds to the pool when the engine reports native offloading; and its counter of marked
programs. A turn's generated tokens are read as the simulated engine last applied them (it
advances decode in jumps between events), the port's as its stream last reported them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from dynamo_thunderagent.bench.sim.contract import Arm
from dynamo_thunderagent.bench.sim.engine import SimRequest


@dataclass(frozen=True)
class PortParameters:
    """The port's defaults (``ThunderAgentConfig``), as live's ``dynamo-python`` arm runs it."""

    pause_threshold: float = 0.95
    pause_target: float = 0.80
    resume_hysteresis: float = 0.10
    resume_timeout_seconds: float = 1800.0
    scheduler_interval_seconds: float = 5.0
    acting_decay_tau_seconds: float = 1.0  # only the forced resume's least-used pick decays
    buffer_per_program: int = 100


class _Lifecycle(enum.Enum):
    ACTIVE = "active"
    PAUSED = "paused"


@dataclass
class _Program:
    session_id: str
    tokens: int = 0
    reasoning: bool = True  # else ACTING (between turns)
    lifecycle: _Lifecycle = _Lifecycle.ACTIVE
    worker: int | None = None
    steps: int = 0
    marked: bool = False
    acting_since: float = 0.0
    pending: str | None = None  # the turn waiting for a resume
    current: str | None = None  # the turn sent and not finished
    pending_since: float = 0.0


@dataclass
class _Usage:
    capacity: int
    used: int = 0
    programs: list[_Program] = field(default_factory=list)

    def add(self, program: _Program, charge: int) -> None:
        self.programs.append(program)
        self.used += charge


class DynamoPythonArm(Arm):
    """Dynamo's Python ThunderAgent port (see the module docstring)."""

    name = "dynamo-python"

    def __init__(self, params: PortParameters | None = None) -> None:
        super().__init__()
        self.params = params or PortParameters()
        self.tick_interval = self.params.scheduler_interval_seconds
        self.programs: dict[str, _Program] = {}
        self.paused: dict[str, None] = {}  # insertion order, as the port keeps it
        self._counts = {"pauses": 0, "resumes": 0, "forced_resumes": 0}

    # ---- the hooks ------------------------------------------------------------------
    def submit(self, request: SimRequest) -> None:
        program = self.programs.get(request.session_id)
        if program is None:
            program = self.programs[request.session_id] = _Program(request.session_id)
        program.steps += 1
        if request.prompt_tokens > 0:
            program.tokens = request.prompt_tokens
        program.reasoning = True
        if program.lifecycle is _Lifecycle.PAUSED:
            self._wait(program, request.request_id)
            return
        if program.worker is not None:
            self._send(program, request.request_id, program.worker)
            return
        # A new program: an ACTIVE one keeps its worker, a PAUSED one is given one by a tick.
        worker = self._admission_worker(self._usage(), self._charge(program))
        if worker is not None:
            program.worker = worker
            self._send(program, request.request_id, worker)
        else:  # every worker full, or programs already waiting: queue until a tick
            program.lifecycle = _Lifecycle.PAUSED
            self.paused[program.session_id] = None
            self._counts["pauses"] += 1
            self._wait(program, request.request_id)

    def completed(self, request: SimRequest) -> None:
        program = self.programs.get(request.session_id)
        if program is None:
            return
        program.tokens = request.context_tokens
        program.reasoning = False
        program.current = None
        program.acting_since = self.host.now()
        if program.marked:
            program.marked = False
            self._pause(program)

    def session_final(self, session_id: str) -> None:
        self.paused.pop(session_id, None)
        self.programs.pop(session_id, None)

    def tick(self) -> None:
        usage = self._usage()
        self._force_resume_overdue(usage)
        self._resume(usage)
        self._pause_until_safe(usage)

    def counters(self) -> dict[str, int]:
        return dict(self._counts)

    def problems(self, drained: bool) -> list[str]:
        found = [f"turn {p.pending} waits but its program {p.session_id} is not paused"
                 for p in self.programs.values()
                 if p.pending is not None and p.lifecycle is not _Lifecycle.PAUSED]
        found += [f"{s} is in the paused set but not paused" for s in self.paused
                  if s not in self.programs or self.programs[s].lifecycle is not _Lifecycle.PAUSED]
        if drained and self.programs:
            found.append(f"{len(self.programs)} programs retained after every session-final: "
                         f"{sorted(self.programs)[:5]}")
        return found

    # ---- the rules --------------------------------------------------------------------
    def _charge(self, program: _Program) -> int:
        """What a program counts against its worker: its tokens, the turn in flight's
        generated ones so far, and the per-program buffer."""
        streamed = self.host.request(program.current).generated if program.current else 0
        return program.tokens + streamed + self.params.buffer_per_program

    def _send(self, program: _Program, request_id: str, worker: int) -> None:
        program.current = request_id
        self.host.dispatch(request_id, worker)

    def _usage(self) -> dict[int, _Usage]:
        """Each worker's ACTIVE, placed programs and their tokens plus the per-program buffer."""
        cluster = self.host.cluster
        usage = {w.index: _Usage(w.config.total_blocks * w.config.block_size)
                 for w in cluster.workers}
        for program in self.programs.values():
            if program.lifecycle is _Lifecycle.ACTIVE and program.worker in usage:
                usage[program.worker].add(program, self._charge(program))
        return usage

    def _admission_worker(self, usage: dict[int, _Usage], required: int) -> int | None:
        """For a new program: the least used worker with room for ``required`` tokens up to
        its whole pool; None if none has, or if any program is paused (new ones queue behind
        it)."""
        if self.paused:
            return None
        fits = [(e.used, w) for w, e in usage.items() if e.capacity - e.used >= required]
        return min(fits)[1] if fits else None

    def _wait(self, program: _Program, request_id: str) -> None:
        program.pending = request_id
        program.pending_since = self.host.now()

    def _pause(self, program: _Program) -> bool:
        """Pause an ACTIVE, ACTING program; its worker is given up."""
        if program.lifecycle is _Lifecycle.PAUSED or program.reasoning:
            return False
        program.lifecycle = _Lifecycle.PAUSED
        program.worker = None
        self.paused[program.session_id] = None
        self._counts["pauses"] += 1
        return True

    def _resume_on(self, program: _Program, worker: int, usage: dict[int, _Usage]) -> None:
        program.lifecycle = _Lifecycle.ACTIVE
        program.worker = worker
        self.paused.pop(program.session_id, None)
        self._counts["resumes"] += 1
        usage[worker].add(program, self._charge(program))
        if program.pending is not None:
            request_id, program.pending = program.pending, None
            self._send(program, request_id, worker)

    def _force_resume_overdue(self, usage: dict[int, _Usage]) -> None:
        now = self.host.now()
        for session_id in list(self.paused):
            program = self.programs[session_id]
            if (program.pending is not None
                    and now - program.pending_since >= self.params.resume_timeout_seconds):
                self._resume_on(program, self._least_used(usage, now), usage)
                self._counts["forced_resumes"] += 1

    def _least_used(self, usage: dict[int, _Usage], now: float) -> int:
        """Most room left, ACTING programs' tokens halving every ``acting_decay_tau``."""
        tau = max(self.params.acting_decay_tau_seconds, 1e-3)

        def decayed(p: _Program) -> int:
            if p.reasoning:  # in a turn: no decay, its streamed tokens counted
                return self._charge(p)
            idle = max(0.0, now - p.acting_since)
            # the port rounds each program's decayed tokens down
            return int(p.tokens * 2.0 ** (-idle / tau)) + self.params.buffer_per_program

        return max(usage, key=lambda w: (usage[w].capacity - sum(
            decayed(p) for p in usage[w].programs), -w))

    def _resume(self, usage: dict[int, _Usage]) -> None:
        """Best-fit decreasing: the programs that fit the room below the resume ceiling in
        all, largest first, each into the worker with the most room left."""
        waiting = [self.programs[s] for s in self.paused]
        if not waiting:
            return
        # Programs that ran a turn and wait for their next first, then between-turn
        # (ACTING) ones, then programs that never ran; smallest first within each group.
        waiting.sort(key=lambda p: (1 if p.steps <= 1 else 0 if p.reasoning else 2, p.tokens))
        buffer = self.params.buffer_per_program  # a worker with no more room than this is full
        ceiling = max(0.0, self.params.pause_threshold - self.params.resume_hysteresis)
        room = [(w, int(e.capacity * ceiling) - e.used) for w, e in usage.items()]
        room = sorted(((w, r) for w, r in room if r > buffer), key=lambda x: -x[1])
        total, taken = sum(r for _, r in room), 0
        chosen: list[_Program] = []
        for program in waiting:
            charge = self._charge(program)
            if taken + charge <= total:
                chosen.append(program)
                taken += charge
        if not chosen:
            return
        chosen.sort(key=lambda p: -p.tokens)
        smallest = min(self._charge(p) for p in chosen)
        for program in chosen:
            if not room or smallest > room[0][1]:
                break
            worker, left = room[0]
            required = self._charge(program)
            if required > left:
                continue
            self._resume_on(program, worker, usage)
            left -= required
            if left > buffer:
                room[0] = (worker, left)
                room.sort(key=lambda x: -x[1])
            else:
                room.pop(0)

    def _pause_until_safe(self, usage: dict[int, _Usage]) -> None:
        """Every worker above the pause level: pause its smallest ACTING programs down to the
        target, then, if still above it, mark all its REASONING ones."""
        target_share = min(self.params.pause_target, self.params.pause_threshold)
        for entry in usage.values():
            if entry.used <= entry.capacity * self.params.pause_threshold:
                continue
            target = entry.capacity * target_share
            for program in sorted((p for p in entry.programs if not p.reasoning),
                                  key=lambda p: p.tokens):
                if entry.used <= target:
                    break
                if program.marked or not self._pause(program):
                    continue
                freed = self._charge(program)  # between turns: nothing streamed
                entry.programs.remove(program)
                entry.used -= freed
            if entry.used > target:
                for program in entry.programs:
                    if program.reasoning and not program.marked:
                        program.marked = True
