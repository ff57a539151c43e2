"""``dynamo-thunderagent serve``: run the router component against a Dynamo deployment.

Uses the Dynamo runtime settings from the environment (``DYN_DISCOVERY_BACKEND``,
``DYN_REQUEST_PLANE``, ``DYN_EVENT_PLANE``, ...), like every Dynamo process.
The workers must serve the model under ``--endpoint`` in a namespace the
frontend does not watch (``python -m dynamo.frontend --namespace <ours>``), so
that every request goes through this router.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from dynamo_thunderagent.catalog import PluginError, default_catalog, load_policy
from dynamo_thunderagent.config import PolicyError
from dynamo_thunderagent.dynamo.block_size import await_block_size, mismatch, report
from dynamo_thunderagent.dynamo.reload import check_policy, signature
from dynamo_thunderagent.dynamo.router_card import (
    CardSettings,
    cards_unless_stopped,
    runtime_config,
    template_file,
)
from dynamo_thunderagent.dynamo.router_card import choose as choose_card
from dynamo_thunderagent.dynamo.router_card import mismatch as card_mismatch
from dynamo_thunderagent.dynamo.router_card import report as card_report
from dynamo_thunderagent.flags import finite_float
from dynamo_thunderagent.program_log import configure_logging

log = structlog.get_logger("dynamo_thunderagent.serve")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--router-policy-config", required=True,
                        help="router-policy YAML (same schema as the Dynamo frontend's)")
    parser.add_argument("--endpoint", required=True,
                        help="namespace.component.endpoint the workers serve "
                             "(dyn:// prefix optional)")
    parser.add_argument("--router-endpoint", default=None,
                        help="namespace.component.endpoint this router serves; default "
                             "$DYN_NAMESPACE.router.generate, namespace 'thunderagent' if "
                             "DYN_NAMESPACE is unset. Start the frontend with --namespace "
                             "<that namespace> so that it sees only this router")
    parser.add_argument("--model-name", required=True, help="served model name")
    parser.add_argument("--model-path", required=True,
                        help="model folder or hub id (tokenizer and chat template)")
    parser.add_argument("--block-size", type=int, default=None,
                        help="tokens a KV block, as the engines use, where no worker's model "
                             "card says it yet at startup (a card there that says otherwise "
                             "wins); default: wait up to 30 s for a card, else 16")
    parser.add_argument("--dyn-tool-call-parser", default=None, metavar="NAME",
                        help="the tool-call parser the frontend applies to the engines' output, "
                             "as the workers' own flag of that name; default: what the workers' "
                             "model cards say (README, 'Running it in front of an existing Dynamo "
                             "deployment')")
    parser.add_argument("--dyn-reasoning-parser", default=None, metavar="NAME",
                        help="the reasoning parser the frontend applies, as the workers' own "
                             "flag of that name; default: what the workers' model cards say")
    parser.add_argument("--custom-jinja-template", default=None, metavar="PATH",
                        help="the chat template the frontend renders prompts with, as the "
                             "workers' own flag of that name; default: the workers' custom "
                             "template, fetched from where their model cards say, else the "
                             "model's own")
    parser.add_argument("--refresh-interval", type=finite_float, default=1.0,
                        help="seconds between reads of worker liveness and capacity")
    parser.add_argument("--state-host", default="127.0.0.1",
                        help="host of the state endpoint (GET /state, /health, /metrics)")
    parser.add_argument("--state-port", type=int, default=0,
                        help="port of the state endpoint; 0 disables it")
    parser.add_argument("--events-port", type=int, default=0,
                        help="publish program lifecycle notifications (paused, resuming, "
                             "ended, expired) on a ZeroMQ PUB socket at "
                             "tcp://<state-host>:PORT (dynamo_thunderagent.events); 0: off")
    parser.add_argument("--watch-policy", action="store_true",
                        help="reload --router-policy-config when the file changes (SIGHUP "
                             "always reloads it); see docs/operate.md")


# The router's namespace when neither --router-endpoint nor $DYN_NAMESPACE names one.
DEFAULT_ROUTER_NAMESPACE = "thunderagent"


def endpoint_path(value: str) -> str:
    """``ns.component.endpoint`` from a flag (``dyn://`` optional); ValueError if malformed."""
    path = value.removeprefix("dyn://")
    if path.count(".") != 2 or any(not part for part in path.split(".")):
        raise ValueError(f"endpoint {value!r} must look like namespace.component.endpoint")
    return path


def default_router_endpoint(env: Mapping[str, str]) -> str:
    """Where the router serves without --router-endpoint: $DYN_NAMESPACE.router.generate."""
    return f"{env.get('DYN_NAMESPACE') or DEFAULT_ROUTER_NAMESPACE}.router.generate"


def _endpoint_path(value: str) -> str:
    try:
        return endpoint_path(value)
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None


def exposed_worker_path(worker_path: str, router_path: str) -> str | None:
    """Where a worker that serves the frontend directly would register: the workers'
    component and endpoint in the router's namespace (None if that is the router's own)."""
    _, component, endpoint = worker_path.split(".")
    path = f"{router_path.split('.')[0]}.{component}.{endpoint}"
    return None if path == router_path else path


def argument_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with serve's numeric flags (None: nothing), checked before anything
    starts: a port out of range would fail only after the runtime connects (or, for the
    events socket, bind another port), and a zero interval would spin a core."""
    if args.block_size is not None and args.block_size < 1:
        return f"--block-size must be a positive number of tokens, got {args.block_size}"
    for flag, port in (("--state-port", args.state_port), ("--events-port", args.events_port)):
        if not 0 <= port <= 65535:
            return f"{flag} must be a TCP port, 1 to 65535 (0: off), got {port}"
    if args.state_port and args.state_port == args.events_port:
        return (f"--state-port and --events-port must differ (both {args.state_port}): "
                "each binds its own socket on --state-host")
    template = args.custom_jinja_template
    if template is not None and not os.path.isfile(template):
        return f"--custom-jinja-template must name a readable file, got {template!r}"
    interval = args.refresh_interval
    if not (math.isfinite(interval) and 0.01 <= interval <= 3600):
        return f"--refresh-interval must be 0.01 to 3600 seconds, got {interval}"
    return None


class ServeError(Exception):
    """Serving cannot start (a port taken, say); the message says what and why."""


def run_serve(args: argparse.Namespace) -> int:
    problem = argument_problem(args)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    configure_logging()  # JSON lines under DYN_LOGGING_JSONL, as Dynamo's processes
    # From here on a SIGHUP is kept for the reloader (by default it would end the process,
    # as for a script that edits the file and signals while the router restarts), and an
    # edit to the file counts as a change for --watch-policy.
    hangups = _keep_hangups()
    seen = signature(str(args.router_policy_config))
    # Validate everything before touching the runtime: a bad policy (or a plugin that
    # cannot load) stops startup with the same message `validate` prints.
    try:
        catalog = default_catalog()
        policy = load_policy(args.router_policy_config, catalog)
    except (PolicyError, PluginError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        check_policy(policy)
    except PolicyError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    worker_path = _endpoint_path(args.endpoint)
    router_path = _endpoint_path(args.router_endpoint or default_router_endpoint(os.environ))
    if router_path.split(".")[0] == worker_path.split(".")[0]:
        print("error: the router and the workers must be in different namespaces, or the "
              "frontend would route around the router", file=sys.stderr)
        return 2
    if router_path.split(".")[0] == "dynamo":
        log.warning("router.namespace_not_scoped", namespace="dynamo",
                    hint="a frontend cannot scope discovery to namespace 'dynamo' and will also "
                         "see the workers; serve the router in another namespace")
    try:
        import uvloop

        uvloop.run(_serve(args, policy, catalog, worker_path, router_path,
                          _Startup(seen, hangups)))
    except KeyboardInterrupt:
        pass
    except ServeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


def _keep_hangups() -> list[int]:
    """Keep SIGHUPs (their signal numbers, appended) until the reloader takes them."""
    kept: list[int] = []
    signal.signal(signal.SIGHUP, lambda signum, _frame: kept.append(signum))
    return kept


@dataclass(frozen=True)
class _Startup:
    """What serve saw before the reloader existed: the policy file's signature when it
    was read, and the SIGHUPs received since."""

    seen: tuple[int, int, int] | None
    hangups: list[int]


async def _serve(args: argparse.Namespace, policy: Any, catalog: Any, worker_path: str,
                 router_path: str, startup: _Startup | None = None) -> None:
    from dynamo.llm import (
        FpmEventSubscriber,
        KvRouter,
        KvRouterConfig,
        ModelInput,
        ModelRuntimeConfig,
        ModelType,
        WorkerType,
        register_model,
    )
    from dynamo.runtime import DistributedRuntime

    from dynamo_thunderagent.dynamo.metrics import RouterMetrics
    from dynamo_thunderagent.dynamo.router import ThunderAgentRouter
    from dynamo_thunderagent.dynamo.state_server import StateServer, on_loop

    loop = asyncio.get_running_loop()
    runtime = DistributedRuntime(
        loop,
        os.environ.get("DYN_DISCOVERY_BACKEND", "etcd"),
        os.environ.get("DYN_REQUEST_PLANE", "tcp"),
        event_plane=os.environ.get("DYN_EVENT_PLANE"),
    )
    workers = runtime.endpoint(worker_path)
    client = await workers.client()
    cards = FpmEventSubscriber(workers)
    cards.start_tracking()
    block_size, warning = await await_block_size(cards.get_model_cards, args.block_size)
    if warning is not None:
        log.warning("router.block_size", block_size=block_size, reason=warning)
    kv_router = KvRouter(workers, block_size, KvRouterConfig())
    # The workers' component/endpoint in the router's namespace: a worker started there by
    # mistake is reachable by the frontend directly; the router warns while any is.
    exposed_path = exposed_worker_path(worker_path, router_path)
    exposed = None if exposed_path is None else await runtime.endpoint(exposed_path).client()

    classifier = catalog.build_classifier(policy.classifier)
    selector = catalog.build_selector(policy.stages["aggregated"])
    router = ThunderAgentRouter(classifier, selector, kv_router, client, cards,
                                block_size=block_size,
                                refresh_interval=args.refresh_interval,
                                exposed=exposed, exposed_endpoint=exposed_path)
    metrics = RouterMetrics(router, namespace=router_path.split(".")[0], model=args.model_name)
    state_server = None
    try:
        if args.state_port:
            state_server = StateServer(loop, router.state, metrics.exposition,
                                       args.state_host, args.state_port)
        operate = _operate(args, policy, catalog, classifier, router, loop, startup)
    except OSError as error:  # a port taken, a host not on this machine
        if state_server is not None:
            state_server.close()
        cards.shutdown()
        runtime.shutdown()
        raise ServeError(f"cannot listen on {args.state_host} (--state-port "
                         f"{args.state_port}, --events-port {args.events_port}): "
                         f"{error}") from None
    if state_server is not None:
        state_server.start()
    router.start()

    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    endpoint = runtime.endpoint(router_path)
    # Our metrics join the component's own on its system server (DYN_SYSTEM_PORT), as
    # Dynamo's backends add theirs (docs/metrics.md).
    endpoint.metrics.register_prometheus_expfmt_callback(
        lambda: _exposition(lambda: on_loop(loop, metrics.exposition)))
    # The router's card carries the workers' settings the frontend acts on (parsers, context
    # length): wait for a worker's card, as for the block size, before registering it.
    seen = await cards_unless_stopped(cards.get_model_cards, stop)
    card, card_warning = choose_card(seen, tool_call_parser=args.dyn_tool_call_parser,
                                     reasoning_parser=args.dyn_reasoning_parser,
                                     chat_template=args.custom_jinja_template)
    template_dir = tempfile.TemporaryDirectory(prefix="thunderagent-card-")
    card, template_path = template_file(card, args.custom_jinja_template,
                                         Path(template_dir.name))
    if card_warning is not None:
        log.warning("router.card", reason=card_warning, **card_report(card, seen))
    await register_model(
        ModelInput.Tokens,
        ModelType.Chat | ModelType.Completions,
        endpoint,
        args.model_path,
        args.model_name,
        worker_type=WorkerType.Aggregated,
        kv_cache_block_size=block_size,
        runtime_config=runtime_config(ModelRuntimeConfig(), card),
        custom_template_path=template_path,
    )
    serving = asyncio.ensure_future(endpoint.serve_endpoint(router.generate))
    instance_id = _instance_id(endpoint)
    keeping = _keep_registration(instance_id, router)
    serving.add_done_callback(lambda _: keeping())  # the endpoint ended: it deregistered
    router.state_extensions["kv_router"] = lambda: report(block_size,
                                                          router.workers.stated_block_sizes)
    router.state_extensions["router_card"] = lambda: card_report(card,
                                                                 router.workers.stated_cards)
    watching = [loop.create_task(_watch_block_size(router.workers, block_size)),
                loop.create_task(_watch_card(router.workers, card)),
                loop.create_task(_watch_peers(runtime, instance_id, router_path, router))]
    log.info("router.serving", endpoint=router_path, workers=worker_path,
             model=args.model_name, policy=policy.source,
             classifier=policy.classifier.type, state_port=args.state_port or None)
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait({serving, stopped}, return_when=asyncio.FIRST_COMPLETED)
    log.info("router.stopping")
    keeping()  # before the runtime deregisters: a router that leaves stays gone
    for task in watching:
        task.cancel()
    await router.stop()
    operate.close()
    if state_server is not None:
        await asyncio.to_thread(state_server.close)
    cards.shutdown()
    runtime.shutdown()
    template_dir.cleanup()
    serving.cancel()
    if serving.done() and not serving.cancelled() and serving.exception() is not None:
        raise serving.exception()  # type: ignore[misc]


async def _watch_block_size(workers: Any, kv_router_block_size: int,
                            every: float = 5.0) -> None:
    """Log, once per set of sizes, when the workers' cards (as the router's worker watch,
    ``workers``, last read them) come to state another KV block size than the KV router
    was built with (:mod:`dynamo_thunderagent.dynamo.block_size`); /state ``kv_router``
    shows it all along."""
    warned: set[frozenset[int]] = set()
    while True:
        sizes = set(workers.stated_block_sizes)
        problem = mismatch(kv_router_block_size, sizes)
        if problem is not None and frozenset(sizes) not in warned:
            warned.add(frozenset(sizes))
            log.warning("router.block_size_mismatch", kv_router_block_size=kv_router_block_size,
                        workers_block_sizes=sorted(sizes), reason=problem)
        await asyncio.sleep(every)


async def _watch_card(workers: Any, registered: CardSettings, every: float = 5.0) -> None:
    """Log, once per problem, when the workers' cards (as the worker watch last read them)
    come to state other settings than the router's card (/state ``router_card``)."""
    warned: set[str] = set()
    while True:
        problem = card_mismatch(registered, workers.stated_cards)
        if problem is not None and problem not in warned:
            warned.add(problem)
            log.warning("router.card_mismatch", reason=problem)
        await asyncio.sleep(every)


