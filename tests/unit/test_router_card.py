"""The router's model card carries the workers' settings the frontend acts on
(``dynamo/router_card.py``; the live case is in tests/e2e/test_router_e2e.py)."""

from __future__ import annotations

import argparse
import asyncio
import http.server
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from dynamo_thunderagent.dynamo.router_card import (
    TEMPLATE_MAX_BYTES,
    CardSettings,
    await_cards,
    card_settings,
    cards_unless_stopped,
    choose,
    mismatch,
    report,
    runtime_config,
    stated,
    template_file,
)
from dynamo_thunderagent.dynamo.serve import _watch_card, argument_problem

from .conftest import loopback_server


def worker_card(*, tool: str | None = None, reasoning: str | None = None,
                length: int = 0, exclude: bool = True,
                template: tuple[str, str] | None = None) -> dict[str, Any]:
    """A worker's card as Dynamo 1.6.1 publishes it (the fields read here; ``template``:
    a custom chat template's URL and checksum)."""
    card: dict[str, Any] = {
        "context_length": length, "kv_cache_block_size": 16,
        "runtime_config": {"context_length": length, "total_kv_blocks": 256,
                           "tool_call_parser": tool, "reasoning_parser": reasoning,
                           "exclude_tools_when_tool_choice_none": exclude}}
    if template is not None:
        url, checksum = template
        card["chat_template_file"] = {"hf_chat_template": {
            "is_custom": True, "file": {"path": url, "checksum": checksum, "size": 84}}}
    return card


HERMES = CardSettings(tool_call_parser="hermes", context_length=2048)


def test_a_card_s_settings_are_read_from_itsruntime_config() -> None:
    raw = json.dumps(worker_card(tool="hermes", reasoning="deepseek_r1", length=2048,
                                 exclude=False))
    assert card_settings(raw) == CardSettings("hermes", "deepseek_r1", False, 2048)
    # The mocker states no parser and a context length of 0: nothing stated.
    assert card_settings(worker_card()) == CardSettings()
    # A context length only at the card's top level still counts.
    assert card_settings({"context_length": 4096}) == CardSettings(context_length=4096)
    # A custom template is known by its checksum; where it is served is kept, not compared.
    served = card_settings(worker_card(template=("http://w1/t.jinja", "blake3:aa")))
    assert served == CardSettings(chat_template="blake3:aa")
    assert served is not None and served.chat_template_url == "http://w1/t.jinja"
    assert served == card_settings(worker_card(template=("http://w2/t.jinja", "blake3:aa")))


def test_a_card_that_cannot_be_read_states_nothing() -> None:
    for raw in ("not json", "[1, 2]", json.dumps({"runtime_config": "lots"})):
        assert card_settings(raw) is None
    # Fields of the wrong type are not stated (the frontend could not use them either).
    odd = {"runtime_config": {"tool_call_parser": 7, "reasoning_parser": " ",
                              "exclude_tools_when_tool_choice_none": "no",
                              "context_length": -5}, "context_length": True}
    assert card_settings(odd) == CardSettings()
    assert stated({"1": "not json", "2": worker_card(tool="hermes")}) == [
        CardSettings(tool_call_parser="hermes")]


def test_workers_that_agree_give_the_router_their_settings() -> None:
    seen = stated({"1": worker_card(tool="hermes", length=2048),
                   "2": worker_card(tool="hermes", length=2048)})
    assert choose(seen) == (HERMES, None)


def test_the_smallest_context_length_is_the_router_s() -> None:
    seen = [CardSettings(context_length=8192), CardSettings(context_length=2048),
            CardSettings()]
    chosen, warning = choose(seen)
    assert chosen.context_length == 2048 and warning is None


def test_workers_that_disagree_give_the_most_common_setting_and_a_warning() -> None:
    seen = [CardSettings(tool_call_parser="hermes"), CardSettings(tool_call_parser="hermes"),
            CardSettings()]
    chosen, warning = choose(seen)
    assert chosen.tool_call_parser == "hermes"
    assert warning is not None
    assert "disagree on tool_call_parser: 'hermes' (2), None (1)" in warning
    assert "start every worker of a model alike" in warning
    # A tie goes the same way every time, whatever order the cards come in.
    tie = [CardSettings(reasoning_parser="b"), CardSettings(reasoning_parser="a")]
    assert choose(tie)[0] == choose(list(reversed(tie)))[0]


