"""``doctor``'s verdicts: from facts gathered about a deployment to findings with fixes.

A misconfigured deployment does not fail, it silently routes around the scheduler: a frontend
not scoped to the router's namespace, workers registered where that frontend sees them, clients
that never send a session id. Each check here turns facts (what discovery lists, which instance
served the frontend's probes, the router's counters) into a :class:`Finding`: ok, warn or fail,
what was found, and what to change. Everything here is pure; the shell that gathers the facts is
:mod:`dynamo_thunderagent.dynamo.doctor`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from dynamo_thunderagent.dynamo.peers import CONFIRM_SECONDS
from dynamo_thunderagent.dynamo.stats import MISSING_SESSIONS_MIN_REQUESTS

Status = Literal["ok", "warn", "fail"]
SESSION_HEADER_FIX = ("send X-Dynamo-Session-ID: <stable id> on every turn of an agent "
                      "(the frontend also reads x-session-id, thread-id and Claude Code's "
                      "x-claude-code-session-id as one; examples/agent_loop.py shows the loop)")
ONE_ROUTER_FIX = ("run exactly one `dynamo-thunderagent serve` per set of workers (in "
                  "Kubernetes: replicas: 1 and strategy Recreate) and stop the others; give "
                  "the router of another model an endpoint of its own (--router-endpoint)")
# The namespace a frontend cannot be scoped to: it discovers every namespace with it.
UNSCOPED_NAMESPACE = "dynamo"


@dataclass(frozen=True)
class Finding:
    status: Status
    check: str  # which question: discovery, router, workers, capacity, exposure, frontend...
    found: str
    fix: str | None = None


@dataclass(frozen=True)
class Settings:
    """What ``serve`` was (or should be) started with."""

    worker_endpoint: str  # ns.component.endpoint the workers serve
    router_endpoint: str  # ns.component.endpoint the router serves
    model_name: str

    @property
    def router_namespace(self) -> str:
        return self.router_endpoint.split(".")[0]


@dataclass(frozen=True)
class Registration:
    """One model card in discovery: who serves which model where."""

    namespace: str
    component: str
    endpoint: str
    instance_id: int
    model: str | None
    total_kv_blocks: int | None  # the capacity card; None when not published

    @property
    def path(self) -> str:
        return f"{self.namespace}.{self.component}.{self.endpoint}"


@dataclass(frozen=True)
class Discovery:
    """What discovery lists; ``error`` when it could not be read."""

    backend: str
    where: str
    cards: tuple[Registration, ...] = ()
    error: str | None = None
    listable: bool = True  # False: a backend doctor cannot list (it reads file and etcd)


@dataclass(frozen=True)
class FrontendView:
    """What the frontend answered: the models it lists and which instance served each probe."""

    url: str
    models: tuple[str, ...] | None = None
    served_by: tuple[int, ...] = ()
    probes: int = 0
    error: str | None = None  # the frontend could not be reached or answered badly
    probe_errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class RouterView:
    """The router's counters (its GET /state), less doctor's own probes."""

    url: str
    recent_with_session: int = 0
    recent_without_session: int = 0
    window_requests: int = 0
    window_seconds: float = 0.0
    with_session: int = 0
    session_finals: int = 0
    live_workers: tuple[int, ...] = ()
    prefill_only: tuple[int, ...] = ()  # /state prefill_only_workers: never a target
    programs: int = 0
    block_size_mismatch: str | None = None
    card_mismatch: str | None = None  # /state router_card.mismatch
    other_routers: str | None = None  # /state routers.problem: others serve its endpoint
    # /state routers: whether the router watches its endpoint (False: an older router, or
    # one whose watch could not start, then ``routers_unwatched`` says why)
    routers_watched: bool = False
    routers_unwatched: str | None = None
    instance_id: int | None = None  # /state routers.instance_id: the router's own instance
    error: str | None = None


def router_view(url: str, state: Mapping[str, Any]) -> RouterView:
    """The counters doctor needs from a router's /state; ValueError naming what is missing."""
    router = state.get("router")
    scheduler = state.get("scheduler")
    if not isinstance(router, Mapping) or not isinstance(scheduler, Mapping):
        raise ValueError(f"{url} is not a ThunderAgent router's /state (no 'router' and "
                         "'scheduler' objects)")
    missing = [key for key in ("recent_with_session", "recent_without_session", "with_session",
                               "session_final", "doctor_probes", "recent_window")
               if key not in router]
    if missing:
        raise ValueError(f"{url}: the router's counters lack {', '.join(missing)}; it predates "
                         "doctor (upgrade dynamo-thunderagent on the router)")
    window = router["recent_window"]
    routers = state.get("routers")
    return RouterView(
        url=url,
        recent_with_session=int(router["recent_with_session"]),
        recent_without_session=int(router["recent_without_session"]),
        window_requests=int(window["requests"]), window_seconds=float(window["seconds"]),
        with_session=int(router["with_session"]),
        session_finals=int(router["session_final"]) - int(router["doctor_probes"]),
        live_workers=tuple(int(w) for w in state.get("live_workers") or ()),
        prefill_only=tuple(int(w) for w in state.get("prefill_only_workers") or ()),
        programs=len(scheduler.get("programs") or {}),
        block_size_mismatch=_part_text(state.get("kv_router"), "mismatch"),
        card_mismatch=_part_text(state.get("router_card"), "mismatch"),
        other_routers=_part_text(routers, "problem"),
        routers_watched=isinstance(routers, Mapping) and "other_instances" in routers,
        routers_unwatched=(str(routers["unwatched"]) if isinstance(routers, Mapping)
                           and routers.get("unwatched") else None),
        instance_id=_instance_id(routers),
    )


