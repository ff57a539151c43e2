"""``dynamo-thunderagent doctor``: gather the facts about a running deployment, print findings.

Reads discovery with the same settings as ``serve`` (``DYN_DISCOVERY_BACKEND``,
``DYN_FILE_KV``, ``DYN_NAMESPACE``, the ``--endpoint`` / ``--router-endpoint`` /
``--model-name`` flags), sends the frontend a few probes, and reads the router's ``/state``.
The verdicts are :func:`dynamo_thunderagent.doctor.diagnose`'s.

A probe is a one-token session-final request for a session id starting with
``PROBE_SESSION_PREFIX``: the router answers it itself, without touching a worker, and counts
it apart (``doctor_probes``) so that doctor does not change the figures it reports. A worker
that gets a probe directly (the misconfiguration) answers it like any request.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import sys
import tempfile
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dynamo_thunderagent.doctor import (
    Discovery,
    FrontendView,
    Registration,
    RouterView,
    Settings,
    diagnose,
    failed,
    render_json,
    render_text,
    router_view,
)
from dynamo_thunderagent.dynamo.stats import PROBE_SESSION_PREFIX
from dynamo_thunderagent.dynamo.translate import FINAL_HEADER, SESSION_HEADER
from dynamo_thunderagent.flags import finite_float
from dynamo_thunderagent.urls import http_url, state_url

MAX_PROBES = 64


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--endpoint", required=True,
                        help="namespace.component.endpoint the workers serve (as for serve)")
    parser.add_argument("--router-endpoint", default=None,
                        help="namespace.component.endpoint the router serves (as for serve; "
                             "default $DYN_NAMESPACE.router.generate, 'thunderagent' if unset)")
    parser.add_argument("--model-name", required=True, help="served model name (as for serve)")
    parser.add_argument("--frontend", default=None,
                        help="base URL of the Dynamo frontend, e.g. http://127.0.0.1:8000")
    parser.add_argument("--state", default=None,
                        help="the router's state URL (serve --state-port P: "
                             "http://127.0.0.1:P/state)")
    parser.add_argument("--probes", type=int, default=8,
                        help=f"session-final probes sent through the frontend (0 to {MAX_PROBES};"
                             " 0: only list its models)")
    parser.add_argument("--timeout", type=finite_float, default=10.0,
                        help="seconds to wait for each HTTP answer")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")


def run_doctor(args: argparse.Namespace) -> int:
    """Exit status: 0 when no finding fails, 1 when one does, 2 for bad arguments."""
    from dynamo_thunderagent.dynamo.serve import default_router_endpoint, endpoint_path

    try:
        settings = Settings(
            worker_endpoint=endpoint_path(args.endpoint),
            router_endpoint=endpoint_path(args.router_endpoint
                                          or default_router_endpoint(os.environ)),
            model_name=args.model_name,
        )
        if not 0 <= args.probes <= MAX_PROBES:
            raise ValueError(f"--probes must be between 0 and {MAX_PROBES}, got {args.probes}")
        if args.timeout <= 0:
            raise ValueError(f"--timeout must be > 0 seconds, got {args.timeout}")
        # A bare host:port is taken as top takes it (http://, and /state for the router).
        state = None if args.state is None else state_url(args.state)
        front = None if args.frontend is None else http_url(args.frontend, what="--frontend")
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    # The router's counters first: the probes below are counted apart, but read them before.
    router = None if state is None else read_router(state, args.timeout)
    discovery = read_discovery(os.environ)
    frontend = (None if front is None else
                read_frontend(front, settings.model_name, args.probes, args.timeout))
    findings = diagnose(settings, discovery, frontend, router)
    print(render_json(findings) if args.json else render_text(findings))
    return 1 if failed(findings) else 0


# ---- discovery ---------------------------------------------------------------------------------
def file_store(env: Mapping[str, str]) -> Path:
    """Dynamo's file discovery root: $DYN_FILE_KV, else $TMPDIR/dynamo_store_kv."""
    return Path(env.get("DYN_FILE_KV") or Path(tempfile.gettempdir()) / "dynamo_store_kv")


