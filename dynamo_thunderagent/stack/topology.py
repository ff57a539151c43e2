"""Where the stack's pieces live: loopback addresses, namespaces and endpoints.

A router component becomes the frontend's handler for the model by calling ``register_model``
on its own endpoint. The mocker workers also register the model, and the frontend would happily
spread requests over *both* worker sets, letting clients bypass the router. So in an arm with a
router the workers live in a separate namespace, ``<ns>-workers``, and the frontend is scoped
with ``--namespace <ns>`` (exact match) so that it only sees the router. Namespace ``dynamo`` is
the default and cannot be used for scoping: a frontend started with ``--namespace dynamo`` still
discovers every namespace.
"""

from __future__ import annotations

from dataclasses import dataclass

LOOPBACK = "127.0.0.1"
DEFAULT_NAMESPACE = "dynamo"
WORKER_NAMESPACE_SUFFIX = "workers"
WORKER_COMPONENT = "backend"
WORKER_ENDPOINT_NAME = "generate"


@dataclass(frozen=True)
class Topology:
    """The namespaces and endpoints of one stack, fixed by its arm's router (if any).

    ``router_namespace`` / ``router_component``: where the arm's router component serves;
    None for the arms whose routing happens inside the frontend.
    """

    router_namespace: str | None = None
    router_component: str | None = None

    @property
    def namespace(self) -> str:
        """Namespace the frontend serves (the router's namespace in the router arms)."""
        return self.router_namespace or DEFAULT_NAMESPACE

    @property
    def worker_namespace(self) -> str:
        if self.router_namespace is None:
            return DEFAULT_NAMESPACE
        return f"{self.router_namespace}-{WORKER_NAMESPACE_SUFFIX}"

    @property
    def worker_endpoint(self) -> str:
        """``ns.component.endpoint`` the mocker workers serve."""
        return f"{self.worker_namespace}.{WORKER_COMPONENT}.{WORKER_ENDPOINT_NAME}"

    @property
    def router_endpoint(self) -> str | None:
        """``ns.component.endpoint`` the router component serves, in the router arms."""
        if self.router_namespace is None or self.router_component is None:
            return None
        return f"{self.router_namespace}.{self.router_component}.{WORKER_ENDPOINT_NAME}"


def http_url(port: int, path: str = "") -> str:
    """``http://127.0.0.1:<port><path>``."""
    return f"http://{LOOPBACK}:{port}{path}"
