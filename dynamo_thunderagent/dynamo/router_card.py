"""What the router's own model card tells the frontend: the workers' settings, not the model's.

The frontend serves a model from the cards of whatever is registered for it, and here that is
the router (the workers sit in a namespace the frontend does not watch). Besides the model's
files, a card carries what the engines were started with, and the frontend acts on it:
``runtime_config.tool_call_parser`` and ``reasoning_parser`` (a worker's
``--dyn-tool-call-parser`` and ``--dyn-reasoning-parser``) turn the engine's text into a
response's ``tool_calls`` and ``reasoning_content``; a custom chat template
(``--custom-jinja-template``, the card's ``chat_template_file``) renders every prompt;
``exclude_tools_when_tool_choice_none`` shapes it; the context length (``--max-model-len``)
is the model's ``context_window`` in ``/v1/models``. A router card without them made the
frontend hand an agent its tool call as plain text (seen live: a worker with the Hermes
parser, stock's frontend answered with ``tool_calls``, ours with the call's text and finish
``stop``), render prompts with the model's own template instead of the workers', and state
the model's architectural context window rather than the engines' limit.

So ``serve`` copies these settings from the workers' cards when it registers (the template's
file it fetches from the worker, as the frontend does; its ``--dyn-tool-call-parser``,
``--dyn-reasoning-parser`` and ``--custom-jinja-template`` flags win), and :func:`mismatch`
says where the workers' cards come to state otherwise: the frontend reads a card once, so
only a restarted router carries new settings (``/state`` ``router_card``, the log,
``doctor``).

Pure but for the bounded wait for a first card (:func:`cards_unless_stopped`) and the fetch
of a custom template (:func:`template_file`), which ``serve`` calls.
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import structlog

from dynamo_thunderagent.dynamo.translate import card_context_length

log = structlog.get_logger("dynamo_thunderagent.serve")

WAIT_SECONDS = 30.0
POLL_SECONDS = 0.25


@dataclass(frozen=True)
class CardSettings:
    """The settings of a worker's card that the frontend acts on (None: not stated)."""

    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    exclude_tools_when_tool_choice_none: bool = True
    context_length: int | None = None  # the engine's limit; None or 0 on the card: none stated
    # A custom chat template, by its checksum (the same file served by two workers is the
    # same template), and where the card says it can be fetched.
    chat_template: str | None = None
    chat_template_url: str | None = field(default=None, compare=False)
    # The router's card only: settings serve's flags gave, which the workers' cards may
    # state otherwise by the operator's choice (not a mismatch).
    overridden: frozenset[str] = field(default=frozenset(), compare=False)


# The settings compared one card to another (the context length is compared as a bound).
COMPARED = ("tool_call_parser", "reasoning_parser", "exclude_tools_when_tool_choice_none",
            "chat_template")


def card_settings(raw: str | Mapping[str, Any]) -> CardSettings | None:
    """One card's settings; None for a card that cannot be read (the worker watch names it
    in ``unreadable_cards``)."""
    try:
        card = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return None
    if not isinstance(card, Mapping):
        return None
    runtime = card.get("runtime_config") or {}
    if not isinstance(runtime, Mapping):
        return None
    exclude = runtime.get("exclude_tools_when_tool_choice_none", True)
    checksum, url = _custom_template(card.get("chat_template_file"))
    return CardSettings(
        tool_call_parser=_name(runtime.get("tool_call_parser")),
        reasoning_parser=_name(runtime.get("reasoning_parser")),
        exclude_tools_when_tool_choice_none=exclude if isinstance(exclude, bool) else True,
        context_length=card_context_length(card, runtime),
        chat_template=checksum, chat_template_url=url,
    )


def _custom_template(entry: Any) -> tuple[str | None, str | None]:
    """A card's custom chat template (``chat_template_file.hf_chat_template``, with
    ``is_custom``): its checksum and URL; (None, None) for none or one not read so."""
    template = entry.get("hf_chat_template") if isinstance(entry, Mapping) else None
    if not isinstance(template, Mapping) or template.get("is_custom") is False:
        return None, None
    file = template.get("file")
    if not isinstance(file, Mapping):
        return None, None
    url, checksum = _name(file.get("path")), _name(file.get("checksum"))
    return (checksum or url), url


