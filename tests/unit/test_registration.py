"""The router writes back its own file-discovery registration when the store expires it
(``dynamo/registration.py``); the real-process case is in tests/e2e/test_faults.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import quote

import pytest
from structlog.testing import capture_logs

from dynamo_thunderagent.dynamo import registration
from dynamo_thunderagent.dynamo.registration import (
    RegistrationKeeper,
    file_store,
    keep,
    owned,
)
from dynamo_thunderagent.dynamo.serve import _instance_id, _keep_registration

OURS = 0xAE3769C4F71EAE41
OTHER = 0x25D03F6CD4F89D91


def _name(key: str) -> str:
    return quote(key, safe="")  # every separator percent-encoded, as the store does


def _store(tmp_path: Path) -> dict[str, Path]:
    """A file store as Dynamo 1.6.1 lays it out: the router's instance and model card, and
    a worker's instance."""
    files = {
        "instance": tmp_path / "v1" / "instances" / _name(f"ta/router/generate/{OURS:x}"),
        "card": tmp_path / "v1" / "mdc" / _name(f"ta/router/generate/{OURS:x}"),
        "worker": tmp_path / "v1" / "instances" / _name(f"ta-workers/backend/generate/{OTHER:x}"),
    }
    for label, path in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f'{{"which": "{label}"}}'.encode())
    return files


def test_the_store_is_the_file_backend_s_only() -> None:
    assert file_store({"DYN_DISCOVERY_BACKEND": "etcd", "DYN_FILE_KV": "/"}) is None
    assert file_store({}) is None


def test_the_store_is_dyn_file_kv_else_dynamo_s_default(tmp_path: Path) -> None:
    env = {"DYN_DISCOVERY_BACKEND": "file", "DYN_FILE_KV": str(tmp_path)}
    assert file_store(env) == tmp_path
    store = file_store({"DYN_DISCOVERY_BACKEND": "file"})
    assert store is not None and store.name == "dynamo_store_kv"


def test_a_file_is_owned_when_its_key_ends_in_the_instance_id() -> None:
    assert owned(_name(f"ta/router/generate/{OURS:x}"), OURS)
    assert not owned(_name(f"ta/router/generate/{OTHER:x}"), OURS)
    assert not owned(_name(f"ta/{OURS:x}/generate/{OTHER:x}"), OURS)
    assert not owned(_name(f"ta/router/generate/{OURS:x}0"), OURS)


def test_expired_files_of_this_router_come_back_as_they_were(tmp_path: Path) -> None:
    files = _store(tmp_path)
    before = {label: path.read_bytes() for label, path in files.items()}
    keeper = RegistrationKeeper(tmp_path, OURS, clock=lambda: 100.0)
    assert keeper.capture() == 2
    assert keeper.restore_missing() == []
    for path in files.values():
        path.unlink()  # another process expired them all
    written = keeper.restore_missing()
    assert sorted(written) == [f"instances/ta/router/generate/{OURS:x}",
                               f"mdc/ta/router/generate/{OURS:x}"]
    assert files["instance"].read_bytes() == before["instance"]
    assert files["card"].read_bytes() == before["card"]
    assert not files["worker"].exists()  # another process's: not ours to write
    assert [p.name for p in tmp_path.iterdir()] == ["v1"]  # no temporary file left
    state = keeper.state()
    assert state["restored"] == 2 and state["last_restored_ago_s"] == 0.0
    assert state["instance_id"] == f"{OURS:x}"


def test_a_copy_follows_the_file_while_it_is_there(tmp_path: Path) -> None:
    files = _store(tmp_path)
    keeper = RegistrationKeeper(tmp_path, OURS)
    files["card"].write_bytes(b'{"which": "car')  # read while Dynamo was writing it
    keeper.capture()
    files["card"].write_bytes(b'{"which": "card, whole"}')
    keeper.capture()
    files["card"].unlink()
    keeper.restore_missing()
    assert files["card"].read_bytes() == b'{"which": "card, whole"}'


def test_a_closed_keeper_writes_nothing_back(tmp_path: Path) -> None:
    # serve closes it before the runtime deregisters: a router that leaves stays gone.
    files = _store(tmp_path)
    keeper = RegistrationKeeper(tmp_path, OURS)
    keeper.capture()
    keeper.close()
    files["instance"].unlink()
    assert keeper.restore_missing() == []
    assert not files["instance"].exists()


def test_a_store_without_buckets_yet_is_not_an_error(tmp_path: Path) -> None:
    assert RegistrationKeeper(tmp_path, OURS).capture() == 0


