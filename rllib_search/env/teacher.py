"""A teacher that writes the turns a perfect search agent would, in any protocol.

Questions of the synthetic world carry their chain of hops (``extra["hops"]``: the query to issue at each
hop and the entity it finds), so the teacher searches once per hop and then answers, quoting the
retrieved lines that hold each hop's answer as evidence where the protocol has an evidence box. Its
segments serve as demonstrations (warm starts) and as a known-good policy in demos and tests.

With ``state_plan`` its first thought names every hop ("I need to search for X birthplace, then its
country."), so the choice to search again is written down where the question is read rather than made
after the retrieved passages: measured on the CPU main job, SmolLM2-135M warm-started this way searches
again more often on 2-hop than on 1-hop questions, while without the plan its chance of a second search
was the same for both (a property of the question it never learned to read at that point).

With ``early_answer`` = p it is a hesitant teacher: on a fraction p of multi-hop questions (chosen by a hash
of the question's uid and ``seed``, so the same demonstrations every run; after ``fix_early_answers(records)``
exactly round(p x n) of those records' n multi-hop questions) it stops after the first hop and
answers with the entity that hop found, which is wrong. A model imitating it learns how to chain searches
(the other demonstrations show it) but searches again on a multi-hop question with a chance of about 1 - p:
greedy decoding answers early, sampling sometimes goes on and reaches the answer. That is the partial skill
RL's EM reward can lift (GRPO needs successes inside a group), rather than one SFT already completes.

With ``lazy_plan`` (with ``state_plan`` and ``early_answer``) the hesitant teacher says so where it plans: its
first thought on the questions it answers early is "I need to search for X, then answer." So a plan that
goes on (", then") is written for every multi-hop question and never for a one-hop one (a clean target for
the first fork), while the second (" its" next hop or " answer") is where the teacher hesitates, and only
plans of multi-hop questions reach it. (Measured in the main job, SmolLM2-135M does not yet learn this
split in 12 SFT steps: ``tuned_examples/tiny_cpu_grpo.py``.)

With ``echo_plan`` (with ``state_plan``) every plan ends its clauses with ", then answer" (one hop: "I need to
search for X founder, then answer."), and each thought after an observation restates the plan's next clause
("The results say Taros, then its country. Next I need Taros country." or "The results say Taros, then
answer."). The choice to search again is then a copy of the plan's word after "then" rather than a guess
from the passages. Why: in the main job, RL that credited only the plan (on a lazy-plan warm start) made
18 of 19 held-out two-hop plans say "then its ...", and 18 of those episodes still searched once: without
the echo, what the model does after a search does not follow its plan.

With both ``echo_plan`` and ``lazy_plan`` (the lazy echo), a one-hop plan states no clause ("I need to search
for X founder.", then "The results say Taros."), while multi-hop plans are echoed as above, the hesitant
teacher's ending ", then answer.". The plans then part in two places, as with the lazy plan: "." or "," (the
number of hops, which the question tells) and, on multi-hop plans only, " its" or " answer" (where the
teacher hesitates); and execution copies the plan as with the echo. Why: RL that lifts " its" on multi-hop
questions then has no token to move on one-hop ones, whose plans never reach ", then" (greedy decoding
keeps their "." while it stays the likelier token).

``alternatives`` gives, for each turn, the other turns this teacher writes at that point for questions that
need a different number of further hops; the first token where a demonstration's turn departs from one of
them is a decision token (``algos/rollouts/demonstrations.py`` weights its NLL).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from itertools import pairwise

from rllib_search.data.records import QARecord
from rllib_search.env.protocols import Protocol


class TeacherPolicy:
    """Writes one segment per turn for questions that carry ``extra["hops"]``."""

    def __init__(
        self,
        protocol: Protocol,
        state_plan: bool = False,
        early_answer: float = 0.0,
        seed: int = 0,
        lazy_plan: bool = False,
        echo_plan: bool = False,
    ) -> None:
        if not 0.0 <= early_answer <= 1.0:
            raise ValueError(f"early_answer must be in [0, 1], got {early_answer}")
        if lazy_plan and not state_plan:
            raise ValueError("lazy_plan changes the stated plan: it needs state_plan=True")
        if echo_plan and not state_plan:
            raise ValueError("echo_plan restates the stated plan: it needs state_plan=True")
        self.protocol = protocol
        self.state_plan = state_plan
        self.early_answer = early_answer
        self.seed = seed
        self.lazy_plan = lazy_plan
        self.echo_plan = echo_plan
        self._fixed_early: dict[str, bool] = {}

    def fix_early_answers(self, records: Sequence[QARecord]) -> None:
        """Answer early on exactly round(``early_answer`` x n) of the n multi-hop questions in ``records``
        rather than on each with that chance: those with the lowest hash of uid and seed. Why: the warm
        start's chance of a second hop is steep in the realised rate, which independent draws scatter.
        Other questions keep the independent draw."""
        multi = [record for record in records if len(hops_of(record)) >= 2]
        count = round(self.early_answer * len(multi))
        ranked = sorted(multi, key=self._draw)
        self._fixed_early = {record.uid: rank < count for rank, record in enumerate(ranked)}

    def answers_early(self, record: QARecord) -> bool:
        """Whether this teacher stops after the first hop of ``record`` (multi-hop questions only)."""
        if self.early_answer <= 0.0 or len(hops_of(record)) < 2:
            return False
        if record.uid in self._fixed_early:
            return self._fixed_early[record.uid]
        return self._draw(record) < self.early_answer

    def _draw(self, record: QARecord) -> float:
        """A number in [0, 1) fixed by the question's uid and this teacher's seed."""
        return self._draw_text(record.uid)

    def _draw_text(self, text: str) -> float:
        """A number in [0, 1) fixed by ``text`` and this teacher's seed."""
        digest = hashlib.sha256(f"{self.seed}:{text}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64

    def segment(self, record: QARecord, turn: int, retrieved_blocks: Sequence[str]) -> str:
        """The text of turn ``turn`` (0-based) given the observation bodies seen so far."""
        hops = hops_of(record)
        early = self.answers_early(record)
        if early:
            hops = hops[:1]
        clauses = self._echoed_clauses(record, hops) if self.echo_plan else []
        if turn < len(hops):
            query = hops[turn]["query"]
            if turn == 0:
                if self.echo_plan:
                    return self._plan(query, "".join(clauses))
                rest = ", then answer" if early and self.lazy_plan else self._rest_of_plan(hops)
                return self._plan(query, rest)
            echo = clauses[turn - 1] if self.echo_plan else ""
            return self._search_next(hops[turn - 1]["answer"], query, echo)
        answer = hops[0]["answer"] if early else record.golden_answers[0]
        last_found = hops[-1]["answer"] if hops else answer
        evidence = self._evidence(hops, retrieved_blocks) if hops else None
        echo = clauses[-1] if self.echo_plan and hops else ""
        return self.protocol.render_answer(
            answer, thought=f"The results say {last_found}{echo}.", evidence=evidence
        )

    def alternatives(self, record: QARecord, turn: int) -> list[str]:
        """The other texts this teacher writes at turn ``turn`` for a question that needs a different number
        of hops. With ``state_plan`` the decision is the plan's (turn 0: the plans of one hop, of more hops
        and, with ``lazy_plan``, of one hop then an answer) and later turns carry it out; without, it is
        made after each search (the answer where it searches again, a search where it answers). Where an
        alternative needs a query or relation this question does not have, a placeholder stands in: only
        the first token where two texts differ (the decision) is meant to be read."""
        hops = hops_of(record)[:1] if self.answers_early(record) else hops_of(record)
        if self.echo_plan:
            return self._echo_alternatives(record, turn, hops)
        if self.state_plan:
            if turn != 0 or not hops:
                return []
            query = hops[0]["query"]
            rests = ["", self._rest_of_plan(hops) or ", then its next relation"]
            rests += [", then answer"] if self.lazy_plan else []
            actual = self.segment(record, 0, [])
            return [text for text in dict.fromkeys(self._plan(query, r) for r in rests) if text != actual]
        if turn == 0 or turn > len(hops):
            return []  # the first search is the same for every question; nothing follows the answer
        found = hops[turn - 1]["answer"]
        if turn < len(hops):  # it searches again; the alternative answers with what it found
            return [self.protocol.render_answer(found, thought=f"The results say {found}.")]
        return [self._search_next(found, f"{found} next")]  # it answers; the alternative searches again

    def _echo_alternatives(self, record: QARecord, turn: int, hops: Sequence[dict[str, str]]) -> list[str]:
        """With ``echo_plan``: at the plan, the plan of one hop or of more (" answer" vs " its"); after each
        observation, the echo of the other clause (the answer where it searches again, another search where
        it answers)."""
        if not hops or turn > len(hops):
            return []
        if turn == 0:
            query = hops[0]["query"]
            more = self._rest_of_plan(hops) or ", then its next relation"
            plans = [self._plan(query, ", then answer"), self._plan(query, more + ", then answer")]
            plans += [self._plan(query, "")] if self.lazy_plan else []
            actual = self.segment(record, 0, [])
            return [text for text in dict.fromkeys(plans) if text != actual]
        found = hops[turn - 1]["answer"]
        if turn < len(hops):
            return [self.protocol.render_answer(found, thought=f"The results say {found}, then answer.")]
        return [self._search_next(found, f"{found} next", ", then its next relation")]

    def _echoed_clauses(self, record: QARecord, hops: Sequence[dict[str, str]]) -> list[str]:
        """With ``echo_plan``: the plan's clauses after the first search, ", then its <relation>" for each
        later hop and ", then answer"; the thought after the k-th observation restates the k-th. With
        ``lazy_plan`` a one-hop question's plan has none (an empty clause)."""
        if self.lazy_plan and len(hops_of(record)) == 1:
            return [""]
        relations = self._rest_of_plan(hops)
        return [f", then its{clause}" for clause in relations.split(", then its")[1:]] + [", then answer"]

    def _plan(self, query: str, rest: str) -> str:
        return self.protocol.render_search(query, thought=f"I need to search for {query}{rest}.")

    def _search_next(self, found: str, query: str, echo: str = "") -> str:
        return self.protocol.render_search(
            query, thought=f"The results say {found}{echo}. Next I need {query}."
        )

    def _rest_of_plan(self, hops: Sequence[dict[str, str]]) -> str:
        """The ", then its <relation>" for each later hop when stating the plan (the relation is the hop's
        query without the entity the previous hop finds, which the plan cannot know yet)."""
        if not self.state_plan:
            return ""
        relations = []
        for previous, hop in pairwise(hops):
            query, entity = hop["query"], previous["answer"]
            relations.append(query[len(entity) :].strip() if query.startswith(entity) else query)
        return "".join(f", then its {relation}" for relation in relations)

    def _evidence(self, hops: Sequence[dict[str, str]], retrieved_blocks: Sequence[str]) -> str:
        passages = [
            p for block in retrieved_blocks for p in block.split(self.protocol.passage_separator) if p
        ]
        quoted: list[str] = []
        for hop in hops:
            found = next((p for p in passages if hop["answer"].lower() in p.lower()), None)
            if found is not None and found not in quoted:
                quoted.append(found.strip())
        return " ".join(quoted) if quoted else "No relevant information was found."


def hops_of(record: QARecord) -> list[dict[str, str]]:
    """The record's hop chain (``[{"query", "answer"}, ...]``), empty when it has none."""
    hops = record.extra.get("hops") or []
    return [{"query": str(h["query"]), "answer": str(h["answer"])} for h in hops]
