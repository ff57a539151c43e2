"""doctor's shell: reading the file-discovery store, probing a frontend, reading /state, exit
codes; against a file store written here and a loopback HTTP fake (no Dynamo processes)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from dynamo_thunderagent.cli import main
from dynamo_thunderagent.dynamo.doctor import (
    file_store,
    read_discovery,
    read_frontend,
    read_router,
)
from dynamo_thunderagent.dynamo.stats import PROBE_SESSION_PREFIX


def write_card(kv: Path, namespace: str, component: str, instance: int, model: str = "tiny",
               blocks: int | None = 256) -> None:
    cards = kv / "v1" / "mdc"
    cards.mkdir(parents=True, exist_ok=True)
    record = {"type": "Model", "namespace": namespace, "component": component,
              "endpoint": "generate", "instance_id": instance,
              "card_json": {"display_name": model, "runtime_config": {"total_kv_blocks": blocks}}}
    (cards / f"{namespace}%2F{component}%2Fgenerate%2F{instance:x}").write_text(json.dumps(record))


class FakeDeployment:
    """A loopback HTTP fake of a frontend (models, chat) and a router (/state)."""

    def __init__(self) -> None:
        self.models = ["tiny"]
        self.served_by = [1]  # instance ids reported for successive probes, cycled
        self.chat_status = 200
        self.state: Any = {
            "router": {"recent_with_session": 30, "recent_without_session": 0,
                       "with_session": 30, "session_final": 3, "doctor_probes": 0,
                       "recent_window": {"requests": 100, "seconds": 60.0}},
            "scheduler": {"programs": {}}, "live_workers": [11]}
        self.probe_headers: list[Any] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/v1/models":
                    self._send(200, {"data": [{"id": m} for m in fake.models]})
                elif self.path == "/state":
                    self._send(200, fake.state)
                else:
                    self._send(404, {"error": "no"})

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                fake.probe_headers.append(self.headers)  # case-insensitive
                if fake.chat_status != 200:
                    self._send(fake.chat_status, {"error": "engine down"})
                    return
                worker = fake.served_by[(len(fake.probe_headers) - 1) % len(fake.served_by)]
                self._send(200, {"choices": [], "nvext": {"worker_id": {
                    "prefill_worker_id": worker, "decode_worker_id": worker}}})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,),
                                       daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake() -> Iterator[FakeDeployment]:
    deployment = FakeDeployment()
    yield deployment
    deployment.close()


@pytest.fixture
def kv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    store = tmp_path / "kv"
    write_card(store, "ta", "router", 1, blocks=None)
    write_card(store, "ta-workers", "backend", 11)
    monkeypatch.setenv("DYN_DISCOVERY_BACKEND", "file")
    monkeypatch.setenv("DYN_FILE_KV", str(store))
    monkeypatch.delenv("DYN_NAMESPACE", raising=False)
    return store


def doctor(fake: FakeDeployment, *extra: str) -> list[str]:
    return ["doctor", "--endpoint", "ta-workers.backend.generate", "--router-endpoint",
            "ta.router.generate", "--model-name", "tiny", "--frontend", fake.url,
            "--state", f"{fake.url}/state", "--probes", "4", *extra]


def test_a_healthy_deployment_exits_0(kv: Path, fake: FakeDeployment,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(doctor(fake)) == 0
    out = capsys.readouterr().out
    assert "0 fail, 0 warn" in out and "all 4 probes went through the router" in out
    # Probes are session-finals the router recognizes as doctor's.
    assert len(fake.probe_headers) == 4
    assert all(h["X-Dynamo-Session-ID"].startswith(PROBE_SESSION_PREFIX)
               and h["X-Dynamo-Session-Final"] == "true" for h in fake.probe_headers)


def test_probes_served_by_a_worker_exit_1_with_json_findings(
        kv: Path, fake: FakeDeployment, capsys: pytest.CaptureFixture[str]) -> None:
    fake.served_by = [1, 11]
    assert main(doctor(fake, "--json")) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["ok"] is False
    [bypass] = [f for f in document["findings"] if f["status"] == "fail"]
    assert bypass["check"] == "frontend" and "ta-workers.backend.generate" in bypass["found"]


def test_bad_arguments_exit_2_and_say_what_is_allowed(
        kv: Path, fake: FakeDeployment, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(doctor(fake, "--probes", "1000")) == 2
    assert "--probes must be between 0 and 64, got 1000" in capsys.readouterr().err
    assert main(doctor(fake, "--timeout", "0")) == 2
    assert "--timeout must be > 0" in capsys.readouterr().err
    argv = doctor(fake)
    argv[argv.index("ta.router.generate")] = "ta.router"
    assert main(argv) == 2
    assert "must look like namespace.component.endpoint" in capsys.readouterr().err


def test_urls_are_taken_as_top_takes_them(kv: Path, fake: FakeDeployment,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    # A bare host:port (what top accepts) for --state and --frontend: before, doctor failed
    # both as "unreachable (unknown url type)"; a malformed one is a bad argument.
    argv = doctor(fake)
    bare = fake.url.removeprefix("http://")
    argv[argv.index(fake.url)] = bare
    argv[argv.index(f"{fake.url}/state")] = bare
    assert main(argv) == 0, capsys.readouterr().out
    assert main(doctor(fake, "--frontend", "localhost:abc")) == 2
    assert "--frontend 'localhost:abc' is not a URL" in capsys.readouterr().err


def test_the_router_endpoint_defaults_like_serves(kv: Path, fake: FakeDeployment,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("DYN_NAMESPACE", "ta")
    argv = doctor(fake)
    del argv[3:5]  # no --router-endpoint: $DYN_NAMESPACE.router.generate
    assert main(argv) == 0
    assert "the router serves 'tiny' at ta.router.generate" in capsys.readouterr().out


def test_discovery_reads_the_file_store_and_skips_unreadable_cards(kv: Path) -> None:
    (kv / "v1" / "mdc" / "garbage").write_text("{not json")
    (kv / "v1" / "mdc" / "other").write_text(json.dumps({"type": "Model"}))
    discovery = read_discovery({"DYN_DISCOVERY_BACKEND": "file", "DYN_FILE_KV": str(kv)})
    assert discovery.error is None
    assert sorted((c.path, c.instance_id, c.total_kv_blocks) for c in discovery.cards) == [
        ("ta-workers.backend.generate", 11, 256), ("ta.router.generate", 1, None)]


def test_discovery_errors_name_the_store_or_the_backend(tmp_path: Path) -> None:
    missing = read_discovery({"DYN_DISCOVERY_BACKEND": "file", "DYN_FILE_KV": str(tmp_path)})
    assert missing.error is not None and "no model cards under" in missing.error
    etcd = read_discovery({"ETCD_ENDPOINTS": "http://127.0.0.1:9"})  # nothing listens there
    assert etcd.backend == "etcd" and etcd.error is not None
    assert "etcd at http://127.0.0.1:9 did not answer" in etcd.error
    kubernetes = read_discovery({"DYN_DISCOVERY_BACKEND": "kubernetes"})
    assert kubernetes.backend == "kubernetes" and not kubernetes.listable
    assert file_store({"TMPDIR": "/x"}).name == "dynamo_store_kv"


def test_an_unreachable_frontend_and_router_are_reported(tmp_path: Path) -> None:
    port = 9  # discard: nothing listens on it here
    frontend = read_frontend(f"http://127.0.0.1:{port}", "tiny", 2, 2.0)
    assert frontend.error is not None and "GET /v1/models failed: unreachable" in frontend.error
    router = read_router(f"http://127.0.0.1:{port}/state", 2.0)
    assert router.error is not None and "unreachable" in router.error


def test_a_port_that_does_not_speak_http_is_reported_not_raised() -> None:
    # Before: http.client's BadStatusLine escaped read_router and read_frontend.
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]

        def answer_garbage() -> None:
            for _ in range(2):
                connection, _ = server.accept()
                with connection:
                    connection.recv(4096)
                    connection.sendall(b"garbage\r\n\r\n")

        thread = threading.Thread(target=answer_garbage, daemon=True)
        thread.start()
        router = read_router(f"http://127.0.0.1:{port}/state", 5.0)
        frontend = read_frontend(f"http://127.0.0.1:{port}", "tiny", 1, 5.0)
        thread.join(5)
    assert router.error is not None and "BadStatusLine" in router.error
    assert frontend.error is not None and "BadStatusLine" in frontend.error


def test_a_frontend_without_the_model_is_not_probed(fake: FakeDeployment) -> None:
    fake.models = ["big"]
    view = read_frontend(fake.url + "/v1", "tiny", 4, 5.0)
    assert view.models == ("big",) and view.probes == 0 and fake.probe_headers == []


def test_a_models_list_of_the_wrong_shape_is_a_frontend_error(fake: FakeDeployment) -> None:
    fake.models = []
    view = read_frontend(fake.url, "tiny", 2, 5.0)
    assert view.models == () and view.error is None  # listed nothing: the check says so
    fake.server.RequestHandlerClass.do_GET = (  # type: ignore[attr-defined]
        lambda handler: handler._send(200, {"data": [{"name": "tiny"}]}))
    view = read_frontend(fake.url, "tiny", 2, 5.0)
    assert view.error == "GET /v1/models failed: KeyError: 'id'"


def test_failing_probes_are_collected_with_the_http_reason(fake: FakeDeployment) -> None:
    fake.chat_status = 500
    view = read_frontend(fake.url, "tiny", 2, 5.0)
    assert view.served_by == () and len(view.probe_errors) == 2
    assert view.probe_errors[0].startswith("HTTP 500")


def test_a_state_document_of_the_wrong_shape_is_an_error(fake: FakeDeployment) -> None:
    fake.state = [1, 2]
    assert "did not answer a JSON object" in str(read_router(f"{fake.url}/state", 5.0).error)
    fake.state = {"router": {}, "scheduler": {}}
    assert "lack" in str(read_router(f"{fake.url}/state", 5.0).error)


def test_a_stray_worker_needs_a_running_stack(tmp_path: Path) -> None:
    from dynamo_thunderagent.stack.launcher import LocalStack, StackConfig, StackError

    stack = LocalStack(StackConfig(arm="ours", run_dir=tmp_path / "run"))
    with pytest.raises(StackError, match="not running"):
        stack.start_worker_in("ta")
