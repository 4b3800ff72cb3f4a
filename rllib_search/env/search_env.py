"""MultiTurnSearchEnv: one episode of a model reasoning, searching and answering, one model turn per step.

Spaces (the sequences are ragged, so both use ``gymnasium.spaces.Sequence(Discrete(V), stack=True)``: a
sample is a 1-D int64 array of any length, V the tokenizer's vocabulary size):

- action: the token ids of ONE generated segment (a model turn, ending at a stop string or EOS);
- observation: the token ids the env appends after it; on ``reset`` the prompt; after a search the
  information block; after an invalid action the protocol's rethink text; empty when the episode ends.

The trajectory (all ids, with a parallel loss mask: 1 on generated tokens, 0 on prompt and on everything
the env inserted) is ``env.trajectory``. Budgets, all in tokens and documented once in
:class:`SearchEnvConfig`: ``max_turns`` model turns, ``max_obs_tokens`` per observation and
``max_total_tokens`` for the whole trajectory (prompt included); crossing one ends the episode with
``truncated=True``.

Stepping one env is ``step``. A runner that advances many episodes per turn uses the two halves,
``submit`` (parse the segment) and ``resolve`` (append the search results), with :func:`step_batch` sending
every query of the turn to the retriever in one call.

Scoring a finished episode may need an evidence judge (R-Search's evidence reward). :func:`score_episodes`
scores any number of finished episodes with ONE judge call for all of them; ``step`` and ``step_batch``
score the episodes that end in that turn, and a runner that wants one judge call per sample passes
``score=False`` to ``step_batch`` and calls ``score_episodes`` once at the end.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from rllib_search.data.records import QARecord
from rllib_search.data.retrieval import Passage, Retriever
from rllib_search.env.judge import EvidenceJudge, as_judge
from rllib_search.env.protocols import Action, Protocol, get_protocol
from rllib_search.env.rewards import (
    DEFAULT_REWARD_FOR_PROTOCOL,
    REWARDS_USING_EVIDENCE_JUDGE,
    ResponseSummary,
    RewardBreakdown,
    make_reward,
)
from rllib_search.env.trajectory import Trajectory

logger = logging.getLogger(__name__)

ENV_ID = "rllib_search/MultiTurnSearch-v0"


@dataclass(frozen=True)
class SearchEnvConfig:
    """Everything that shapes an episode. Token budgets are counted in tokens, never characters.

    - ``max_turns``: the most model turns (generated segments); the episode is truncated after the last one
      unless it answered, and a search on the last turn is not executed.
    - ``max_obs_tokens``: the most tokens of one observation; a longer information block is cut inside its
      passages and keeps its closing tag.
    - ``max_total_tokens``: the whole trajectory (prompt + generated + observations); reaching it truncates
      the episode. A runner should cap each generation at ``min(its per-turn limit, env.remaining_tokens)``.
    - ``topk``: passages per search.
    - ``reward``: a reward name from :data:`rllib_search.env.rewards.REWARDS` (default: the protocol's own),
      with ``reward_config`` as a dict of its config fields.
    - ``use_chat_template``: render the prompt through the tokenizer's chat template (None: when it has one).
    """

    protocol: str | Protocol = "search_r1"
    max_turns: int = 4
    max_obs_tokens: int = 500
    max_total_tokens: int = 4096
    topk: int = 3
    reward: str | None = None
    reward_config: Mapping[str, Any] = field(default_factory=dict)
    use_chat_template: bool | None = None

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_obs_tokens", "max_total_tokens", "topk"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> SearchEnvConfig:
        known = set(cls.__dataclass_fields__)
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"unknown env config keys {sorted(unknown)}; known: {sorted(known)}")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        if isinstance(self.protocol, Protocol):
            values["protocol"] = self.protocol.name
        return values


@dataclass(frozen=True)
class StepResult:
    """What ``step`` returns, as a record: (observation, reward, terminated, truncated, info)."""

    observation: np.ndarray
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]

    def as_tuple(self) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        return self.observation, self.reward, self.terminated, self.truncated, self.info


class MultiTurnSearchEnv(gym.Env):
    """A multi-turn search episode over token ids (see the module docstring for spaces and budgets).

    ``tokenizer`` is a Hugging Face tokenizer (or a path/name to load one); ``retriever`` anything with
    ``search(queries, topk) -> list[list[Passage]]``; ``dataset`` the questions ``reset`` draws from (or
    pass ``options={"record": QARecord}`` to ``reset``); ``judge`` the evidence judge for ``r_search`` (an
    :class:`~rllib_search.env.judge.EvidenceJudge` or a callable ``(question, evidence) -> answer``).
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"]}

    def __init__(
        self,
        tokenizer: Any,
        retriever: Retriever | None = None,
        dataset: Sequence[QARecord] | None = None,
        config: SearchEnvConfig | Mapping[str, Any] | None = None,
        judge: EvidenceJudge | Any = None,
        render_mode: str | None = None,
    ) -> None:
        if isinstance(tokenizer, str):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        if config is None:
            config = SearchEnvConfig()
        elif isinstance(config, Mapping):
            config = SearchEnvConfig.from_dict(config)
        self.config = config
        self.protocol = get_protocol(config.protocol)
        self.tokenizer = tokenizer
        self.retriever = retriever
        self.dataset = list(dataset) if dataset is not None else []
        self.render_mode = render_mode

        reward_name = config.reward or DEFAULT_REWARD_FOR_PROTOCOL.get(self.protocol.name, "search_r1")
        self.reward_fn = make_reward(reward_name, dict(config.reward_config))
        self.reward_name = reward_name
        self.judge = as_judge(judge)

        vocab = len(tokenizer)
        self.observation_space = spaces.Sequence(spaces.Discrete(vocab), stack=True)
        self.action_space = spaces.Sequence(spaces.Discrete(vocab), stack=True)
        # Special tokens that are not protocol tags (EOS, padding) carry no text of the protocol.
        self._strip_tokens = [t for t in tokenizer.all_special_tokens if t not in self.protocol.tags]
        self._use_chat_template = (
            config.use_chat_template
            if config.use_chat_template is not None
            else bool(getattr(tokenizer, "chat_template", None))
        )
        self._next_record = 0
        self._reset_episode_state(None)

    # --- episode state -----------------------------------------------------------------------------------
    def _reset_episode_state(self, record: QARecord | None) -> None:
        self.record = record
        self.trajectory = Trajectory()
        self.turns = 0
        self.done = False
        self.pending_query: str | None = None
        self.last_action: Action | None = None
        self.answer: str | None = None
        self.evidence: str | None = None
        self.retrieved_blocks: list[str] = []
        self.reward_breakdown: RewardBreakdown | None = None
        self.evidence_answer: str | None = None
        self._last_step: tuple[list[int], bool, bool] = ([], False, False)
        self.stats = {
            "searches": 0,
            "invalid_actions": 0,
            "retriever_errors": 0,
            "observation_truncations": 0,
        }

    @property
    def remaining_tokens(self) -> int:
        """Tokens left in the whole-trajectory budget."""
        return max(0, self.config.max_total_tokens - len(self.trajectory))

    # --- gymnasium API -----------------------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Start an episode on ``options["record"]`` or the next question of the dataset.

        Returns the prompt's token ids (the question in the protocol's template, through the chat template
        where the tokenizer has one) and an info dict with the record.
        """
        super().reset(seed=seed)
        record = self._pick_record(options or {})
        self._reset_episode_state(record)
        prompt_text, prompt_ids = self.render_prompt(record.question)
        if len(prompt_ids) >= self.config.max_total_tokens:
            raise ValueError(
                f"the prompt of {record.uid} has {len(prompt_ids)} tokens, "
                f"max_total_tokens is {self.config.max_total_tokens}"
            )
        self.trajectory.append("prompt", prompt_ids, prompt_text)
        info = {"uid": record.uid, "question": record.question, "prompt_length": len(prompt_ids)}
        return np.asarray(prompt_ids, dtype=np.int64), info

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Advance one model turn: ``action`` is the token ids of one generated segment (or a mapping with
        ``token_ids`` and optional ``logprobs``)."""
        token_ids, logprobs = _unpack_action(action)
        self.submit(token_ids, logprobs)
        if self.pending_query is None:
            return self.resolve().as_tuple()
        return step_batch_resolve([self], self.retriever)[0].as_tuple()

    def render(self) -> str | None:
        if self.render_mode == "ansi":
            return self.trajectory.response_text()
        return None

    # --- the two halves of a step ------------------------------------------------------------------------
    def submit(self, token_ids: Sequence[int], logprobs: Sequence[float] | None = None) -> Action:
        """Append one generated segment and parse it. Afterwards ``pending_query`` holds the query to run
        when the segment is an executable search; call :meth:`resolve` (with its passages) next."""
        if self.done:
            raise RuntimeError("the episode is over: call reset()")
        if self.record is None:
            raise RuntimeError("call reset() before step()")
        ids = self._validate_ids(token_ids)
        text = self._decode(ids)
        self.trajectory.append("generated", ids, text, logprobs)
        self.turns += 1
        action = self.protocol.parse_action(text)
        self.last_action = action
        if action.kind == "answer":
            self.answer, self.evidence = action.answer, action.evidence
        elif action.kind == "invalid":
            self.stats["invalid_actions"] += 1
        can_continue = self.turns < self.config.max_turns and self.remaining_tokens > 0
        self.pending_query = action.query if action.kind == "search" and can_continue else None
        return action

    def resolve(
        self, passages: Sequence[Passage] | None = None, error: str | None = None, *, score: bool = True
    ) -> StepResult:
        """Finish the turn opened by :meth:`submit`: append the observation (the passages found for
        ``pending_query``, an error block when the search failed, or the rethink text). When the episode
        ends it is scored, unless ``score=False`` (then :func:`score_episodes` scores it later, and the
        returned reward is 0 until then)."""
        action = self.last_action
        if action is None or self.done:
            raise RuntimeError("resolve() must follow submit() on a running episode")
        terminated = action.kind == "answer"
        truncated = False
        obs_ids: list[int] = []
        if not terminated:
            if self.turns >= self.config.max_turns or self.remaining_tokens == 0:
                truncated = True
            elif self.pending_query is not None:
                if error is not None or passages is None:
                    self.stats["retriever_errors"] += 1
                    body = self.protocol.error_body(error or "no results returned")
                else:
                    self.stats["searches"] += 1
                    body = self.protocol.format_passages(passages)
                obs_ids = self._append_observation(*self.protocol.observation_parts(body), is_search=True)
            else:
                obs_ids = self._append_observation("", self.protocol.rethink_text, "", is_search=False)
            truncated = truncated or (not terminated and self.remaining_tokens == 0)
        self.pending_query = None
        self._last_step = (obs_ids, terminated, truncated)
        if terminated or truncated:
            self.done = True
            if score:
                score_episodes([self])
        return self.last_step_result()

    def last_step_result(self) -> StepResult:
        """The result of the last resolved turn; its reward is the episode's once the episode is scored."""
        obs_ids, terminated, truncated = self._last_step
        reward = self.reward_breakdown.total if self.done and self.reward_breakdown is not None else 0.0
        return StepResult(
            np.asarray(obs_ids, dtype=np.int64), reward, terminated, truncated, self._step_info()
        )

    @property
    def awaits_score(self) -> bool:
        """The episode ended but is not scored yet (``resolve(score=False)``)."""
        return self.done and self.reward_breakdown is None

    @property
    def needs_judge(self) -> bool:
        """Scoring this finished episode asks the evidence judge: its reward has an evidence term, a judge
        is configured and the response holds a non-empty evidence box."""
        return (
            self.reward_name in REWARDS_USING_EVIDENCE_JUDGE
            and self.judge is not None
            and bool((self.evidence or "").strip())
        )

    # --- helpers ------------------------------------------------------------------------------------------
    def render_prompt(self, question: str) -> tuple[str, list[int]]:
        """The prompt text and its token ids for ``question``."""
        messages = self.protocol.prompt_messages(question)
        if self._use_chat_template:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        else:
            text = "\n\n".join(m["content"] for m in messages) + "\n"
            ids = self.tokenizer(text, add_special_tokens=True)["input_ids"]
        return text, list(ids)

    def _pick_record(self, options: dict[str, Any]) -> QARecord:
        record = options.get("record")
        if isinstance(record, Mapping):
            record = QARecord(
                id=str(record.get("id", "0")),
                question=str(record["question"]),
                golden_answers=[str(a) for a in record.get("golden_answers", [])],
                data_source=str(record.get("data_source", "unknown")),
            )
        if record is not None:
            return record
        if not self.dataset:
            raise ValueError("no dataset: pass one to the env or options={'record': ...} to reset()")
        if "index" in options:
            return self.dataset[int(options["index"]) % len(self.dataset)]
        index = int(self.np_random.integers(len(self.dataset)))
        return self.dataset[index]

    def _validate_ids(self, token_ids: Sequence[int]) -> list[int]:
        ids = [int(i) for i in np.asarray(token_ids, dtype=np.int64).reshape(-1)]
        bad = [i for i in ids if not 0 <= i < self.action_space.feature_space.n]
        if bad:
            raise ValueError(
                f"token ids outside the vocabulary [0, {self.action_space.feature_space.n}): {bad[:5]}"
            )
        return ids

    def _decode(self, ids: list[int]) -> str:
        """The text of a generated segment, protocol tags kept, EOS/padding dropped."""
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        for token in self._strip_tokens:
            text = text.replace(token, "")
        return text

    def _append_observation(self, head: str, body: str, tail: str, *, is_search: bool) -> list[int]:
        """Tokenise the observation once, fit it to the budgets and append it (loss mask 0).

        When it is too long, its ids are cut inside the body and the tail's ids (closing tag) are
        appended, so the block stays closed for the model and for the format check.
        """
        text = head + body + tail
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        limit = min(self.config.max_obs_tokens, self.remaining_tokens)
        if len(ids) > limit:
            self.stats["observation_truncations"] += 1
            tail_ids = self.tokenizer(tail, add_special_tokens=False)["input_ids"] if tail else []
            if len(tail_ids) >= limit:
                ids, tail_ids = ids[:limit], []
            else:
                ids = ids[: limit - len(tail_ids)]
            kept = self.tokenizer.decode(ids, skip_special_tokens=False)
            ids = list(ids) + list(tail_ids)
            body = kept[len(head) :] if kept.startswith(head) else kept
            text = kept + (tail if tail_ids else "")
        self.trajectory.append("observation", ids, text)
        if is_search:
            self.retrieved_blocks.append(body)
        return list(ids)

    def summary(self, evidence_answer: str | None = None, judge_error: str | None = None) -> ResponseSummary:
        """What the response said and saw, for the reward (with the evidence judge's answer or error)."""
        check = self.protocol.check_format(self.trajectory.response_turns())
        return ResponseSummary(
            question=self.record.question if self.record else "",
            answer=self.answer,
            evidence=self.evidence,
            num_searches=self.stats["searches"],
            retrieved_blocks=tuple(self.retrieved_blocks),
            format_valid=check.valid,
            format_reason=check.reason,
            evidence_answer=evidence_answer,
            judge_error=judge_error,
        )

    def score(self, evidence_answer: str | None = None, judge_error: str | None = None) -> RewardBreakdown:
        """Score the finished episode (``evidence_answer``/``judge_error``: what the evidence judge said);
        call :func:`score_episodes` rather than this to have the judge asked."""
        if not self.done:
            raise RuntimeError("score() needs a finished episode")
        self.evidence_answer = evidence_answer
        summary = self.summary(evidence_answer, judge_error)
        golds = self.record.golden_answers if self.record else []
        try:
            self.reward_breakdown = self.reward_fn(summary, golds)
        except Exception as error:  # a broken user reward must not kill a rollout: score 0, say why
            logger.exception("reward %s failed", self.reward_name)
            self.reward_breakdown = RewardBreakdown(0.0, {"reward_error": 1.0}, {"reward": str(error)})
        self.response_summary = summary
        return self.reward_breakdown

    def _step_info(self) -> dict[str, Any]:
        action = self.last_action
        info: dict[str, Any] = {
            "turn": self.turns,
            "action": action.kind if action else None,
            **self.stats,
        }
        if action is not None and action.kind == "invalid":
            info["invalid_reason"] = action.reason
        if action is not None and action.kind == "search":
            info["query"] = action.query
        if self.done and self.reward_breakdown is not None:
            info.update(
                answer=self.answer,
                reward_components=dict(self.reward_breakdown.components),
                reward_notes=dict(self.reward_breakdown.notes),
                format_valid=self.response_summary.format_valid,
                format_reason=self.response_summary.format_reason,
                evidence_answer=self.evidence_answer,
                generated_tokens=self.trajectory.num_generated_tokens,
                observation_tokens=self.trajectory.num_observation_tokens,
            )
        return info