def test_the_flags_win_over_the_cards_and_say_so() -> None:
    chosen, warning = choose([HERMES], tool_call_parser="pythonic",
                             reasoning_parser="deepseek_r1")
    assert chosen == CardSettings("pythonic", "deepseek_r1", True, 2048)
    assert warning is not None and "--dyn-tool-call-parser pythonic overrides" in warning
    assert "which say 'hermes'" in warning
    # A flag that says what the cards say is no override.
    assert choose([HERMES], tool_call_parser="hermes") == (HERMES, None)


def test_no_card_before_registering_is_said_and_the_flags_still_count() -> None:
    chosen, warning = choose([], tool_call_parser="hermes")
    assert chosen == CardSettings(tool_call_parser="hermes")
    assert warning is not None and "no worker's model card was seen" in warning


def test_a_mismatch_names_each_setting_the_workers_now_state_otherwise() -> None:
    assert mismatch(HERMES, [HERMES]) is None
    assert mismatch(HERMES, []) is None  # no card yet: nothing to compare
    problem = mismatch(CardSettings(), [HERMES])
    assert problem is not None
    assert "tool_call_parser: the workers' cards say 'hermes', the router's None" in problem
    assert "context_length: a worker's card says 2048, the router's None" in problem
    assert "restart serve" in problem
    # A worker restarted with a longer context is no problem: the router promises less.
    assert mismatch(HERMES, [CardSettings(tool_call_parser="hermes",
                                          context_length=8192)]) is None
    assert report(HERMES, [HERMES]) == {
        "tool_call_parser": "hermes", "reasoning_parser": None,
        "exclude_tools_when_tool_choice_none": True, "context_length": 2048,
        "chat_template": None, "overridden": [], "mismatch": None}


def test_a_setting_serve_s_flag_gave_is_no_mismatch() -> None:
    registered, _ = choose([CardSettings()], tool_call_parser="hermes")
    assert registered.overridden == frozenset({"tool_call_parser"})
    assert mismatch(registered, [CardSettings()]) is None  # the operator's choice
    assert report(registered, [CardSettings()])["overridden"] == ["tool_call_parser"]


def test_the_workers_custom_template_is_chosen_with_where_to_fetch_it() -> None:
    seen = stated({"1": worker_card(template=("http://w1/t.jinja", "blake3:aa")),
                   "2": worker_card(template=("http://w2/t.jinja", "blake3:aa"))})
    chosen, warning = choose(seen)
    assert warning is None
    assert chosen.chat_template == "blake3:aa" and chosen.chat_template_url is not None
    # A template of serve's own wins and is fetched from nowhere.
    flagged, warning = choose(seen, chat_template="/etc/agent.jinja")
    assert flagged.chat_template == "/etc/agent.jinja" and flagged.chat_template_url is None
    assert warning is not None and "--custom-jinja-template /etc/agent.jinja" in warning
    # A router card without the workers' template is a mismatch.
    problem = mismatch(CardSettings(), seen)
    assert problem is not None and "chat_template: the workers' cards say 'blake3:aa'" in problem


async def test_serve_waits_for_a_card_and_not_for_ever() -> None:
    reads: list[int] = []

    def read() -> dict[str, Any]:
        reads.append(1)
        return {"7": worker_card(tool="hermes")} if len(reads) >= 3 else {}

    assert await await_cards(read, wait=10.0) == [CardSettings(tool_call_parser="hermes")]
    assert len(reads) == 3
    assert await asyncio.wait_for(await_cards(lambda: {}, wait=0.3), 5.0) == []


async def test_a_sigterm_during_the_wait_ends_it_with_the_cards_there() -> None:
    stop = asyncio.Event()
    cards: dict[str, Any] = {}
    waiting = asyncio.create_task(cards_unless_stopped(lambda: cards, stop))
    await asyncio.sleep(0.3)
    assert not waiting.done()  # no card yet: still waiting (up to 30 s)
    cards["7"] = worker_card(reasoning="qwen3")  # read by a last poll or after the stop
    stop.set()
    assert await asyncio.wait_for(waiting, 1.0) == [CardSettings(reasoning_parser="qwen3")]
    cards.clear()  # and a card that arrives first ends the wait as before
    cards["8"] = worker_card(tool="hermes")
    assert await asyncio.wait_for(cards_unless_stopped(lambda: cards, asyncio.Event()),
                                  5.0) == [CardSettings(tool_call_parser="hermes")]