async def test_the_loop_writes_back_and_says_so(tmp_path: Path) -> None:
    files = _store(tmp_path)
    keeper = RegistrationKeeper(tmp_path, OURS)
    with capture_logs() as logs:
        task = asyncio.create_task(keep(keeper, interval=0.01))
        try:
            await _until(lambda: len(keeper.copies) == 2)
            files["instance"].unlink()
            await _until(lambda: files["instance"].exists())
        finally:
            task.cancel()
    restored = [entry for entry in logs if entry["event"] == "registration.restored"]
    assert restored and restored[0]["keys"] == [f"instances/ta/router/generate/{OURS:x}"]
    assert keeper.restored == 1


async def test_the_loop_looks_often_until_it_has_the_instance_registration(
        tmp_path: Path) -> None:
    # The runtime writes the instance file a moment after the model card; a router frozen
    # in between must not come back as a model card without an instance (seen in CI).
    files = _store(tmp_path)
    instance = files["instance"].read_bytes()
    files["instance"].unlink()
    keeper = RegistrationKeeper(tmp_path, OURS)
    task = asyncio.create_task(keep(keeper, interval=60.0))  # a minute between passes...
    try:
        await _until(lambda: len(keeper.copies) == 1)  # the card
        files["instance"].write_bytes(instance)
        await _until(lambda: keeper.has_instance, timeout=2.0)  # ...but not for this
    finally:
        task.cancel()


async def test_the_loop_says_once_when_it_finds_nothing_of_its_own(tmp_path: Path) -> None:
    keeper = RegistrationKeeper(tmp_path, OURS)
    with capture_logs() as logs:
        task = asyncio.create_task(keep(keeper, interval=0.01, capture_timeout=0.0))
        try:
            await asyncio.sleep(0.1)
        finally:
            task.cancel()
    unwatched = [entry for entry in logs if entry["event"] == "registration.unwatched"]
    assert len(unwatched) == 1


async def test_a_store_that_fails_is_reported_and_the_loop_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = _store(tmp_path)
    keeper = RegistrationKeeper(tmp_path, OURS)
    keeper.capture()
    files["instance"].unlink()
    failing = True

    def replace(src: str, dst: str) -> None:
        if failing:
            raise PermissionError(13, "Permission denied", dst)
        real_replace(src, dst)

    real_replace = registration.os.replace
    monkeypatch.setattr(registration.os, "replace", replace)
    with capture_logs() as logs:
        task = asyncio.create_task(keep(keeper, interval=0.01))
        try:
            await _until(lambda: keeper.error is not None)
            await asyncio.sleep(0.05)  # several failing passes: said once
            assert "PermissionError" in str(keeper.state()["error"])
            failing = False
            await _until(lambda: files["instance"].exists())
            await _until(lambda: keeper.error is None)
        finally:
            task.cancel()
    failed = [entry for entry in logs if entry["event"] == "registration.keep_failed"]
    assert len(failed) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["v1"]  # the failed writes' files gone


async def test_serve_goes_on_unkept_where_the_instance_id_is_unreadable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DYN_DISCOVERY_BACKEND", "file")
    monkeypatch.setenv("DYN_FILE_KV", str(tmp_path))

    class Endpoint:  # a binding without connection_id
        pass

    class Router:
        state_extensions: dict[str, object] = {}

    with capture_logs() as logs:
        stop = _keep_registration(_instance_id(Endpoint()), Router())
    stop()
    assert "registration" not in Router.state_extensions
    assert [entry["event"] for entry in logs] == ["router.instance_id_unreadable",
                                                  "registration.unwatched"]


async def test_serve_keeps_the_registration_and_stops_keeping_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DYN_DISCOVERY_BACKEND", "file")
    monkeypatch.setenv("DYN_FILE_KV", str(tmp_path))
    files = _store(tmp_path)

    class Endpoint:
        def connection_id(self) -> int:
            return OURS

    class Router:
        state_extensions: dict[str, object] = {}

    stop = _keep_registration(_instance_id(Endpoint()), Router(), interval=0.01)
    state = Router.state_extensions["registration"]
    assert callable(state)
    await _until(lambda: len(state()["keys"]) == 2)
    files["card"].unlink()
    await _until(lambda: files["card"].exists())  # kept...
    stop()
    files["instance"].unlink()  # the runtime deregistering on the way out
    await asyncio.sleep(0.2)  # twenty intervals
    assert not files["instance"].exists()  # ...until serve stops it


async def test_serve_goes_on_unkept_where_the_file_store_is_not_there(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DYN_DISCOVERY_BACKEND", "file")
    monkeypatch.setenv("DYN_FILE_KV", str(tmp_path / "absent"))

    class Router:
        state_extensions: dict[str, object] = {}

    with capture_logs() as logs:
        _keep_registration(OURS, Router())()
    assert "registration" not in Router.state_extensions
    [said] = logs
    assert said["event"] == "registration.unwatched" and "not there" in said["reason"]


async def _until(condition: object, timeout: float = 5.0) -> None:
    assert callable(condition)
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)
