"""The router's Prometheus metrics, named and labelled beside Dynamo's own (docs/metrics.md).

Two kinds of source, so that every figure is exact and cheap:

- **counters and histograms** move when something happens: the scheduler's recorded steps
  (:class:`~dynamo_thunderagent.decisions.ProgramEvent`, one per pause, resume, move, expiry,
  eviction, end; told through :class:`~dynamo_thunderagent.program_log.SchedulerObserver`), its
  rejections, each tick's duration and each admitted turn's wait. Nothing is recounted from
  state, so a pause counted here is a pause the scheduler decided.
- **gauges** and the router's request counters are read when Prometheus scrapes (a
  collector): programs by phase and lifecycle, tracked and waiting requests, usage, capacity
  and decayed usage per worker/rank, prefix-cache hits. They are the scheduler's state at
  that moment, not a running tally that could drift.

Names start with ``dynamo_component_thunderagent_``: the router is a Dynamo component, and
its metrics sit on the component's system server next to ``dynamo_component_*``. Every
sample carries ``dynamo_namespace`` (the router's namespace) and ``model``; per-rank ones add
``worker_id`` and ``dp_rank``, as Dynamo's per-worker metrics do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dynamo_thunderagent.classifier import ThunderAgentClassifier
from dynamo_thunderagent.decisions import EventKind, ProgramEvent
from dynamo_thunderagent.program import Lifecycle, Phase

if TYPE_CHECKING:
    from dynamo_thunderagent.dynamo.router import ThunderAgentRouter

PREFIX = "dynamo_component_thunderagent"
BASE_LABELS = ("dynamo_namespace", "model")
RANK_LABELS = (*BASE_LABELS, "worker_id", "dp_rank")

# Admission waits run from nothing (admitted at once) to resume_timeout (minutes).
ADMISSION_WAIT_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                          120.0, 300.0, 900.0, 1800.0)
# A tick is O(programs) plus the plans: microseconds at a few programs, milliseconds at
# thousands (`bench overhead`).
TICK_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                0.5, 1.0)

# The counter each program event moves (kinds not listed are counted as turns).
_EVENT_COUNTERS = {
    EventKind.PAUSED: "program_pauses",
    EventKind.RESUMED: "program_resumes",
    EventKind.FORCED: "program_resumes",  # reason resume_timeout: a forced resume
    EventKind.MOVED: "program_moves",
    EventKind.EXPIRED: "program_expiries",
    EventKind.EVICTED: "program_evictions",
    EventKind.ENDED: "program_ends",
    EventKind.ADMITTED: "turns_admitted",
    EventKind.DEFERRED: "turns_deferred",
}

# What each metric means, in one place: the help text Prometheus shows and the table in
# docs/metrics.md (a unit test keeps them in step). (name, type, labels beyond
# dynamo_namespace and model, help)
METRICS: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    ("program_pauses_total", "counter", ("reason",),
     "Programs paused, by reason: pressure, tool_boundary, no_room, idle, aging."),
    ("program_resumes_total", "counter", ("reason",),
     "Programs resumed: reason room (planned), evicting (run without room where holding "
     "back keeps no cache), resume_timeout (forced)."),
    ("program_moves_total", "counter", ("reason",),
     "Programs whose worker/rank changed: resume, served_elsewhere, placed, empty_rank, "
     "outgrown."),
    ("program_expiries_total", "counter", ("reason",),
     "Idle programs removed past session_retention_seconds."),
    ("program_evictions_total", "counter", ("reason",),
     "Idle programs removed to make room in the table (max_tracked_requests)."),
    ("program_ends_total", "counter", ("reason",),
     "Programs removed at their session-final request, or rolled back."),
    ("turns_admitted_total", "counter", ("reason",),
     "Turns released to a worker/rank: sticky, placed, resumed, no_capacity_known, "
     "empty_rank, outgrown."),
    ("turns_deferred_total", "counter", ("reason",),
     "Turns held back because their program is paused."),
    ("rejections_total", "counter", ("reason",),
     "Requests rejected, by the limit they hit."),
    ("admission_wait_seconds", "histogram", (),
     "Time a turn of a session waited for admission (turns run alongside included, "
     "session-final requests not)."),
    ("tick_duration_seconds", "histogram", (),
     "Duration of one scheduler tick."),
    ("programs", "gauge", ("phase", "lifecycle"),
     "Programs in the table, by phase (reasoning, acting) and lifecycle (active, paused)."),
    ("tracked_requests", "gauge", (),
     "Requests the scheduler tracks (in flight, deferred or queued behind a session's turn)."),
    ("waiting_requests", "gauge", (),
     "Turns waiting for admission now (deferred)."),
    ("waiting_for_room_programs", "gauge", (),
     "Paused programs whose turn waits for room."),
    ("in_flight_requests", "gauge", (),
     "Requests the router is forwarding now (tracked and passthrough)."),
    ("worker_usage_tokens", "gauge", ("worker_id", "dp_rank"),
     "Usage the scheduler charges a worker/rank, in tokens."),
    ("worker_decayed_usage_tokens", "gauge", ("worker_id", "dp_rank"),
     "Usage with ACTING programs decayed (what resume decisions read), in tokens."),
    ("worker_capacity_tokens", "gauge", ("worker_id", "dp_rank"),
     "KV capacity of a live worker/rank from its model card, in tokens."),
    ("worker_programs", "gauge", ("worker_id", "dp_rank"),
     "Active programs on a worker/rank (paused ones not counted)."),
    ("worker_cache_loss_ratio", "gauge", ("worker_id", "dp_rank"),
     "Recent share of the prefix tokens continuing turns expected cached on a worker/rank "
     "that the engine no longer had (0: it evicts nothing our usage counts)."),
    ("worker_resume_loss_ratio", "gauge", ("worker_id", "dp_rank"),
     "Recent share of the prompt paused programs left cached on a worker/rank that the "
     "engine no longer had when they came back to it (low: a pause there saves nothing)."),
    ("requests_total", "counter", ("outcome",),
     "Requests the router received, by how they ended: completed, aborted, rejected, "
     "passthrough, session_final, cancelled, orphaned."),
    ("prompt_tokens_total", "counter", (),
     "Prompt tokens of finished tracked and passthrough turns, as the engine reported them."),
    ("cached_tokens_total", "counter", (),
     "Prompt tokens served from the prefix cache (prefix hits)."),
    ("recomputed_tokens_total", "counter", (),
     "Prompt tokens prefilled again (prompt tokens less prefix hits)."),
    ("failovers_total", "counter", (),
     "Moves of a turn to another worker after its worker failed it (mid-stream or before "
     "the first chunk; a turn moved twice counts twice)."),
    ("stalled_streams_total", "counter", (),
     "Streams cut because their worker left discovery and they streamed nothing for a "
     "while (a hung worker); each then fails over unless it had finished."),
    ("registrations_restored_total", "counter", (),
     "Registration files of the router that file discovery had expired (the router frozen "
     "past its lease) and the router wrote back, so the frontend routes to it again."),
    ("other_routers", "gauge", (),
     "Other routers serving this router's endpoint for 45 s or more (0 in "
     "a sound deployment: one router per set of workers, another model's at an endpoint of "
     "its own)."),
    ("policy_reloads_total", "counter", ("result",),
     "Policy reloads (SIGHUP or --watch-policy), by result: ok, invalid, needs_restart."),
    ("lifecycle_events_total", "counter", ("event",),
     "Program lifecycle notifications published (serve --events-port): paused, resuming, "
     "ended, expired."),
)
HELP = {name: text for name, _, _, text in METRICS}


def _help(name: str) -> str:
    return HELP[name]


class RouterMetrics:
    """The router's metrics in one registry; observes the scheduler and the router."""

    def __init__(self, router: ThunderAgentRouter, *, namespace: str, model: str,
                 registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.base = (namespace, model)
        self._counters: dict[str, Counter] = {}
        for name in sorted(set(_EVENT_COUNTERS.values())):
            self._counters[name] = Counter(f"{PREFIX}_{name}", _help(f"{name}_total"),
                                           [*BASE_LABELS, "reason"], registry=self.registry)
        self.rejections = Counter(f"{PREFIX}_rejections", _help("rejections_total"),
                                  [*BASE_LABELS, "reason"], registry=self.registry)
        self.admission_wait = Histogram(
            f"{PREFIX}_admission_wait_seconds", _help("admission_wait_seconds"), BASE_LABELS,
            buckets=ADMISSION_WAIT_BUCKETS, registry=self.registry).labels(*self.base)
        self.tick_duration = Histogram(
            f"{PREFIX}_tick_duration_seconds", _help("tick_duration_seconds"), BASE_LABELS,
            buckets=TICK_BUCKETS, registry=self.registry).labels(*self.base)
        self.registry.register(StateCollector(router, self.base))
        if isinstance(router.classifier, ThunderAgentClassifier):
            router.classifier.observers.append(self)
        router.observer = self

    # ---- SchedulerObserver -------------------------------------------------------------
    def program_event(self, event: ProgramEvent) -> None:
        name = _EVENT_COUNTERS[event.kind]
        self._counters[name].labels(*self.base, event.reason).inc()

    def rejected(self, reason: str) -> None:
        self.rejections.labels(*self.base, reason).inc()

    def ticked(self, seconds: float) -> None:
        self.tick_duration.observe(seconds)

    # ---- the router's own observations ---------------------------------------------------
    def admission_waited(self, seconds: float) -> None:
        self.admission_wait.observe(seconds)

    def exposition(self) -> bytes:
        """The registry in Prometheus' text format."""
        return generate_latest(self.registry)


class StateCollector(Collector):
    """Gauges and the router's request counters, read from the live state at each scrape."""

    def __init__(self, router: ThunderAgentRouter, base: Sequence[str]) -> None:
        self.router = router
        self.base = list(base)

    def _family(self, cls: type[GaugeMetricFamily] | type[CounterMetricFamily], name: str,
                labels: Sequence[str] = ()) -> GaugeMetricFamily | CounterMetricFamily:
        return cls(f"{PREFIX}_{name.removesuffix('_total')}", _help(name),
                   labels=[*BASE_LABELS, *labels])

    def collect(self) -> Iterator[Metric]:
        router = self.router
        base = self.base
        stats = router.stats
        in_flight = self._family(GaugeMetricFamily, "in_flight_requests")
        in_flight.add_metric(base, len(router.in_flight) + router.passthrough_in_flight)
        yield in_flight
        requests = self._family(CounterMetricFamily, "requests_total", ("outcome",))
        for outcome, value in (("completed", stats.completed), ("aborted", stats.aborted),
                               ("rejected", stats.rejected), ("passthrough", stats.passthrough),
                               ("session_final", stats.session_final),
                               ("cancelled", stats.cancelled), ("orphaned", stats.orphans)):
            requests.add_metric([*base, outcome], value)
        yield requests
        for name, value in (("prompt_tokens_total", stats.prompt_tokens),
                            ("cached_tokens_total", stats.cached_tokens),
                            ("recomputed_tokens_total", stats.prompt_tokens - stats.cached_tokens),
                            ("failovers_total", stats.failovers),
                            ("stalled_streams_total", stats.stalled)):
            family = self._family(CounterMetricFamily, name)
            family.add_metric(base, value)
            yield family
        yield from self._operations(router.state_extensions)
        classifier = router.classifier
        if isinstance(classifier, ThunderAgentClassifier):
            yield from self._scheduler(classifier)

    def _operations(self, parts: Mapping[str, Callable[[], Any]]) -> Iterator[Metric]:
        """Reloads by result, lifecycle notifications by event, registrations written back
        and other routers at the endpoint, from the parts ``serve`` adds to /state (absent:
        not counted, e.g. a router built without ``serve``)."""
        for key, name, label, field in (("policy", "policy_reloads_total", "result", "reloads"),
                                        ("lifecycle", "lifecycle_events_total", "event",
                                         "published")):
            part = parts.get(key)
            counts = part().get(field) if part is not None else None
            if not isinstance(counts, dict):
                continue
            family = self._family(CounterMetricFamily, name, (label,))
            for value_label, value in sorted(counts.items()):
                family.add_metric([*self.base, str(value_label)], value)
            yield family
        # One number each: the registration files written back (file discovery only), and
        # the other routers at the endpoint (absent while that watch is off).
        scalars: tuple[tuple[str, str, str, type[CounterMetricFamily | GaugeMetricFamily]],
                       ...] = (
            ("registration", "registrations_restored_total", "restored", CounterMetricFamily),
            ("routers", "other_routers", "other_routers", GaugeMetricFamily))
        for key, name, field, cls in scalars:
            part = parts.get(key)
            value = part().get(field) if part is not None else None
            if isinstance(value, int):
                scalar = self._family(cls, name)
                scalar.add_metric(self.base, value)
                yield scalar

    def _scheduler(self, classifier: ThunderAgentClassifier) -> Iterator[Metric]:
        base = self.base
        scheduler = classifier.scheduler
        table = scheduler.table
        now = classifier.clock()
        counts = {(phase, lifecycle): 0 for phase in Phase for lifecycle in Lifecycle}
        for program in table.programs.values():
            counts[program.phase, program.lifecycle] += 1
        programs = self._family(GaugeMetricFamily, "programs", ("phase", "lifecycle"))
        for (phase, lifecycle), count in counts.items():
            programs.add_metric([*base, phase.value, lifecycle.value], count)
        yield programs
        for name, value in (("tracked_requests", len(table.requests)),
                            ("waiting_requests", classifier.deferred_requests),
                            ("waiting_for_room_programs", scheduler.waiting_for_room)):
            family = self._family(GaugeMetricFamily, name)
            family.add_metric(base, value)
            yield family
        usage = self._family(GaugeMetricFamily, "worker_usage_tokens", ("worker_id", "dp_rank"))
        decayed = self._family(GaugeMetricFamily, "worker_decayed_usage_tokens",
                               ("worker_id", "dp_rank"))
        capacity = self._family(GaugeMetricFamily, "worker_capacity_tokens",
                                ("worker_id", "dp_rank"))
        members = self._family(GaugeMetricFamily, "worker_programs", ("worker_id", "dp_rank"))
        loss = self._family(GaugeMetricFamily, "worker_cache_loss_ratio",
                            ("worker_id", "dp_rank"))
        resume_loss = self._family(GaugeMetricFamily, "worker_resume_loss_ratio",
                                   ("worker_id", "dp_rank"))
        known = scheduler.capacity.known
        for worker in sorted(set(known) | set(table.assigned_workers())):
            labels = [*base, str(worker.worker_id), str(worker.dp_rank)]
            usage.add_metric(labels, table.usage(worker))
            decayed.add_metric(labels, table.decayed_usage(worker, now))
            members.add_metric(labels, len(table.members(worker)))
            if worker in known:
                capacity.add_metric(labels, known[worker])
            ratio = scheduler.cache_loss.loss_ratio(worker)
            if ratio is not None:
                loss.add_metric(labels, ratio)
            ratio = scheduler.resume_loss.loss_ratio(worker)
            if ratio is not None:
                resume_loss.add_metric(labels, ratio)
        yield from (usage, decayed, capacity, members, loss, resume_loss)