def _instance_id(routers: object) -> int | None:
    """/state ``routers.instance_id``: the instance the router serves as (None: unknown)."""
    own = routers.get("instance_id") if isinstance(routers, Mapping) else None
    return own if isinstance(own, int) and not isinstance(own, bool) else None


def _part_text(part: object, key: str) -> str | None:
    """What a /state part says is wrong under ``key`` (``kv_router.mismatch``,
    ``routers.problem``); None: nothing, or a router that predates the part."""
    if not isinstance(part, Mapping):
        return None
    text = part.get(key)
    return str(text) if text else None


# ---- the checks ------------------------------------------------------------------------------
def diagnose(settings: Settings, discovery: Discovery, frontend: FrontendView | None,
             router: RouterView | None) -> list[Finding]:
    """Every finding, in the order a reader fixes them: discovery, then the path a request
    takes (frontend, router, workers), then what clients send."""
    # A router that watches its endpoint and has not seen others there for 45 s says that
    # any extra listing may be a router killed moments ago (10 s file discovery, 30 s etcd).
    unconfirmed = (router is not None and router.error is None and router.routers_watched
                   and router.other_routers is None)
    findings = check_discovery(settings, discovery, unconfirmed_routers=unconfirmed)
    if frontend is None:
        findings.append(Finding("warn", "frontend", "not checked (no --frontend URL given)",
                                "pass --frontend http://HOST:PORT of the Dynamo frontend"))
    else:
        own = router.instance_id if router is not None and router.error is None else None
        findings += check_frontend(settings, discovery, frontend, router_instance=own)
    if router is None:
        findings.append(Finding("warn", "sessions",
                                "not checked (no --state URL given): the share of requests "
                                "with a session id comes from the router's counters",
                                "start serve with --state-port P and pass --state "
                                "http://127.0.0.1:P/state"))
    else:
        findings += check_router(router)
    return findings


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _listing(cards: Sequence[Registration]) -> str:
    by_path: dict[str, list[int]] = {}
    for card in cards:
        by_path.setdefault(card.path, []).append(card.instance_id)
    return "; ".join(f"{path} (instances {', '.join(str(i) for i in sorted(ids))})"
                     for path, ids in sorted(by_path.items()))


