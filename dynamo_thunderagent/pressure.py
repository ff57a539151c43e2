"""The pause rule: which programs give way when a worker/rank is over its threshold.

A rule reads the table and returns a :class:`PausePlan`; the scheduler applies it
(pauses ACTING programs now, marks REASONING ones to pause at their tool boundary).
Rules are chosen once from the parameters (:func:`pause_rule`):

* ``parity`` (the paper's rule, mission.md): over ``pause_threshold``, pause the
  smallest ACTING programs until usage is at ``pause_target``, then mark the smallest
  REASONING ones; marked programs already count as gone. Three extensions only change
  its ingredients: what counts as usage (``pressure_decay``: the decayed usage the
  resume side uses), which programs are eligible (``min_residency_seconds``; a pause
  that does not pay, per the cost model) and in what order (``pause_order``). A program
  that yielded its room (``acting_yield_factor``) holds none, so no rule pauses it.
* ``upstream``: the upstream ThunderAgent proxy's rule, kept for comparison. It drains
  to the threshold itself and, when no ACTING program is left, marks *every* unmarked
  REASONING program (marking does not lower its usage estimate).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from dynamo_thunderagent.cache_loss import CacheLossMeter
from dynamo_thunderagent.capacity import Capacity, UsageModel
from dynamo_thunderagent.costs import CostModel
from dynamo_thunderagent.parameters import ThunderAgentParameters
from dynamo_thunderagent.program import Phase, Program, WorkerKey
from dynamo_thunderagent.program_table import ProgramTable


@dataclass
class PausePlan:
    """Programs to pause now (in order), then programs to mark for pause."""

    pause: list[Program] = field(default_factory=list)
    mark: list[Program] = field(default_factory=list)


class PauseRule(Protocol):
    def plan(self, table: ProgramTable, capacity: Capacity, now: float,
             batch: float) -> PausePlan:
        """``batch``: turns running per worker/rank (for the cost model)."""

    def make_room(self, table: ProgramTable, worker: WorkerKey, limit: float, now: float,
                  batch: float) -> PausePlan:
        """Programs of ``worker`` to pause, then to mark, until its usage is at most
        ``limit`` tokens (``aging_makes_room``: room for a turn that waited too long)."""

    def over_threshold(self, table: ProgramTable, capacity: Capacity, worker: WorkerKey,
                       now: float) -> bool:
        """Whether the rule would relieve ``worker`` now (its usage over the threshold)."""

    def relief(self, table: ProgramTable, capacity: Capacity, worker: WorkerKey, now: float,
               batch: float) -> str:
        """Whether the rule pauses on ``worker`` now, and if not why (one of
        :data:`RELIEF`): what ``/state`` and ``top`` show per worker/rank."""


#: What :meth:`PauseRule.relief` says of a worker/rank: ``pausing`` (over its threshold with
#: programs that give way), ``under_threshold``, ``no_capacity_card``, or over its threshold
#: but not pausing because its engine keeps paused programs (``engine_keeps_paused``,
#: ``pause_min_resume_loss``) or is not seen to lose cache (``no_cache_loss``,
#: ``pause_min_cache_loss``), it holds one program (``only_program``), its marked programs
#: pause at their tool boundary (``marked``), or none of its programs gives way: most of
#: them because their pause would not pay (``pause_does_not_pay``,
#: ``pause_min_recompute_ratio``), they yielded their room (``yielded``) or became active
#: within ``min_residency_seconds`` (``min_residency``).
RELIEF = ("pausing", "under_threshold", "no_capacity_card", "engine_keeps_paused",
          "no_cache_loss", "only_program", "marked", "pause_does_not_pay", "yielded",
          "min_residency")


class ParityPauseRule:
    """The paper's rule, with its ingredients chosen once from the parameters."""

    def __init__(self, params: ThunderAgentParameters, model: UsageModel,
                 costs: CostModel, cache_loss: CacheLossMeter | None = None,
                 keeps_paused: Callable[[WorkerKey], bool] | None = None) -> None:
        self.threshold = params.pause_threshold
        self.min_loss = params.pause_min_cache_loss
        self.cache_loss = cache_loss
        self.keeps_paused = keeps_paused
        self.target = params.pause_target
        self.residency = params.min_residency_seconds
        self.decay = params.pressure_decay
        self.model = model
        self.costs = costs
        self.order = params.pause_order

    def plan(self, table: ProgramTable, capacity: Capacity, now: float,
             batch: float) -> PausePlan:
        plan = PausePlan()
        charge = self._charge(now)
        victim_order = self._victim_order(now)
        for worker, cap in capacity.known.items():
            usage = self._usage(table, worker, now)
            if usage <= cap * self.threshold or not self._engine_evicts(worker):
                continue
            target = cap * self.target
            members = table.members(worker)
            if len(members) <= 1 and capacity.reserved(worker):
                continue  # its one program, paused, would only come straight back
            usage -= sum(charge(p) for p in members if p.marked_for_pause)
            acting = sorted(
                (p for p in members if p.phase is Phase.ACTING
                 and self._gives_way(p, now, batch)),
                key=victim_order,
            )
            for program in acting:
                if usage <= target:
                    break
                usage -= charge(program)
                plan.pause.append(program)
            reasoning = sorted(
                (p for p in members if p.phase is Phase.REASONING and not p.marked_for_pause
                 and self.costs.pause_pays(p.tokens, batch)),
                key=_smallest,
            )
            for program in reasoning:
                if usage <= target:
                    break
                usage -= charge(program)
                plan.mark.append(program)
        return plan

    def make_room(self, table: ProgramTable, worker: WorkerKey, limit: float, now: float,
                  batch: float) -> PausePlan:
        """Pause ACTING programs of ``worker``, then mark REASONING ones, until its usage
        is at most ``limit``. Usage is the pause side's (without ``pressure_decay``, a
        program in a tool call counts in full: its next turn would take its room back).
        Programs give way in the pause rule's order (``pause_order``; REASONING ones
        smallest first) and only where their pause pays; none that became active less
        than ``min_residency_seconds`` ago, REASONING ones included (a turn just let in
        after its own long wait is not marked for the next). Already marked ones count as
        gone. (Largest first would pause fewer programs; in the simulator it was no
        better.)"""
        plan = PausePlan()
        charge = self._charge(now)
        members = table.members(worker)
        usage = self._usage(table, worker, now)
        usage -= sum(charge(p) for p in members if p.marked_for_pause)
        if usage <= limit:
            return plan
        eligible = [p for p in members
                    if not p.marked_for_pause and self._gives_way(p, now, batch)]
        orders = ((Phase.ACTING, plan.pause, self._victim_order(now)),
                  (Phase.REASONING, plan.mark, _smallest))
        for phase, chosen, order in orders:
            for program in sorted((p for p in eligible if p.phase is phase), key=order):
                if usage <= limit:
                    return plan
                usage -= charge(program)
                chosen.append(program)
        return plan

    def _gives_way(self, program: Program, now: float, batch: float) -> bool:
        """Whether ``program`` may be paused: it holds room (it did not yield it), it
        became active at least ``min_residency_seconds`` ago, and its pause pays."""
        return self._kept(program, now, batch) is None

    def _kept(self, program: Program, now: float, batch: float) -> str | None:
        """Why ``program`` may not be paused (a :data:`RELIEF` reason); None: it may."""
        if program.yielded:
            return "yielded"
        residency = self.residency
        if (residency and program.active_since is not None
                and now - program.active_since < residency):
            return "min_residency"
        if not self.costs.pause_pays(program.tokens, batch):
            return "pause_does_not_pay"
        return None

    def relief(self, table: ProgramTable, capacity: Capacity, worker: WorkerKey, now: float,
               batch: float) -> str:
        cap = capacity.known.get(worker)
        if cap is None:
            return "no_capacity_card"
        usage = self._usage(table, worker, now)
        if usage <= cap * self.threshold:
            return "under_threshold"
        if self.keeps_paused is not None and self.keeps_paused(worker):
            return "engine_keeps_paused"
        if not self._engine_evicts(worker):
            return "no_cache_loss"
        members = table.members(worker)
        if len(members) <= 1 and capacity.reserved(worker):
            return "only_program"
        charge = self._charge(now)
        marked = sum(charge(p) for p in members if p.marked_for_pause)
        if marked and usage - marked <= cap * self.target:
            return "marked"  # the marks drain it: nobody else gives way now
        kept = []
        for program in members:
            if program.phase is Phase.ACTING:
                why = self._kept(program, now, batch)
            elif program.marked_for_pause:
                continue
            else:  # REASONING: marked for its tool boundary where its pause pays
                pays = self.costs.pause_pays(program.tokens, batch)
                why = None if pays else "pause_does_not_pay"
            if why is None:
                return "pausing"
            kept.append(why)
        if any(p.marked_for_pause for p in members) or not kept:
            return "marked"
        return max(sorted(set(kept)), key=kept.count)

    def over_threshold(self, table: ProgramTable, capacity: Capacity, worker: WorkerKey,
                       now: float) -> bool:
        cap = capacity.known.get(worker)
        if cap is None:
            return False
        usage = self._usage(table, worker, now)
        return usage > cap * self.threshold and self._engine_evicts(worker)

    def _usage(self, table: ProgramTable, worker: WorkerKey, now: float) -> float:
        """The pause side's usage of ``worker``: decayed with ``pressure_decay``, else
        plain (a program in a tool call counts in full)."""
        return table.decayed_usage(worker, now) if self.decay else table.usage(worker)

    def _engine_evicts(self, worker: WorkerKey) -> bool:
        """Whether a pause on ``worker`` would keep a cache: its engine does not keep
        paused programs anyway (``keeps_paused``: ``pause_min_resume_loss``, the
        scheduler's judgement) and is seen to lose cache (``pause_min_cache_loss``; True
        while unmeasured, or without the parameter)."""
        if self.keeps_paused is not None and self.keeps_paused(worker):
            return False
        if self.min_loss is None or self.cache_loss is None:
            return True
        ratio = self.cache_loss.loss_ratio(worker)
        return ratio is None or ratio >= self.min_loss

    def _charge(self, now: float) -> Callable[[Program], float]:
        model = self.model
        if self.decay:
            return lambda p: model.decayed_charge(p, now)
        return model.charge

    def _victim_order(self, now: float) -> Callable[[Program], tuple[float, int, int]]:
        if self.order == "longest_idle":  # the tool that has run longest first
            return lambda p: (p.acting_since if p.acting_since is not None else now,
                              p.tokens, p.seq)
        if self.order == "expected_return":  # expected back latest first (own history)
            def expected_back(p: Program) -> tuple[float, int, int]:
                ran = now - p.acting_since if p.acting_since is not None else 0.0
                return (-max(0.0, p.max_gap - ran), p.tokens, p.seq)
            return expected_back
        return lambda p: (0.0, p.tokens, p.seq)