def read_discovery(env: Mapping[str, str]) -> Discovery:
    """Every model card in discovery: the file store's, or etcd's (``ETCD_ENDPOINTS``, the
    first one; Dynamo's default backend). Other backends are reported as not listed."""
    backend = env.get("DYN_DISCOVERY_BACKEND", "etcd")
    if backend == "etcd":
        return read_etcd(env)
    if backend != "file":
        return Discovery(backend, backend, listable=False,
                         error="doctor lists registrations with DYN_DISCOVERY_BACKEND=file or "
                               "etcd only")
    root = file_store(env)
    cards_dir = root / "v1" / "mdc"
    if not cards_dir.is_dir():
        return Discovery(backend, str(root), error=f"no model cards under {cards_dir}: nothing "
                         "registered, or another DYN_FILE_KV than the deployment's")
    cards = []
    for entry in sorted(cards_dir.iterdir()):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            cards.append(registration(json.loads(entry.read_text())))
    return Discovery(backend, str(root), tuple(cards))


def read_etcd(env: Mapping[str, str]) -> Discovery:
    """The model cards in etcd, read through its JSON gateway like the local stack reads them."""
    from dynamo_thunderagent.stack.discovery import MODEL_CARD_PREFIX, etcd_values

    url = (env.get("ETCD_ENDPOINTS") or "http://127.0.0.1:2379").split(",")[0].strip()
    if "://" not in url:
        url = f"http://{url}"
    try:
        texts = etcd_values(url, MODEL_CARD_PREFIX + "/")
    except (OSError, ValueError) as error:
        return Discovery("etcd", url, error=f"etcd at {url} did not answer ({_why(error)}): "
                         "is ETCD_ENDPOINTS the deployment's?")
    cards = []
    for text in texts:
        with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):
            cards.append(registration(json.loads(text)))
    if not cards:
        return Discovery("etcd", url, error=f"no model cards in etcd at {url}: nothing "
                         "registered, or another etcd than the deployment's")
    return Discovery("etcd", url, tuple(cards))


def registration(record: dict[str, Any]) -> Registration:
    """A discovery model-card record as a :class:`Registration` (KeyError if not one)."""
    card = record.get("card_json") or {}
    runtime = card.get("runtime_config") or {}
    blocks = runtime.get("total_kv_blocks")
    return Registration(
        namespace=str(record["namespace"]), component=str(record["component"]),
        endpoint=str(record["endpoint"]), instance_id=int(record["instance_id"]),
        model=card.get("display_name"),
        total_kv_blocks=int(blocks) if blocks else None,
    )


# ---- the frontend and the router ------------------------------------------------------------
def _get_json(url: str, timeout: float, body: dict[str, Any] | None = None,
              headers: dict[str, str] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={
        "Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def _why(error: Exception) -> str:
    if isinstance(error, urllib.error.HTTPError):
        detail = error.read().decode(errors="replace")[:300]
        return f"HTTP {error.code}: {detail}"
    if isinstance(error, urllib.error.URLError):
        return f"unreachable ({error.reason})"
    return f"{type(error).__name__}: {error}"


def read_frontend(url: str, model: str, probes: int, timeout: float) -> FrontendView:
    """The models the frontend lists and, for each probe, the instance that served it."""
    base = url.rstrip("/").removesuffix("/v1")
    try:
        listed = _get_json(f"{base}/v1/models", timeout)
        models = tuple(str(m["id"]) for m in listed.get("data", []))
    except (OSError, ValueError, KeyError, TypeError, AttributeError,
            http.client.HTTPException) as error:
        return FrontendView(base, error=f"GET /v1/models failed: {_why(error)}")
    if model not in models:
        return FrontendView(base, models=models)
    served, errors = [], []
    for _ in range(probes):
        body = {"model": model, "max_tokens": 1,
                "messages": [{"role": "user", "content": "doctor probe"}],
                "nvext": {"extra_fields": ["worker_id"]}}
        headers = {SESSION_HEADER: PROBE_SESSION_PREFIX + uuid.uuid4().hex,
                   FINAL_HEADER: "true"}
        try:
            answer = _get_json(f"{base}/v1/chat/completions", timeout, body, headers)
        except (OSError, ValueError, http.client.HTTPException) as error:
            errors.append(_why(error))
            continue
        worker = ((answer.get("nvext") or {}).get("worker_id") or {}).get("decode_worker_id")
        if worker is not None:
            served.append(int(worker))
    return FrontendView(base, models=models, served_by=tuple(served), probes=probes,
                        probe_errors=tuple(errors))


def read_router(url: str, timeout: float) -> RouterView:
    try:
        state = _get_json(url, timeout)
        if not isinstance(state, dict):
            raise ValueError(f"{url} did not answer a JSON object")
        return router_view(url, state)
    except ValueError as error:
        return RouterView(url, error=str(error))
    except (OSError, http.client.HTTPException) as error:
        return RouterView(url, error=_why(error))