def _name(value: Any) -> str | None:
    return value if isinstance(value, str) and value.strip() else None


def stated(model_cards: Mapping[str, str | Mapping[str, Any]]) -> list[CardSettings]:
    """The settings every readable card states, one entry a card."""
    found = (card_settings(raw) for raw in model_cards.values())
    return [settings for settings in found if settings is not None]


async def await_cards(read_cards: Callable[[], Mapping[str, Any]], wait: float = WAIT_SECONDS,
                      clock: Callable[[], float] | None = None) -> list[CardSettings]:
    """The settings the workers' cards state once one card reads, or after ``wait``
    seconds (then none, and :func:`choose` says so)."""
    now = clock or asyncio.get_running_loop().time
    deadline = now() + wait
    while True:
        seen = stated(read_cards())
        if seen or now() >= deadline:
            return seen
        await asyncio.sleep(POLL_SECONDS)


def choose(seen: Iterable[CardSettings], *, tool_call_parser: str | None = None,
           reasoning_parser: str | None = None,
           chat_template: str | None = None) -> tuple[CardSettings, str | None]:
    """The settings to register the router's card with, from the workers' cards (``seen``)
    and serve's flags (None: not given; ``chat_template``: a file's path), and what to warn
    about (None: nothing).

    Where the cards disagree, the setting most of them state is taken (the first in
    sorted order on a tie) and the warning names the disagreement: a frontend applies one
    parser and one template to every worker. The context length is the smallest any card
    states, so that ``/v1/models`` promises no more than every engine takes."""
    cards = list(seen)
    warnings = []
    chosen = CardSettings()
    for name in COMPARED:
        values = Counter(getattr(card, name) for card in cards)
        if not values:
            continue
        value = sorted(values.items(), key=lambda kv: (-kv[1], repr(kv[0])))[0][0]
        chosen = replace(chosen, **{name: value})
        if len(values) > 1:
            said = ", ".join(f"{v!r} ({n})" for v, n in sorted(values.items(), key=repr))
            warnings.append(f"the workers' cards disagree on {name}: {said}; the router's "
                            f"card says {value!r} (start every worker of a model alike)")
    if chosen.chat_template is not None:
        chosen = replace(chosen, chat_template_url=next(
            card.chat_template_url for card in cards
            if card.chat_template == chosen.chat_template))
    lengths = [card.context_length for card in cards if card.context_length]
    if lengths:
        chosen = replace(chosen, context_length=min(lengths))
    flags = {"tool_call_parser": ("--dyn-tool-call-parser", tool_call_parser),
             "reasoning_parser": ("--dyn-reasoning-parser", reasoning_parser),
             "chat_template": ("--custom-jinja-template", chat_template)}
    for name, (flag, value) in flags.items():
        if value is None:
            continue
        if cards and getattr(chosen, name) != value:
            warnings.append(f"{flag} {value} overrides the workers' cards, which say "
                            f"{getattr(chosen, name)!r}")
    given = frozenset(name for name, (_, value) in flags.items() if value is not None)
    chosen = replace(chosen, tool_call_parser=tool_call_parser or chosen.tool_call_parser,
                     reasoning_parser=reasoning_parser or chosen.reasoning_parser,
                     chat_template=chat_template or chosen.chat_template,
                     chat_template_url=None if chat_template else chosen.chat_template_url,
                     overridden=given)
    if not cards:
        warnings.append("no worker's model card was seen before the router registered its "
                        "own: it states no parser, chat template or context length but what "
                        "serve's flags say; restart serve once the workers are up, or pass "
                        "--dyn-tool-call-parser, --dyn-reasoning-parser and "
                        "--custom-jinja-template as the workers have them")
    return chosen, "; ".join(warnings) or None