def _unpack_action(action: Any) -> tuple[Sequence[int], Sequence[float] | None]:
    if isinstance(action, Mapping):
        return action["token_ids"], action.get("logprobs")
    return action, None


def step_batch_resolve(
    envs: Sequence[MultiTurnSearchEnv], retriever: Retriever | None, *, score: bool = True
) -> list[StepResult]:
    """Resolve the turn of every env (after ``submit``), running all pending queries in ONE retriever call
    per distinct ``topk``. A retriever failure becomes an error observation for those episodes. Episodes
    that end are scored together (one judge call), unless ``score=False``."""
    by_topk: dict[int, list[int]] = {}
    for index, env in enumerate(envs):
        if env.pending_query is None:
            env.resolve(score=False)
        else:
            by_topk.setdefault(env.config.topk, []).append(index)
    for topk, indices in by_topk.items():
        queries = [envs[i].pending_query or "" for i in indices]
        found, error = _search(retriever, queries, topk)
        for position, i in enumerate(indices):
            envs[i].resolve(found[position] if found else None, error, score=False)
    if score:
        score_episodes(envs)
    return [env.last_step_result() for env in envs]


def step_batch(
    envs: Sequence[MultiTurnSearchEnv],
    actions: Sequence[Any],
    retriever: Retriever | None = None,
    *,
    score: bool = True,
) -> list[StepResult]:
    """Advance many episodes by one turn each: parse every segment, then one retriever call for the turn.

    ``retriever`` defaults to the first env's. Each env must be running (not ``done``). Episodes that end
    are scored with one judge call for all of them; ``score=False`` leaves them to :func:`score_episodes`.
    """
    if len(envs) != len(actions):
        raise ValueError(f"{len(envs)} envs but {len(actions)} actions")
    for env, action in zip(envs, actions):
        env.submit(*_unpack_action(action))
    return step_batch_resolve(envs, retriever if retriever is not None else envs[0].retriever, score=score)


