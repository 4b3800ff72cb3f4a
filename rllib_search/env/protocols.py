"""Tag protocols: how a model asks for a search, how results come back and how it answers.

A :class:`Protocol` is plain data (templates, tags, stop strings) plus two text functions the rollout needs
every turn: :meth:`Protocol.parse_action` (one generated segment -> search / answer / invalid) and
:meth:`Protocol.format_observation` (passages -> the information block). Both are pure, so a runner can
parse a whole batch of segments and send every query of a turn to the retriever in one call.

The three papers' protocols are built in (``search_r1``, ``r1_searcher``, ``r_search``), and
``search_r1_compact`` (Search-R1's with a short instruction, for small models and CPU runs); a user defines
a new one by constructing a :class:`Protocol` and calling :func:`register_protocol`, without editing the
package.

``search_r1`` writes observations byte for byte as Search-R1's rollout does (``Doc i(Title: <first line of
contents>) <rest of contents>`` lines, joined and stripped, in ``\\n\\n<information>...</information>\\n\\n``)
and the same invalid-action text, so its published checkpoints see what they were trained on (tested
against an independent rewrite of Search-R1's formatting in tests/test_eval.py).

What still differs from Search-R1's own rollout (``search_r1/llm_agent/generation.py``) for the same model
and the same retrieval results:

- Over-long observations: Search-R1 tokenises the block and keeps its first ``max_obs_length`` tokens,
  dropping ``</information>`` and what follows; the env cuts inside the passages and keeps the closing
  tag's tokens (``max_obs_tokens``), so the block stays closed.
- Turns: Search-R1's ``max_turns`` counts search rounds and then allows one more generation whose search
  is not run; the env's ``max_turns`` counts generations, so Search-R1's ``max_turns=4`` is ``max_turns=5``.
- Context: Search-R1 keeps the last ``max_prompt_length`` (4096) tokens of a growing episode and goes on;
  the env ends the episode (truncated) at ``max_total_tokens``.
- Segment ends: Search-R1 decodes a whole generation without special tokens, cuts the text after the
  first ``</search>`` (else ``</answer>``) and re-tokenises it, so an EOS that ended a turn is not in the
  context of the next; the env stops generation at those strings and keeps the generated ids as they
  are (an ending EOS included, and a token that runs past the stop string).
- Parsing: Search-R1 takes the first ``<search>``/``<answer>`` box by its opening tag and only strips the
  query; the env takes the box that closes first, collapses whitespace in queries, and treats empty or
  nested boxes as invalid actions (Search-R1 would search for an empty query).
- A failed search: Search-R1 has no error observation (a failing server stops the run); the env writes
  ``search_error_text`` inside the information block.
- Prompt: ``instruction`` is the paper's Table 1; Search-R1's data files hold its code's wording (a few
  words differ). ``rllib-search eval`` prompts with a Search-R1 parquet's own template (``--prompt data``).
  Both render the user message through the tokenizer's chat template; for a tokenizer without one,
  Search-R1 tokenises the message alone (no special tokens) where the env appends a newline and lets the
  tokenizer add its special tokens.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from rllib_search.data.retrieval import Passage

ActionKind = Literal["search", "answer", "invalid"]


@dataclass(frozen=True)
class Action:
    """What one generated segment asked for. ``reason`` says why an action is invalid."""

    kind: ActionKind
    query: str | None = None
    answer: str | None = None
    evidence: str | None = None
    reason: str | None = None


@dataclass(frozen=True)
class Turn:
    """A piece of the response text: ``generated`` by the model, or an ``observation`` the env inserted."""

    source: Literal["generated", "observation"]
    text: str


@dataclass(frozen=True)
class FormatCheck:
    """Result of a protocol's format check over a whole response."""

    valid: bool
    reason: str