def check_discovery(settings: Settings, discovery: Discovery, *,
                    unconfirmed_routers: bool = False) -> list[Finding]:
    """Routers, workers, capacity cards, and workers registered where the frontend sees them.
    ``unconfirmed_routers``: the router's own watch has not confirmed any other router at
    its endpoint, so more than one listed there is a warning, not a failure."""
    if not discovery.listable:
        return [Finding("warn", "discovery",
                        f"backend {discovery.backend!r}: {discovery.error}",
                        "run doctor where the file store is readable, or check the "
                        "registrations with the backend's own tools")]
    if discovery.error is not None:
        return [Finding("fail", "discovery", f"backend {discovery.backend!r} at "
                        f"{discovery.where}: {discovery.error}",
                        "run doctor with the same DYN_DISCOVERY_BACKEND and "
                        f"{'ETCD_ENDPOINTS' if discovery.backend == 'etcd' else 'DYN_FILE_KV'} "
                        "as serve, the frontend and the workers")]
    model = settings.model_name
    cards = [card for card in discovery.cards if card.model == model]
    findings = [Finding("ok", "discovery",
                        f"backend {discovery.backend!r} at {discovery.where}: "
                        f"{_count(len(discovery.cards), 'model registration')}, {len(cards)} of "
                        f"model {model!r}")]
    routers = [c for c in cards if c.path == settings.router_endpoint]
    workers = [c for c in discovery.cards if c.path == settings.worker_endpoint]
    # Every instance at the router's endpoint, whatever model it registered: the frontend
    # sends the endpoint's requests to any of them.
    at_endpoint = [c for c in discovery.cards if c.path == settings.router_endpoint]
    instances = len({c.instance_id for c in at_endpoint})
    if instances > 1:
        models = sorted({str(c.model) for c in at_endpoint})
        found = (f"{instances} routers serve {_listing(at_endpoint)} (models "
                 f"{', '.join(models)}): the frontend spreads requests over them, and each "
                 "keeps a program table of its own and admits programs up to the workers' "
                 "whole KV cache")
        if unconfirmed_routers:
            findings.append(Finding(
                "warn", "router", f"{found} (the router itself has not seen them there for "
                f"{CONFIRM_SECONDS:g} s: a router killed moments ago stays listed for up to "
                "10 s under file discovery and 30 s under etcd; run doctor again)",
                ONE_ROUTER_FIX))
        else:
            findings.append(Finding("fail", "router", found, ONE_ROUTER_FIX))
    elif routers:
        findings.append(Finding("ok", "router", f"the router serves {model!r} at "
                                f"{_listing(routers)}"))
    else:
        findings.append(Finding("fail", "router",
                                f"no router serves {model!r} at {settings.router_endpoint}",
                                "start `dynamo-thunderagent serve` with --model-name "
                                f"{model} --router-endpoint {settings.router_endpoint} and the "
                                "same discovery settings, or pass doctor the --router-endpoint "
                                "serve runs with"))
    findings += _check_workers(settings, workers)
    findings += _check_exposure(settings, cards)
    return findings


def _check_workers(settings: Settings, workers: Sequence[Registration]) -> list[Finding]:
    model = settings.model_name
    if not workers:
        return [Finding("fail", "workers", f"no worker registered at {settings.worker_endpoint}",
                        f"start the engines with --endpoint dyn://{settings.worker_endpoint}, "
                        "or pass doctor the --endpoint serve runs with")]
    findings = []
    others = sorted({repr(w.model) for w in workers if w.model != model})
    if others:
        findings.append(Finding("fail", "workers",
                                f"workers at {settings.worker_endpoint} serve {', '.join(others)}"
                                f", not {model!r}",
                                "give serve the --model-name the workers serve"))
    serving = [w for w in workers if w.model == model]
    if serving:
        findings.append(Finding("ok", "workers", f"{model!r} is served by "
                                f"{_count(len(serving), 'worker')} at "
                                f"{_listing(serving)}"))
    blind = [w for w in serving if not w.total_kv_blocks]
    if blind:
        findings.append(Finding(
            "warn", "capacity",
            f"{len(blind)} of {len(serving)} workers publish no capacity card "
            f"(runtime_config.total_kv_blocks): instances "
            f"{', '.join(str(w.instance_id) for w in blind)}; the scheduler cannot count their "
            "KV capacity and admits to them as at a cold start",
            "run engines that publish total_kv_blocks in their model card (vLLM, SGLang and "
            "TensorRT-LLM do once their KV cache is allocated; the mocker with "
            "--num-gpu-blocks-override)"))
    elif serving:
        blocks = sorted({int(w.total_kv_blocks or 0) for w in serving})
        findings.append(Finding("ok", "capacity", f"every worker publishes a capacity card "
                                f"(total_kv_blocks {', '.join(str(b) for b in blocks)})"))
    return findings