@dataclass
class JudgeReport:
    """What :func:`score_episodes` asked of the evidence judge: calls, prompts, failed prompts, seconds."""

    calls: int = 0
    prompts: int = 0
    errors: int = 0
    seconds: float = 0.0


def score_episodes(envs: Sequence[MultiTurnSearchEnv]) -> JudgeReport:
    """Score every finished, unscored episode of ``envs``, asking each evidence judge ONCE for all the
    episodes that need it (R-Search's evidence term). A judge failure costs those episodes their evidence
    term (scored 0, ``judge_error`` 1, logged) and never the run."""
    report = JudgeReport()
    pending = [env for env in envs if env.awaits_score]
    by_judge: dict[int, list[MultiTurnSearchEnv]] = {}
    for env in pending:
        if env.needs_judge:
            by_judge.setdefault(id(env.judge), []).append(env)
    answers: dict[int, tuple[str | None, str | None]] = {}
    for group in by_judge.values():
        judge = group[0].judge
        questions = [env.record.question if env.record else "" for env in group]
        evidences = [env.evidence or "" for env in group]
        started = time.perf_counter()
        try:
            judged = list(judge.answer_evidence(questions, evidences))
            if len(judged) != len(group):
                raise RuntimeError(f"the judge returned {len(judged)} answers for {len(group)} questions")
            results = [(str(answer), None) for answer in judged]
        except Exception as error:  # the judge failing costs these samples their evidence term, not the run
            logger.warning("evidence judge failed on %d episodes: %s", len(group), error)
            results = [(None, f"{type(error).__name__}: {error}")] * len(group)
            report.errors += len(group)
        report.seconds += time.perf_counter() - started
        report.calls += 1
        report.prompts += len(group)
        for env, result in zip(group, results):
            answers[id(env)] = result
    for env in pending:
        env.score(*answers.get(id(env), (None, None)))
    return report


def _search(
    retriever: Retriever | None, queries: list[str], topk: int
) -> tuple[list[list[Passage]] | None, str | None]:
    if retriever is None:
        return None, "no retriever configured"
    try:
        found = retriever.search(queries, topk)
    except Exception as error:  # the search engine failing must cost these samples a search, not the run
        logger.warning("retriever failed on %d queries: %s", len(queries), error)
        return None, f"{type(error).__name__}: {error}"
    if len(found) != len(queries):
        return None, f"retriever returned {len(found)} result lists for {len(queries)} queries"
    return [list(passages)[:topk] for passages in found], None