def state_machine_format(turns: Sequence[Turn], protocol: Protocol) -> FormatCheck:
    """The reasoning-action-observation state machine of the empirical study (arXiv 2505.15117, Appendix C).

    Applied to the response (everything after the prompt: generated segments and the observation blocks
    between them), with the protocol's own tags (for ``search_r1``: think, search, information, answer).
    A valid response is ``<think>..</think>`` followed either by ``<search>..</search><information>..
    </information>`` and another think, or by the final ``<answer>..</answer>``; only whitespace between
    blocks; balanced tags. Text the env inserted for an invalid action lies outside every block, so a
    response that needed a rethink is never format-valid.
    """
    text = "".join(turn.text for turn in turns)
    if not (protocol.think_open and protocol.think_close):
        raise ValueError(f"protocol {protocol.name!r} has no think tags: the state machine needs them")
    blocks = {
        "think": (protocol.think_open, protocol.think_close),
        "query": (protocol.query_open, protocol.query_close),
        "observation": (protocol.observation_open, protocol.observation_close),
        "answer": (protocol.answer_open, protocol.answer_close),
    }
    for open_tag, close_tag in blocks.values():
        opened, closed = text.count(open_tag), text.count(close_tag)
        if opened != closed:
            return FormatCheck(False, f"unbalanced {open_tag}: {opened} opening vs {closed} closing")
    # (state, tag) -> next state; states are named after where the parser stands.
    transitions = {
        ("start", blocks["think"][0]): "in_think",
        ("after_observation", blocks["think"][0]): "in_think",
        ("in_think", blocks["think"][1]): "after_think",
        ("after_think", blocks["query"][0]): "in_query",
        ("in_query", blocks["query"][1]): "after_query",
        ("after_query", blocks["observation"][0]): "in_observation",
        ("in_observation", blocks["observation"][1]): "after_observation",
        ("after_think", blocks["answer"][0]): "in_answer",
        ("in_answer", blocks["answer"][1]): "end",
    }
    all_tags = sorted({tag for pair in blocks.values() for tag in pair}, key=len, reverse=True)
    tag_pattern = "(" + "|".join(re.escape(tag) for tag in all_tags) + ")"
    state = "start"
    for part in re.split(tag_pattern, text):
        if not part.strip():
            continue
        if part in all_tags:
            next_state = transitions.get((state, part))
            if next_state is None:
                return FormatCheck(False, f"unexpected tag {part} in state {state}")
            state = next_state
        elif not state.startswith("in_"):
            return FormatCheck(False, f"unexpected text outside tags in state {state}: {part.strip()[:40]!r}")
    if state != "end":
        return FormatCheck(False, f"incomplete response: ended in state {state}")
    return FormatCheck(True, "valid")


def _is_garbled(text: str) -> bool:
    """Replacement characters or control characters other than whitespace: unreadable output."""
    return any(ch == "\ufffd" or (unicodedata.category(ch) == "Cc" and ch not in "\n\t\r") for ch in text)