def mismatch(registered: CardSettings, seen: Iterable[CardSettings]) -> str | None:
    """What the frontend gets wrong now that the workers' cards state ``seen`` while the
    router's card says ``registered`` (None: nothing; no card seen: nothing yet)."""
    problems = []
    cards = list(seen)
    for name in COMPARED:
        if name in registered.overridden:
            continue  # serve's flag said so: the operator's choice
        mine = getattr(registered, name)
        theirs = sorted({getattr(card, name) for card in cards} - {mine}, key=repr)
        if theirs:
            problems.append(f"{name}: the workers' cards say "
                            f"{', '.join(map(repr, theirs))}, the router's {mine!r}")
    lengths = [card.context_length for card in cards if card.context_length]
    if lengths and (registered.context_length is None or registered.context_length > min(lengths)):
        problems.append(f"context_length: a worker's card says {min(lengths)}, the router's "
                        f"{registered.context_length}")
    if not problems:
        return None
    return ("; ".join(problems) + ": the frontend acts on the router's card (its parsers "
            "read tool calls and reasoning, its template renders prompts); restart serve to "
            "register the workers' settings")


def report(registered: CardSettings, seen: Iterable[CardSettings]) -> dict[str, object]:
    """/state ``router_card``: what the router's card says, and what is wrong (null when the
    workers' cards agree with it)."""
    return {"tool_call_parser": registered.tool_call_parser,
            "reasoning_parser": registered.reasoning_parser,
            "exclude_tools_when_tool_choice_none":
                registered.exclude_tools_when_tool_choice_none,
            "context_length": registered.context_length,
            "chat_template": registered.chat_template,
            "overridden": sorted(registered.overridden),
            "mismatch": mismatch(registered, seen)}


async def cards_unless_stopped(read_cards: Callable[[], Mapping[str, Any]],
                                stop: asyncio.Event) -> list[CardSettings]:
    """:func:`await_cards`, cut short by a SIGTERM (``stop``): then the cards there now (the
    router registers and ends at once rather than after the wait)."""
    waiting = asyncio.ensure_future(await_cards(read_cards))
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if waiting.done():
        return waiting.result()
    waiting.cancel()
    return stated(read_cards())


TEMPLATE_MAX_BYTES = 1 << 20


def template_file(card: CardSettings, flag: str | None,
                   folder: Path) -> tuple[CardSettings, str | None]:
    """The chat template file the router's card is registered with: serve's flag, or the
    workers' custom template fetched from where their card says into ``folder`` (as the
    frontend fetches a card's files, over http(s) only); None for the model's own. A
    template that cannot be fetched is said and left out of the card (``/state``
    ``router_card`` then shows the mismatch)."""
    if flag is not None:
        return card, flag
    if card.chat_template_url is None:
        return card, None
    try:
        scheme = urllib.parse.urlsplit(card.chat_template_url).scheme
        if scheme not in ("http", "https"):  # a worker's metadata server; never a local file
            raise ValueError(f"not an http(s) URL (scheme {scheme!r})")
        with urllib.request.urlopen(card.chat_template_url, timeout=10) as response:
            text = response.read(TEMPLATE_MAX_BYTES + 1)
        if len(text) > TEMPLATE_MAX_BYTES:
            raise ValueError(f"larger than {TEMPLATE_MAX_BYTES} bytes")
    except (OSError, ValueError) as error:
        log.warning("router.card_template_unread", url=card.chat_template_url,
                    error=f"{type(error).__name__}: {error}",
                    effect="the router's card has the model's own chat template, not the "
                           "workers' custom one; pass --custom-jinja-template")
        return replace(card, chat_template=None, chat_template_url=None), None
    path = folder / "chat_template.jinja"
    path.write_bytes(text)
    return card, str(path)


def runtime_config(config: Any, card: CardSettings) -> Any:
    """Dynamo's ``ModelRuntimeConfig`` ``config`` for the router's card, set to ``card``'s
    settings that the frontend acts on (the model's own context length where no card
    states one)."""
    config.tool_call_parser = card.tool_call_parser
    config.reasoning_parser = card.reasoning_parser
    config.exclude_tools_when_tool_choice_none = card.exclude_tools_when_tool_choice_none
    if card.context_length is not None:
        config.context_length = card.context_length
    return config