def _check_exposure(settings: Settings, cards: Sequence[Registration]) -> list[Finding]:
    """Model cards the frontend could route to directly, around the router."""
    namespace = settings.router_namespace
    worker_namespace = settings.worker_endpoint.split(".")[0]
    if namespace == UNSCOPED_NAMESPACE:
        return [Finding("fail", "exposure",
                        f"the router serves in namespace {namespace!r}, which a frontend "
                        "cannot be scoped to: it also discovers the workers and routes to them "
                        "directly",
                        "serve the router in a namespace of its own (--router-endpoint "
                        "ta.router.generate) and start the frontend with --namespace ta")]
    beside = [c for c in cards
              if c.namespace == namespace and c.path != settings.router_endpoint]
    if beside:
        return [Finding("fail", "exposure",
                        f"{settings.model_name!r} is also served in the router's namespace "
                        f"{namespace!r} by {_listing(beside)}: a frontend scoped to "
                        f"{namespace!r} routes requests to them directly, around the scheduler",
                        f"start those workers with --endpoint dyn://{settings.worker_endpoint} "
                        f"(any namespace but {namespace!r})")]
    elsewhere = [c for c in cards if c.namespace not in (namespace, worker_namespace)]
    findings = [Finding("ok", "exposure", f"nothing else serves {settings.model_name!r} in the "
                        f"router's namespace {namespace!r}")]
    if elsewhere:
        findings.append(Finding("warn", "exposure",
                                f"{settings.model_name!r} is also served by {_listing(elsewhere)}"
                                ": a frontend not scoped to the router's namespace routes there "
                                "too",
                                f"start every frontend with --namespace {namespace}"))
    return findings


def check_frontend(settings: Settings, discovery: Discovery, frontend: FrontendView,
                   router_instance: int | None = None) -> list[Finding]:
    """Does the frontend list the model, and did every probe go through the router? The
    router's instances are those discovery lists at its endpoint, and ``router_instance``
    (its own /state says which it is), so that a discovery doctor cannot read does not
    make the router look like a bypass."""
    model = settings.model_name
    if frontend.error is not None:
        return [Finding("fail", "frontend", f"{frontend.url}: {frontend.error}",
                        "pass --frontend the base URL the clients use (http://HOST:PORT)")]
    if frontend.models is not None and model not in frontend.models:
        listed = ", ".join(repr(m) for m in frontend.models) or "no model"
        return [Finding("fail", "frontend", f"{frontend.url} lists {listed}, not {model!r}",
                        f"start the frontend with --namespace {settings.router_namespace} and "
                        "the same discovery settings as the router")]
    findings = [Finding("ok", "frontend", f"{frontend.url} lists {model!r}")]
    if frontend.probe_errors:
        findings.append(Finding("warn", "frontend",
                                f"{len(frontend.probe_errors)} of {frontend.probes} probes "
                                f"failed: {frontend.probe_errors[0]}",
                                "check the frontend's and the router's logs"))
    if not frontend.served_by:
        if frontend.probes:
            findings.append(Finding("warn", "frontend", "no probe reported the instance that "
                                    "served it (nvext.worker_id)", None))
        return findings
    routers = {c.instance_id for c in discovery.cards if c.path == settings.router_endpoint}
    if router_instance is not None:
        routers.add(router_instance)
    where = {c.instance_id: c.path for c in discovery.cards}
    around = [i for i in frontend.served_by if i not in routers]
    if not around:
        findings.append(Finding("ok", "frontend", f"all {len(frontend.served_by)} probes went "
                                "through the router"))
        return findings
    unknown = sorted({i for i in around if i not in where})
    if discovery.error is not None and len(unknown) == len(set(around)):
        # Nothing names the instances that served them: no verdict, and no wrong fix.
        findings.append(Finding(
            "warn", "frontend",
            f"{len(around)} of {len(frontend.served_by)} probes were served by instance "
            f"{', '.join(str(i) for i in unknown)}, which neither discovery (unreadable) nor "
            "the router's /state names: cannot tell whether they went through the router",
            "run doctor with the deployment's discovery settings (DYN_DISCOVERY_BACKEND, "
            "DYN_FILE_KV or ETCD_ENDPOINTS) and --state http://HOST:PORT/state of the router"))
        return findings
    names = sorted({where.get(i, f"instance {i}") for i in around})
    in_namespace = all(where.get(i, "").split(".")[0] == settings.router_namespace
                       for i in around)
    fix = (f"start those workers with --endpoint dyn://{settings.worker_endpoint}"
           if in_namespace else
           f"start the frontend with --namespace {settings.router_namespace} (exact match; "
           f"never {UNSCOPED_NAMESPACE!r}) so that it sees only the router")
    findings.append(Finding("fail", "frontend",
                            f"{len(around)} of {len(frontend.served_by)} probes bypassed the "
                            f"router: served by {', '.join(names)}", fix))
    return findings