def r1_searcher_format(turns: Sequence[Turn], protocol: Protocol, max_answer_words: int = 20) -> FormatCheck:
    """R1-Searcher's format rules (arXiv 2503.05592, section 2.2.1) over the response.

    1. reasoning inside think tags and exactly one final answer box holding only a short answer (at most
       ``max_answer_words`` words), with nothing after it;
    2. no garbled or unreadable content;
    3. queries inside the query tags, and documents only where the retriever put them: the model never
       writes a documents block itself.
    """
    generated = "".join(t.text for t in turns if t.source == "generated")
    text = "".join(t.text for t in turns)
    if _is_garbled(generated):
        return FormatCheck(False, "garbled content")
    if protocol.observation_open in generated or protocol.observation_close in generated:
        return FormatCheck(False, "the model wrote a documents block itself")
    pairs = [
        (protocol.think_open or "", protocol.think_close or ""),
        (protocol.query_open, protocol.query_close),
        (protocol.answer_open, protocol.answer_close),
    ]
    for open_tag, close_tag in pairs:
        if open_tag and generated.count(open_tag) != generated.count(close_tag):
            return FormatCheck(False, f"unbalanced {open_tag}")
    if protocol.think_open and _first_box(generated, protocol.think_open, protocol.think_close or "") is None:
        return FormatCheck(False, f"no {protocol.think_open} block")
    if generated.count(protocol.answer_open) != 1:
        return FormatCheck(
            False, f"expected exactly one answer box, found {generated.count(protocol.answer_open)}"
        )
    answer, answer_end = _first_box(text, protocol.answer_open, protocol.answer_close) or ("", -1)
    if answer_end < 0:
        return FormatCheck(False, "unclosed answer box")
    if text[answer_end:].strip():
        return FormatCheck(False, "text after the answer box")
    answer_words = answer.split()
    if not answer_words:
        return FormatCheck(False, "empty answer")
    if len(answer_words) > max_answer_words:
        return FormatCheck(False, f"answer longer than {max_answer_words} words")
    return FormatCheck(True, "valid")


def r_search_format(turns: Sequence[Turn], protocol: Protocol) -> FormatCheck:
    """R-Search's structure (section 3.2.2): after searching, exactly one non-empty evidence box; always
    exactly one non-empty answer box, at the end; and no observation block written by the model."""
    generated = "".join(t.text for t in turns if t.source == "generated")
    text = "".join(t.text for t in turns)
    if protocol.observation_open in generated:
        return FormatCheck(False, "the model wrote an observation block itself")
    searched = any(t.source == "observation" for t in turns)
    if searched and not well_formed_box(generated, protocol.evidence_open, protocol.evidence_close):
        return FormatCheck(False, "expected exactly one non-empty evidence box after searching")
    if not well_formed_box(generated, protocol.answer_open, protocol.answer_close):
        return FormatCheck(False, "expected exactly one non-empty answer box")
    if text[text.rindex(protocol.answer_close) + len(protocol.answer_close) :].strip():
        return FormatCheck(False, "text after the answer box")
    return FormatCheck(True, "valid")


def well_formed_box(text: str, open_tag: str, close_tag: str) -> bool:
    """Exactly one ``open_tag ... close_tag`` box, in that order, with non-blank content."""
    if text.count(open_tag) != 1 or text.count(close_tag) != 1:
        return False
    start, end = text.index(open_tag) + len(open_tag), text.index(close_tag)
    return start <= end and bool(text[start:end].strip())


FormatChecker = Callable[[Sequence[Turn], "Protocol"], FormatCheck]