def _smallest(program: Program) -> tuple[float, int, int]:
    return (0.0, program.tokens, program.seq)


class UpstreamPauseRule:
    """The upstream proxy's rule (see the module docstring)."""

    def __init__(self, params: ThunderAgentParameters, model: UsageModel) -> None:
        self.threshold = params.pause_threshold
        self.model = model

    def plan(self, table: ProgramTable, capacity: Capacity, now: float,
             batch: float) -> PausePlan:
        plan = PausePlan()
        for worker, cap in capacity.known.items():
            usage = table.usage(worker)
            limit = cap * self.threshold
            if usage <= limit:
                continue
            members = table.members(worker)
            for program in sorted((p for p in members
                                   if p.phase is Phase.ACTING and not p.yielded),
                                  key=lambda p: (p.tokens, p.seq)):
                if usage <= limit:
                    break
                usage -= self.model.charge(program)
                plan.pause.append(program)
            if usage <= limit:
                continue
            plan.mark.extend(p for p in members
                             if p.phase is Phase.REASONING and not p.marked_for_pause)
        return plan


    def make_room(self, table: ProgramTable, worker: WorkerKey, limit: float, now: float,
                  batch: float) -> PausePlan:
        """The upstream proxy makes no room for a waiting turn (it has no aging)."""
        return PausePlan()

    def over_threshold(self, table: ProgramTable, capacity: Capacity, worker: WorkerKey,
                       now: float) -> bool:
        cap = capacity.known.get(worker)
        return cap is not None and table.usage(worker) > cap * self.threshold

    def relief(self, table: ProgramTable, capacity: Capacity, worker: WorkerKey, now: float,
               batch: float) -> str:
        if worker not in capacity.known:
            return "no_capacity_card"
        return ("pausing" if self.over_threshold(table, capacity, worker, now)
                else "under_threshold")


def pause_rule(params: ThunderAgentParameters, model: UsageModel, costs: CostModel,
               cache_loss: CacheLossMeter | None = None,
               keeps_paused: Callable[[WorkerKey], bool] | None = None) -> PauseRule:
    """The pause rule a policy names (``pause_rule``; parity by default)."""
    if params.pause_rule == "upstream":
        return UpstreamPauseRule(params, model)
    return ParityPauseRule(params, model, costs, cache_loss, keeps_paused)