def check_router(router: RouterView) -> list[Finding]:
    """What the router's counters say: live workers, session ids, session-finals."""
    if router.error is not None:
        return [Finding("fail", "sessions", f"{router.url}: {router.error}",
                        "pass --state the router's state URL (serve --state-port P: "
                        "http://127.0.0.1:P/state)")]
    findings = []
    if not router.live_workers:
        findings.append(Finding("fail", "router", "the router sees no live worker",
                                "start the workers at the --endpoint serve was given, with the "
                                "same discovery settings"))
    else:
        findings.append(Finding("ok", "router", f"the router sees "
                                f"{_count(len(router.live_workers), 'live worker')} and holds "
                                f"{_count(router.programs, 'program')}"))
    if router.prefill_only:
        findings.append(Finding(
            "warn", "disaggregated",
            f"{_count(len(router.prefill_only), 'worker')} only prefill (instances "
            f"{', '.join(map(str, router.prefill_only))}): the router sends them nothing, so "
            "the decode workers serve every request, prefill included",
            "start the workers aggregated behind this router (the scheduler places whole "
            "programs on one worker); a prefill worker holds KV the scheduler cannot use"))
    if router.other_routers is not None:
        findings.append(Finding("fail", "routers", router.other_routers, ONE_ROUTER_FIX))
    elif router.routers_unwatched is not None:
        findings.append(Finding("warn", "routers", "the router does not watch its endpoint "
                                f"for other routers: {router.routers_unwatched}",
                                "see the router's log (router.peer_check_failed)"))
    if router.block_size_mismatch is not None:
        findings.append(Finding("fail", "block-size", router.block_size_mismatch,
                                "restart serve once the workers are up: it reads the size "
                                "from their model cards at startup"))
    if router.card_mismatch is not None:
        findings.append(Finding("fail", "router-card", router.card_mismatch,
                                "restart serve once the workers are up (it copies their "
                                "parsers, template and context length into its own card at "
                                "startup), or pass --dyn-tool-call-parser, "
                                "--dyn-reasoning-parser or --custom-jinja-template"))
    total = router.recent_with_session + router.recent_without_session
    window = (f"the last {total} requests (window: {router.window_requests} requests, "
              f"{router.window_seconds:g} s)")
    if total == 0:
        findings.append(Finding("ok", "sessions", f"no requests in the router's recent window "
                                f"({router.window_requests} requests, "
                                f"{router.window_seconds:g} s)"))
    elif total >= MISSING_SESSIONS_MIN_REQUESTS and router.recent_with_session == 0:
        findings.append(Finding("fail", "sessions", f"none of {window} carried a "
                                "session id: every request bypasses the program table "
                                "(plain KV routing)", SESSION_HEADER_FIX))
    elif router.recent_without_session * 2 > total:
        findings.append(Finding("warn", "sessions", f"{router.recent_without_session} of {window} "
                                "carried no session id: they bypass the program table",
                                SESSION_HEADER_FIX))
    else:
        findings.append(Finding("ok", "sessions", f"{router.recent_with_session} of {window} "
                                "carried a session id"))
    if router.with_session and not router.session_finals:
        findings.append(Finding("warn", "session-final",
                                f"{router.with_session} requests carried a session id and no "
                                "session-final arrived: finished programs keep their capacity "
                                "until session_retention_seconds idle",
                                "send one request with X-Dynamo-Session-Final: true when an "
                                "agent is done"))
    else:
        findings.append(Finding("ok", "session-final",
                                f"{_count(router.session_finals, 'session-final')} arrived"))
    return findings


# ---- output ------------------------------------------------------------------------------------
def failed(findings: Sequence[Finding]) -> bool:
    return any(f.status == "fail" for f in findings)


def render_text(findings: Sequence[Finding]) -> str:
    """One line per finding (status, check, what was found), its fix indented below."""
    lines = []
    for f in findings:
        lines.append(f"{f.status.upper():<5} {f.check:<13} {f.found}")
        if f.fix and f.status != "ok":
            lines.append(f"{'':<5} {'':<13} fix: {f.fix}")
    counts = {s: sum(1 for f in findings if f.status == s) for s in ("ok", "warn", "fail")}
    lines.append(f"{counts['fail']} fail, {counts['warn']} warn, {counts['ok']} ok")
    return "\n".join(lines)


def render_json(findings: Sequence[Finding]) -> str:
    return json.dumps({"ok": not failed(findings),
                       "findings": [asdict(f) for f in findings]}, indent=1)