@dataclass(frozen=True)
class Protocol:
    """A tag protocol: the prompt template, the tags, the stop strings and the observation layout.

    ``instruction`` holds ``{question}`` when the question goes inside it (Search-R1); otherwise the
    question is sent as the user message after an ``instruction`` system message (R1-Searcher, R-Search).
    ``passage_template`` formats one passage with ``{i}`` (1-based), ``{title}``, ``{text}``, ``{contents}``,
    and ``{first_line}`` / ``{rest}``: the first line of ``contents`` as it is (for Search-R1's corpora the
    quoted title) and everything after that line's newline, unstripped. Passages are joined with
    ``passage_separator``; ``strip_passages`` strips the joined body. The observation block is
    ``observation_prefix + observation_open + passages + observation_close + observation_suffix``;
    everything in it is masked from the loss.
    """

    name: str
    instruction: str
    query_open: str
    query_close: str
    observation_open: str
    observation_close: str
    answer_open: str = "<answer>"
    answer_close: str = "</answer>"
    evidence_open: str | None = None
    evidence_close: str | None = None
    passage_template: str = "Doc {i}(Title: {title}) {text}"
    passage_separator: str = "\n"
    strip_passages: bool = False
    think_open: str | None = "<think>"
    think_close: str | None = "</think>"
    block_padding: str = ""
    observation_prefix: str = "\n\n"
    observation_suffix: str = "\n\n"
    rethink_text: str = "\nMy action is not correct. Let me rethink.\n"
    search_error_text: str = "Search failed: {error}"
    format_checker: FormatChecker = field(default=state_machine_format, compare=False, repr=False)
    max_query_chars: int = 1000

    @property
    def stop_strings(self) -> tuple[str, ...]:
        """Where generation must stop: after a query closes or after the answer closes."""
        return (self.query_close, self.answer_close)

    @property
    def tags(self) -> tuple[str, ...]:
        opt = (self.evidence_open, self.evidence_close)
        core = (self.query_open, self.query_close, self.observation_open, self.observation_close)
        return (*core, self.answer_open, self.answer_close, *(t for t in opt if t))

    # --- prompt ---------------------------------------------------------------------------------------
    def prompt_messages(self, question: str) -> list[dict[str, str]]:
        """The chat messages that open an episode for ``question``."""
        question = question.strip()
        if "{question}" in self.instruction:
            return [{"role": "user", "content": self.instruction.format(question=question)}]
        return [{"role": "system", "content": self.instruction}, {"role": "user", "content": question}]

    # --- parsing ------------------------------------------------------------------------------------
    def parse_action(self, segment: str) -> Action:
        """Parse one generated segment into the first complete action it contains.

        A search is ``query_open q query_close``; an answer is ``answer_open a answer_close`` (for protocols
        with evidence, the evidence box that precedes it in the same segment is attached). Whichever
        closes first wins. Unclosed, nested or misordered tags, an empty or over-long query and an empty
        answer are invalid actions with a ``reason``.
        """
        search = _first_box(segment, self.query_open, self.query_close)
        answer = _first_box(segment, self.answer_open, self.answer_close)
        if search is None and answer is None:
            return Action("invalid", reason=self._missing_reason(segment))
        if answer is None or (search is not None and search[1] < answer[1]):
            kind, body = "search", search[0]
        else:
            kind, body = "answer", answer[0]
        if any(tag in body for tag in self.tags):
            return Action("invalid", reason=f"nested tag inside {kind}")
        body = _clean(body)
        if kind == "answer":
            if not body:
                return Action("invalid", reason="empty answer")
            evidence = None
            if self.evidence_open and self.evidence_close:
                before_answer = segment[: segment.index(self.answer_open)]
                found = _first_box(before_answer, self.evidence_open, self.evidence_close)
                evidence = _clean(found[0]) if found else None
            return Action("answer", answer=body, evidence=evidence)
        if not body:
            return Action("invalid", reason="empty query")
        if len(body) > self.max_query_chars:
            return Action("invalid", reason=f"query longer than {self.max_query_chars} characters")
        return Action("search", query=body)

    def _missing_reason(self, segment: str) -> str:
        if self.query_open in segment:
            return "unclosed query"
        if self.answer_open in segment:
            return "unclosed answer"
        if self.query_close in segment or self.answer_close in segment:
            return "closing tag without opening tag"
        return "no search or answer"

    # --- observations ------------------------------------------------------------------------------
    def format_passages(self, passages: Sequence[Passage]) -> str:
        """The body of an information block: one entry per passage, numbered from 1."""
        entries = []
        for i, p in enumerate(passages, start=1):
            contents = p.contents
            first_line, _, rest = contents.partition("\n")
            entries.append(
                self.passage_template.format(
                    i=i, title=p.title, text=p.text, contents=contents, first_line=first_line, rest=rest
                )
            )
        body = self.passage_separator.join(entries)
        return body.strip() if self.strip_passages else body

    def observation_parts(self, body: str) -> tuple[str, str, str]:
        """(head, body, tail) of an observation block; the env tokenises them so the tail survives
        truncation of a long body."""
        head = self.observation_prefix + self.observation_open + self.block_padding
        tail = self.block_padding + self.observation_close + self.observation_suffix
        return head, body, tail

    def format_observation(self, passages: Sequence[Passage]) -> str:
        """The whole information block for ``passages``, as inserted after a search."""
        return "".join(self.observation_parts(self.format_passages(passages)))

    def error_body(self, error: str) -> str:
        """The body of the observation that replaces results when the search engine failed."""
        return self.search_error_text.format(error=error)

    def check_format(self, turns: Sequence[Turn]) -> FormatCheck:
        """This protocol's format validity over the response's turns."""
        return self.format_checker(turns, self)

    # --- writing turns (teachers, demos, tests) -----------------------------------------------------
    def render_search(self, query: str, thought: str | None = None) -> str:
        """A well-formed search turn, as a model following this protocol would write it."""
        return f"{self._thought(thought)}{self.query_open} {query} {self.query_close}"

    def render_answer(self, answer: str, thought: str | None = None, evidence: str | None = None) -> str:
        """A well-formed answer turn (with the evidence box for protocols that have one)."""
        box = ""
        if evidence is not None and self.evidence_open and self.evidence_close:
            box = f"{self.evidence_open}{evidence}{self.evidence_close}\n"
        return f"{self._thought(thought)}{box}{self.answer_open} {answer} {self.answer_close}"

    def _thought(self, thought: str | None) -> str:
        if thought is None:
            return ""
        if self.think_open and self.think_close:
            return f"{self.think_open} {thought} {self.think_close}\n"
        return f"{thought}\n"


