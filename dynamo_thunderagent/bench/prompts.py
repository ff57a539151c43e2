"""Prompts of an exact token count: how an agent plan becomes chat messages.

Prompts are made of whole words that the tokenizer maps to exactly one token each, so the
prompt of turn ``k`` has the planned number of tokens (the chat template's own tokens are
measured once per run, :func:`measure_template_overhead`, and subtracted). The content of
every message is a pure function of the session id and the message's position
(:class:`History`), so turn ``k``'s prompt extends turn ``k-1``'s token for token, which is
what prefix caching needs; a compaction turn instead keeps only the system message and starts
a history whose contents are keyed apart from the old one, so the two prompts share exactly
the system prompt. Used by the closed-loop driver (``bench/driver.py``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynamo_thunderagent.bench.workload import AgentPlan

# Words that the project's tiny model (stack/tiny_model.py) encodes as one token each when
# preceded by a space. Used when no tokenizer file is given; checked when one is.
TINY_MODEL_WORDS: tuple[str, ...] = (
    "the", "tool", "and", "pause", "token", "list", "observation", "program", "json",
    "next", "test", "tokens",
)  # fmt: skip


class PromptText:
    """Makes message contents of an exact token count from one-token words.

    Content is ``" w1 w2 ... wn"``: with a byte-level BPE whose pre-tokenizer splits on
    spaces, each ``" w"`` is one token, and no merge crosses a word boundary.
    """

    def __init__(self, words: Sequence[str] = TINY_MODEL_WORDS) -> None:
        if not words:
            raise ValueError("PromptText needs at least one one-token word")
        self.words = tuple(words)

    @classmethod
    def from_tokenizer(cls, tokenizer_json: Path | str) -> PromptText:
        """Keep the candidate words that really are one token in ``tokenizer_json``.

        Raises ValueError if none is (a different model: pass your own word list).
        """
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(tokenizer_json))
        words = [w for w in TINY_MODEL_WORDS if len(tokenizer.encode(f" {w}").ids) == 1]
        probe = "".join(f" {w}" for w in words)
        if not words or len(tokenizer.encode(probe).ids) != len(words):
            raise ValueError(f"{tokenizer_json}: no one-token words among {TINY_MODEL_WORDS}")
        return cls(words)

    def text(self, n_tokens: int, key: str) -> str:
        """``n_tokens`` words drawn by a generator seeded with ``key`` (same key, same text)."""
        rng = random.Random(key)
        return "".join(" " + rng.choice(self.words) for _ in range(max(0, n_tokens)))


@dataclass
class TemplateOverhead:
    """Tokens the chat template adds, measured from the server's own prompt counts.

    ``base``: tokens of a one-message (system) prompt beyond its content, generation prompt
    included. ``per_message``: tokens each further message adds beyond its content, by role.
    """

    base: int = 0
    per_message: dict[str, int] = field(default_factory=dict)

    def message(self, role: str) -> int:
        return self.per_message.get(role, 0)


class History:
    """The message list of one agent, built so that each prompt has its planned length.

    Contents are keyed by ``(session_id, message index)``, so the history is a pure function
    of the plan: the next turn's prompt extends this turn's prompt exactly. After the ``n``-th
    compaction the keys also carry ``n``: the new history's text has
    nothing in common with the old one's beyond the system message.
    """

    def __init__(
        self, plan: AgentPlan, text: PromptText, overhead: TemplateOverhead, job: str
    ) -> None:
        self.plan = plan
        self._text = text
        self._overhead = overhead
        self.messages: list[dict[str, str]] = []
        # Template-charged tokens so far; contents absorb them so the total tracks the plan.
        self._actual = overhead.base
        system = max(1, plan.system_tokens - overhead.base)
        # The system prompt is keyed by the job, not the session: all agents share it.
        self._append("system", system, f"{job}:system")
        self._system_actual = self._actual
        self._epoch = 0  # compactions so far

    def _append(self, role: str, content_tokens: int, key: str) -> None:
        self.messages.append({"role": role, "content": self._text.text(content_tokens, key)})
        self._actual += content_tokens

    def _append_planned(self, role: str, target_total: int) -> None:
        """Append a message of ``role`` so the running total reaches ``target_total``.

        A message has at least one content token; the shortfall, if any, is made up by later
        messages (only possible when the plan appends fewer tokens than the template adds).
        """
        self._actual += self._overhead.message(role)
        content = max(1, target_total - self._actual)
        epoch = f"compaction{self._epoch}:" if self._epoch else ""
        self._append(role, content, f"{self.plan.session_id}:{epoch}{len(self.messages)}")

    def before_turn(self, turn: int) -> None:
        """Append the turn's new tokens: the task (turn 0), the previous tool's output, or
        after a compaction the summary that replaces the whole history but the system prompt."""
        if turn > 0 and self.plan.turns[turn].compaction:
            del self.messages[1:]
            self._actual = self._system_actual
            self._epoch += 1
        elif turn > 0:
            prev = self.plan.turns[turn - 1]
            self._append_planned(
                "assistant", self.plan.prompt_tokens(turn - 1) + prev.output_tokens
            )
        self._append_planned("user", self.plan.prompt_tokens(turn))


async def measure_template_overhead(
    client: Any, model: str, text: PromptText, timeout_s: float
) -> TemplateOverhead:
    """Ask the server how many tokens three small prompts have; derive the template's share.

    Uses requests without a session id (a program-aware router passes them through).
    """
    sizes = {"system": 24, "user": 40, "assistant": 56}
    messages: list[dict[str, str]] = []
    counts: list[int] = []
    for role, n in sizes.items():
        messages.append({"role": role, "content": text.text(n, f"calibrate:{role}")})
        reply = await client.chat.completions.create(
            model=model, messages=list(messages), max_tokens=1, timeout=timeout_s
        )
        counts.append(int(reply.usage.prompt_tokens))
    return TemplateOverhead(
        base=counts[0] - sizes["system"],
        per_message={
            "user": counts[1] - counts[0] - sizes["user"],
            "assistant": counts[2] - counts[1] - sizes["assistant"],
        },
    )