def _instance_id(endpoint: Any) -> int | None:
    """This router's instance id, as discovery lists it (the endpoint's connection id);
    None, said once, where the binding does not tell it."""
    try:
        return int(endpoint.connection_id())
    except Exception as error:  # a binding without it
        log.warning("router.instance_id_unreadable", error=f"{type(error).__name__}: {error}")
        return None


async def _watch_peers(runtime: Any, own: int | None, router_path: str, router: Any) -> None:
    """Watch for other routers serving this router's endpoint
    (:mod:`dynamo_thunderagent.dynamo.peers`; /state ``routers``); without its own
    instance id (``own``) it counts instances instead."""
    from dynamo_thunderagent.dynamo.peers import PeerWatch, watch_peers

    watch = PeerWatch(router_path, own)
    router.state_extensions["routers"] = watch.state
    try:
        client = await runtime.endpoint(router_path).client()
    except Exception as error:  # serve on without the watch; /state says it is off
        unwatched = {"endpoint": router_path, "unwatched": repr(error)}
        log.warning("router.peer_check_failed", **unwatched)
        router.state_extensions["routers"] = lambda: unwatched
        return
    await watch_peers(client, watch)


def _keep_registration(instance_id: int | None, router: Any,
                       interval: float = 1.0) -> Callable[[], None]:
    """With file discovery, write the router's registration back if the store expires it
    (:mod:`dynamo_thunderagent.dynamo.registration`; /state ``registration``). Returns
    what stops that. The router serves without it where its instance id is unknown."""
    from dynamo_thunderagent.dynamo.registration import RegistrationKeeper, file_store, keep

    store = file_store(os.environ)
    if store is None:
        return lambda: None
    if not store.is_dir():
        log.warning("registration.unwatched", store=str(store),
                    reason="the file store is not there; an expired registration will not "
                           "be written back")
        return lambda: None
    if instance_id is None:  # the binding did not tell it: serve on, unkept
        log.warning("registration.unwatched", store=str(store),
                    reason="the endpoint's instance id is unreadable "
                           "(router.instance_id_unreadable says why)")
        return lambda: None
    keeper = RegistrationKeeper(store, instance_id)
    router.state_extensions["registration"] = keeper.state
    task = asyncio.get_running_loop().create_task(keep(keeper, interval))

    def stop() -> None:
        keeper.close()  # waits for a write under way off the loop; none starts after it
        task.cancel()
    return stop