def _first_box(text: str, open_tag: str, close_tag: str) -> tuple[str, int] | None:
    """Body and end offset of the first ``open_tag ... close_tag`` box, or None."""
    start = text.find(open_tag)
    if start < 0:
        return None
    close = text.find(close_tag, start + len(open_tag))
    if close < 0:
        return None
    return text[start + len(open_tag) : close], close + len(close_tag)


def _clean(text: str) -> str:
    """Collapse whitespace and drop control characters (odd bytes must not reach a search engine)."""
    printable = "".join(" " if unicodedata.category(ch)[0] == "C" else ch for ch in text)
    return " ".join(printable.split())


SEARCH_R1 = Protocol(
    name="search_r1",
    # Search-R1 (arXiv 2503.09516), Table 1.
    instruction=(
        "Answer the given question. You must conduct reasoning inside <think> and </think> first every time "
        "you get new information. After reasoning, if you find you lack some knowledge, you can call a "
        "search engine by <search> query </search>, and it will return the top searched results between "
        "<information> and </information>. You can search as many times as you want. If you find no further "
        "external knowledge needed, you can directly provide the answer inside <answer> and </answer> "
        "without detailed illustrations. For example, <answer> Beijing </answer>. Question: {question}\n"
    ),
    query_open="<search>",
    query_close="</search>",
    observation_open="<information>",
    observation_close="</information>",
    # Search-R1's rollout (search_r1/llm_agent/generation.py: _passages2string, execute_predictions): each
    # passage's contents split at its first newline, the title line kept as is (quotes included), the
    # lines joined and stripped; its text for an invalid action. Differences: the module docstring.
    passage_template="Doc {i}(Title: {first_line}) {rest}",
    strip_passages=True,
    rethink_text=(
        "\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
        "</search>. If I want to give the final answer, I should put the answer between <answer> and "
        "</answer>. Let me try again.\n"
    ),
    format_checker=state_machine_format,
)

# Search-R1's tags, observations, invalid-action text and format check with a short instruction, sent as the
# system message (it replaces the chat template's default one): 76 prompt tokens with SmolLM2's template
# where Table 1's wording takes 164. For small models that learn the tags from demonstrations anyway, and
# CPU runs, where the prompt is half of every warm-start sequence (tuned_examples/tiny_cpu_grpo.py).
SEARCH_R1_COMPACT = replace(
    SEARCH_R1,
    name="search_r1_compact",
    instruction=(
        "Answer the question. Think inside <think> </think>, search with <search> query </search> (results "
        "come back inside <information> </information>) and give the final answer inside <answer> </answer>."
    ),
)