def test_the_registered_runtime_config_carries_the_settings() -> None:
    class RuntimeConfig:  # Dynamo's ModelRuntimeConfig, as far as serve sets it
        tool_call_parser = reasoning_parser = context_length = None
        exclude_tools_when_tool_choice_none = True

    config = runtime_config(RuntimeConfig(), CardSettings("hermes", "qwen3", False, 2048))
    assert (config.tool_call_parser, config.reasoning_parser, config.context_length,
            config.exclude_tools_when_tool_choice_none) == ("hermes", "qwen3", 2048, False)
    # No length stated: the binding's default (the model's own) stays.
    assert runtime_config(RuntimeConfig(), CardSettings()).context_length is None


@pytest.fixture
def template_server() -> Iterator[str]:
    """A loopback HTTP server that serves a template at /t.jinja (a worker's metadata
    server, as far as serve reads it), and 1 MB + 1 bytes at /huge.jinja."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = {"/t.jinja": b"{{ messages }}",
                    "/huge.jinja": b"x" * (TEMPLATE_MAX_BYTES + 1)}.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args: Any) -> None:
            pass

    with loopback_server(Handler) as url:
        yield url


def test_serve_fetches_the_workers_template_for_its_own_card(template_server: str,
                                                             tmp_path: Path) -> None:
    card = CardSettings(chat_template="blake3:aa", chat_template_url=f"{template_server}/t.jinja")
    registered, path = template_file(card, None, tmp_path)
    assert registered == card and path is not None
    assert Path(path).read_text() == "{{ messages }}"
    # No custom template: the model's own; serve's flag: that file, fetched from nowhere.
    assert template_file(CardSettings(), None, tmp_path) == (CardSettings(), None)
    assert template_file(card, "/etc/agent.jinja", tmp_path) == (card, "/etc/agent.jinja")


@pytest.mark.parametrize("name", ["missing.jinja", "huge.jinja", "local"])
def test_a_template_that_cannot_be_fetched_is_said_and_left_out(template_server: str,
                                                                tmp_path: Path,
                                                                name: str) -> None:
    # (local: a card naming a file on the router's host is not read, though one is there.)
    secret = tmp_path / "secret.txt"
    secret.write_text("not a template")
    url = secret.as_uri() if name == "local" else f"{template_server}/{name}"
    card = CardSettings(chat_template="blake3:aa", chat_template_url=url)
    with capture_logs() as logs:
        registered, path = template_file(card, None, tmp_path)
    assert path is None and registered.chat_template is None
    [said] = [entry for entry in logs if entry["event"] == "router.card_template_unread"]
    assert "--custom-jinja-template" in said["effect"]
    # ... and the router's card then shows the difference.
    assert mismatch(registered, [card]) is not None


def test_serve_refuses_a_template_flag_that_names_no_file(tmp_path: Path) -> None:
    args = argparse.Namespace(block_size=None, state_port=0, events_port=0,
                              refresh_interval=1.0,
                              custom_jinja_template=str(tmp_path / "none.jinja"))
    problem = argument_problem(args)
    assert problem is not None and "--custom-jinja-template must name a readable file" in problem
    args.custom_jinja_template = None
    assert argument_problem(args) is None


async def test_the_router_says_once_when_the_workers_cards_come_to_differ() -> None:
    class Workers:  # the router's worker watch, as far as the check reads it
        stated_cards: list[CardSettings] = []

    workers = Workers()
    with capture_logs() as logs:
        task = asyncio.create_task(_watch_card(workers, CardSettings(), every=0.01))
        try:
            await asyncio.sleep(0.05)  # no card yet: nothing to say
            workers.stated_cards = [HERMES]  # a worker restarted with a parser
            await asyncio.sleep(0.1)  # several passes: said once
        finally:
            task.cancel()
    said = [entry for entry in logs if entry["event"] == "router.card_mismatch"]
    assert len(said) == 1 and "tool_call_parser" in said[0]["reason"]