def _exposition(read: Any) -> str:
    """Our metrics as text for the system server; nothing (rather than an error in its
    /metrics) if the event loop is too busy to answer in time."""
    try:
        return bytes(read()).decode()
    except TimeoutError:
        log.warning("metrics.scrape_timeout", hint="the router's event loop did not answer")
        return ""


class _Operate:
    """What ``serve`` adds for operators: policy reloads and lifecycle notifications."""

    def __init__(self) -> None:
        self.tasks: list[asyncio.Task[None]] = []
        self.publisher: Any = None

    def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        if self.publisher is not None:
            self.publisher.close()


def _operate(args: argparse.Namespace, policy: Any, catalog: Any, classifier: Any,
             router: Any, loop: asyncio.AbstractEventLoop,
             startup: _Startup | None = None) -> _Operate:
    """Reload the policy on SIGHUP (and on change with --watch-policy); publish lifecycle
    events with --events-port; both show in /state (``policy``, ``lifecycle``)."""
    from dynamo_thunderagent.dynamo.notify import (
        EventPublisher,
        LifecycleNotifier,
        table_worker_of,
    )
    from dynamo_thunderagent.dynamo.reload import PolicyReloader

    operate = _Operate()
    reloader = PolicyReloader(args.router_policy_config, catalog, policy, classifier,
                              seen=startup.seen if startup is not None else None)
    loop.add_signal_handler(signal.SIGHUP, reloader.guarded_reload)
    if startup is not None and startup.hangups:  # sent while the router was starting
        reloader.guarded_reload(trigger="SIGHUP during startup")
    router.state_extensions["policy"] = reloader.state
    if args.watch_policy:
        operate.tasks.append(loop.create_task(reloader.watch()))
    if args.events_port:
        operate.publisher = EventPublisher(args.state_host, args.events_port)
        log.info("lifecycle.publishing", url=operate.publisher.url)
    scheduler = getattr(classifier, "scheduler", None)
    programs = {} if scheduler is None else scheduler.table.programs
    notifier = LifecycleNotifier(table_worker_of(programs), operate.publisher)
    listeners = getattr(classifier, "decision_listeners", None)
    if listeners is None:  # a plugin type that does not call RequestClassifier.__init__
        log.warning("lifecycle.unavailable", classifier=type(classifier).__name__,
                    reason="the classifier has no decision_listeners; no lifecycle events")
    else:
        listeners.append(notifier)
    router.state_extensions["lifecycle"] = notifier.state
    return operate