R1_SEARCHER = Protocol(
    name="r1_searcher",
    # R1-Searcher (arXiv 2503.05592), the system prompt for the base model (section 2.2.2).
    instruction=(
        "The User asks a question, and the Assistant solves it. The Assistant first thinks about the "
        "reasoning process in the mind and then provides the User with the final answer. The output format "
        "of reasoning process and final answer are enclosed within <think> </think> and <answer> </answer> "
        'tags, respectively, i.e., "<think> reasoning process here </think><answer> final answer here '
        '</answer>". During the thinking process, **the Assistant can perform searching** for uncertain '
        'knowledge if necessary with the format of "<|begin_of_query|> search query (only list keywords, '
        'such as "keyword_1 keyword_2 ...")<|end_of_query|>". **A query must involve only a single '
        "triple**. Then, the search system will provide the Assistant with the retrieval information with "
        'the format of "<|begin_of_documents|> ...search results... <|end_of_documents|>".'
    ),
    query_open="<|begin_of_query|>",
    query_close="<|end_of_query|>",
    observation_open="<|begin_of_documents|>",
    observation_close="<|end_of_documents|>",
    passage_template="({i}){contents}",
    block_padding="\n",
    observation_prefix="\n",
    observation_suffix="\n",
    format_checker=r1_searcher_format,
)

R_SEARCH = Protocol(
    name="r_search",
    # R-Search, Table 1 (system template; the question follows as the user message).
    instruction=(
        "You are a helpful assistant that can solve the given question step by step. For each step, start by "
        "explaining your thought process. If additional information is needed, provide a specific query "
        "enclosed in <search> and </search>. The system will return the top search results within "
        "<observation> and </observation>. You can perform multiple searches as needed. When you know the "
        "final answer, use <original_evidence> and </original_evidence> to provide all potentially relevant "
        "original information from the observations. Ensure the information is complete and preserves the "
        "original wording without modification. If no searches were conducted or observations were made, "
        "omit the evidence section. Finally, provide the final answer within <answer> and </answer> tags."
    ),
    query_open="<search>",
    query_close="</search>",
    observation_open="<observation>",
    observation_close="</observation>",
    evidence_open="<original_evidence>",
    evidence_close="</original_evidence>",
    passage_template='(Title: "{title}") {text}',
    passage_separator="\n\n",
    think_open=None,
    think_close=None,
    observation_prefix="\n\n",
    observation_suffix="\n\n",
    format_checker=r_search_format,
)

_PROTOCOLS: dict[str, Protocol] = {}


def register_protocol(protocol: Protocol, *, overwrite: bool = False) -> Protocol:
    """Make ``protocol`` selectable by its name (``get_protocol`` and env configs)."""
    if protocol.name in _PROTOCOLS and not overwrite:
        raise ValueError(f"a protocol named {protocol.name!r} is already registered")
    _PROTOCOLS[protocol.name] = protocol
    return protocol


def get_protocol(protocol: str | Protocol) -> Protocol:
    """A protocol by name (``search_r1``, ``search_r1_compact``, ``r1_searcher``, ``r_search`` or a registered
    one)."""
    if isinstance(protocol, Protocol):
        return protocol
    try:
        return _PROTOCOLS[protocol]
    except KeyError:
        raise ValueError(f"unknown protocol {protocol!r}; known: {sorted(_PROTOCOLS)}") from None


def protocol_names() -> list[str]:
    return sorted(_PROTOCOLS)


for _builtin in (SEARCH_R1, SEARCH_R1_COMPACT, R1_SEARCHER, R_SEARCH):
    register_protocol(_builtin)
