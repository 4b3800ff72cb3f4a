"""Evaluation: the metrics function with bootstrap intervals, Search-R1's observation bytes, and
``rllib-search eval`` end to end (Search-R1 parquet, BM25 corpus, tiny models, an RLlib checkpoint)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rllib_search.algos.evaluation.scores import (
    aggregate,
    nested_bootstrap,
    paired_gain,
    per_question_metrics,
    power,
    score_predictions,
)
from rllib_search.data.formats import iter_passages, read_corpus
from rllib_search.data.records import QARecord
from rllib_search.data.retrieval import Passage
from rllib_search.env.protocols import R1_SEARCHER, R_SEARCH, SEARCH_R1
from rllib_search.env.search_env import MultiTurnSearchEnv
from rllib_search.serve.retrieval.bm25 import BM25Retriever

# --- the metrics function ------------------------------------------------------------------------------


def test_metrics_per_group_average_and_pooled_by_hand():
    predictions = ["Paris", "the  Paris!", "London city", None, "Rome"]
    golds = [["Paris"], ["paris"], ["London"], ["Berlin"], ["Oslo", "Rome"]]
    values = per_question_metrics(predictions, golds)
    assert values["em"].tolist() == [1, 1, 0, 0, 1]
    assert values["cover_em"].tolist() == [1, 1, 1, 0, 1]
    assert values["f1"].tolist() == pytest.approx([1, 1, 2 * 1 / (2 + 1), 0, 1])

    scores = score_predictions(predictions, golds, ["nq", "nq", "hotpotqa", "hotpotqa", "hotpotqa"])
    assert list(scores.groups) == ["nq", "hotpotqa"]  # first appearance: Search-R1's table order
    assert scores.counts == {"nq": 2, "hotpotqa": 3}
    assert scores.groups["nq"]["em"].value == 1.0
    assert scores.groups["hotpotqa"]["em"].value == pytest.approx(1 / 3)
    assert scores.groups["hotpotqa"]["f1"].value == pytest.approx((2 / 3 + 0 + 1) / 3)
    assert scores.groups["hotpotqa"]["cover_em"].value == pytest.approx(2 / 3)
    # Search-R1's "Avg." is the unweighted mean over sources; the pooled mean weighs questions.
    assert scores.average["em"].value == pytest.approx((1 + 1 / 3) / 2)
    assert scores.pooled["em"].value == pytest.approx(3 / 5)
    # A group whose questions all score the same has a zero-width interval at that value.
    nq = scores.groups["nq"]["em"]
    assert (nq.low, nq.high) == (1.0, 1.0)
    data = scores.to_dict()
    assert data["groups"]["hotpotqa"]["n"] == 3 and data["average"]["groups"] == 2
    assert "| hotpotqa | 3 | 0.333 [" in scores.markdown("source")


def test_intervals_contain_the_estimate_shrink_with_n_and_are_seeded():
    rng = np.random.default_rng(0)
    widths = []
    for n in (25, 400, 6400):
        values = {"em": (rng.random(n) < 0.4).astype(float), "f1": rng.random(n)}
        scores = aggregate(values, resamples=400, seed=1)
        for metric, estimate in scores.pooled.items():
            assert estimate.low <= estimate.value <= estimate.high, (n, metric)
        widths.append(scores.pooled["em"].high - scores.pooled["em"].low)
        # Close to the normal approximation 2 * 1.96 * sqrt(p (1 - p) / n).
        p = scores.pooled["em"].value
        assert widths[-1] == pytest.approx(2 * 1.96 * np.sqrt(p * (1 - p) / n), rel=0.35)
        again = aggregate(values, resamples=400, seed=1)
        assert again.pooled == scores.pooled
    assert widths[0] > widths[1] > widths[2]
    assert widths[1] == pytest.approx(widths[0] / 4, rel=0.35)  # 16x the questions: a quarter of the width


def test_a_groups_interval_does_not_depend_on_the_other_groups():
    rng = np.random.default_rng(3)
    a, b = rng.random(30), rng.random(50)
    alone = aggregate({"f1": a}, ["a"] * 30, resamples=300, seed=5)
    together = aggregate({"f1": np.concatenate([b, a])}, ["b"] * 50 + ["a"] * 30, resamples=300, seed=5)
    assert together.groups["a"] == alone.groups["a"]
    assert together.average["f1"].value == pytest.approx((a.mean() + b.mean()) / 2)


def test_hop_counts_are_ordered_by_value():
    scores = score_predictions(["x"] * 4, [["x"]] * 4, [2, 10, 1, 2], resamples=10)
    assert list(scores.groups) == ["1", "2", "10"]
    assert scores.counts == {"1": 1, "2": 2, "10": 1}


def test_paired_gain_of_stage_b_over_stage_a():
    golds = [["a"], ["b"], ["c"], ["d"]] * 10
    before = ["a", "x", "x", "x"] * 10  # EM 0.25
    after = ["a", "b", "x", "y"] * 10  # EM 0.5: gains on question 2 of every 4, never loses
    hops = [1, 2, 2, 1] * 10
    gain = paired_gain(before, after, golds, hops, resamples=500, seed=0)
    assert gain.pooled["em"].value == pytest.approx(0.25)
    assert gain.groups["2"]["em"].value == pytest.approx(0.5)  # rl_gain_2hop
    assert gain.groups["1"]["em"].value == 0.0
    assert (gain.groups["1"]["em"].low, gain.groups["1"]["em"].high) == (0.0, 0.0)
    low, high = gain.groups["2"]["em"].low, gain.groups["2"]["em"].high
    assert 0 < low < 0.5 < high <= 1
    # Pairing: the gain's interval is narrower than the two stages' own intervals side by side.
    a = score_predictions(before, golds, resamples=500).pooled["em"]
    b = score_predictions(after, golds, resamples=500).pooled["em"]
    assert gain.pooled["em"].high - gain.pooled["em"].low < (a.high - a.low) + (b.high - b.low)
    same = paired_gain(after, after, golds, resamples=50)
    assert same.pooled["em"].value == same.pooled["em"].low == same.pooled["em"].high == 0.0


def test_the_nested_interval_holds_the_spread_between_seeds():
    """Two designs with the same questions' noise: seeds that agree, and seeds that disagree by 0.3."""
    rng = np.random.default_rng(0)
    agree = [list((rng.random(50) < 0.5).astype(float)) for _ in range(4)]
    disagree = [list((rng.random(50) < p).astype(float)) for p in (0.2, 0.8, 0.2, 0.8)]
    narrow, wide = nested_bootstrap(agree, resamples=500), nested_bootstrap(disagree, resamples=500)
    assert narrow.low <= narrow.value <= narrow.high and wide.low <= wide.value <= wide.high
    assert wide.high - wide.low > 1.5 * (narrow.high - narrow.low)
    assert nested_bootstrap([[1.0, 0.0], [1.0, 0.0]], resamples=50).value == 0.5


def test_power_gives_the_detectable_difference_and_the_seeds_an_effect_needs():
    from scipy.stats import t

    seeds = [[0.1] * 10, [0.2] * 10, [0.3] * 10, [0.4] * 10]  # per-seed means 0.1 .. 0.4
    result = power(seeds, effect=0.1)
    variance = 0.05 / 3
    assert result.seeds == 4 and result.seed_variance == pytest.approx(variance)
    assert result.detectable == pytest.approx((t.ppf(0.975, 3) + t.ppf(0.8, 3)) * (variance / 4) ** 0.5)
    n = result.seeds_needed  # the least seeds whose detectable difference reaches 0.1
    assert (t.ppf(0.975, n - 1) + t.ppf(0.8, n - 1)) ** 2 * variance / n <= 0.01
    assert (t.ppf(0.975, n - 2) + t.ppf(0.8, n - 2)) ** 2 * variance / (n - 1) > 0.01
    # What it rests on: at the detectable difference, about 80% of simulated designs (4 seeds of that
    # spread) reject "no difference" with a one-sample t-test over their seeds.
    sims = np.random.default_rng(1).normal(result.detectable, variance**0.5, size=(20000, 4))
    statistic = sims.mean(axis=1) / (sims.std(axis=1, ddof=1) / 2)
    assert (np.abs(statistic) > t.ppf(0.975, 3)).mean() == pytest.approx(0.8, abs=0.04)
    one = power([[1.0, 0.0, 1.0, 0.0]])  # one seed: the questions' noise alone
    assert one.seeds == 1 and one.seed_variance == pytest.approx(np.var([1, 0, 1, 0], ddof=1) / 4)
    assert one.seeds_needed is None


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="gold"):
        score_predictions(["a"], [["a"], ["b"]])
    with pytest.raises(ValueError, match="group keys"):
        score_predictions(["a"], [["a"]], ["x", "y"])
    with pytest.raises(ValueError, match="no questions"):
        score_predictions([], [])
    with pytest.raises(ValueError, match="pair"):
        paired_gain(["a"], ["a", "b"], [["a"]])


# --- Search-R1's observation bytes ------------------------------------------------------------------------


def search_r1_reference(contents: list[str]) -> str:
    """Search-R1's information block for search results with these ``contents`` strings, as its rollout
    (search_r1/llm_agent/generation.py: _passages2string, execute_predictions) builds it, rewritten here:
    per result, "Doc <n>(Title: <text before the first newline>) <text after it>" plus a newline, all
    results concatenated, the whole stripped, then wrapped as "\\n\\n<information>...</information>\\n\\n"."""
    listing = ""
    for number, text in enumerate(contents, start=1):
        cut = text.find("\n")
        title, body = (text, "") if cut == -1 else (text[:cut], text[cut + 1 :])
        listing += "Doc " + str(number) + "(Title: " + title + ") " + body + "\n"
    return "\n\n<information>" + listing.strip() + "</information>\n\n"


# Search-R1's text after an invalid action (generation.py, execute_predictions).
SEARCH_R1_INVALID = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
    "</search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)

ODD_CONTENTS = [
    '"Velmora"\nVelmora is a city.',  # Search-R1's corpus convention
    '"Ostrel (city)"\nOstrel is a capital.\nIt lies on the Vel river.\n\nSecond paragraph.',  # multi-line
    '"The ""Quoted"" Band"\nThey sang "Hi" and \'bye\'.',  # quotes in the title and the text
    '"Zürich"\nZürich ist eine Stadt — café ☕, 東京, Ελλάδα, emoji 🙂.',  # unicode
    "A contents string without any newline",  # no title line at all
    '  "Spaced"  \n   text with spaces around   \n',  # whitespace kept by Search-R1 (but the last strip)
    '"Only a title"\n',  # empty text
    '"Tabs\tand\rreturns"\ntext\twith\ttabs',
]


@pytest.mark.parametrize("count", [0, 1, 2, 3, len(ODD_CONTENTS)])
def test_search_r1_observations_are_byte_identical(count):
    for start in range(len(ODD_CONTENTS)):
        contents = (ODD_CONTENTS[start:] + ODD_CONTENTS[:start])[:count]
        passages = [Passage.from_contents(str(i), c) for i, c in enumerate(contents)]
        assert SEARCH_R1.format_observation(passages) == search_r1_reference(contents)
    assert SEARCH_R1.rethink_text == SEARCH_R1_INVALID


def test_passages_without_raw_contents_use_the_corpus_convention():
    passages = [Passage("1", "Velmora", "Velmora is a city."), Passage("2", 'A "B" C', "two\nlines")]
    expected = search_r1_reference(['"Velmora"\nVelmora is a city.', '"A "B" C"\ntwo\nlines'])
    assert SEARCH_R1.format_observation(passages) == expected
    # The other protocols are unchanged by it.
    assert R_SEARCH.format_observation(passages[:1]) == (
        '\n\n<observation>(Title: "Velmora") Velmora is a city.</observation>\n\n'
    )
    assert R1_SEARCHER.format_observation(passages[:1]) == (
        '\n<|begin_of_documents|>\n(1)"Velmora"\nVelmora is a city.\n<|end_of_documents|>\n'
    )


def write_odd_corpus(path):
    with open(path, "w", encoding="utf-8") as handle:
        for i, contents in enumerate(ODD_CONTENTS):
            handle.write(json.dumps({"id": str(i), "contents": contents}, ensure_ascii=False) + "\n")
    return path


def test_retrievers_keep_the_corpus_contents_and_the_env_sends_search_r1_bytes(tmp_path, tiny_tokenizer):
    """Through the real paths: corpus file -> BM25 / index -> passages -> env observation token ids."""
    from rllib_search.serve.retrieval.build import build_index
    from rllib_search.serve.retrieval.load import load_index

    corpus = write_odd_corpus(tmp_path / "corpus.jsonl")
    build_index(corpus, tmp_path / "bm25", kind="bm25", progress=False)
    for retriever in (BM25Retriever(list(iter_passages(read_corpus(corpus)))), load_index(tmp_path / "bm25")):
        found = retriever.search(["Zürich Stadt", "Quoted Band sang"], 3)
        for passages in found:
            raw = [ODD_CONTENTS[int(p.id)] for p in passages]
            assert [p.contents for p in passages] == raw
            assert SEARCH_R1.format_observation(passages) == search_r1_reference(raw)

    record = QARecord("1", "Where is Zürich?", ["Zürich"], "test")
    env = MultiTurnSearchEnv(tiny_tokenizer, BM25Retriever(list(iter_passages(corpus))), [record])
    env.reset(options={"index": 0})
    encode = lambda text: tiny_tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    obs, *_ = env.step(encode("<think> a </think>\n<search> Zürich Stadt </search>"))
    passages = env.retriever.search(["Zürich Stadt"], env.config.topk)[0]
    reference = search_r1_reference([ODD_CONTENTS[int(p.id)] for p in passages])
    # Tokenised once, as Search-R1 tokenises its observation string: the same ids.
    assert obs.tolist() == encode(reference)
    obs, *_ = env.step(encode("no tags at all"))
    assert obs.tolist() == encode(SEARCH_R1_INVALID)


# --- rllib-search eval end to end --------------------------------------------------------------------------

# The prompt Search-R1's data scripts write (scripts/data_process/qa_search_test_merge.py, template "base"):
# its wording differs from the paper's Table 1 in a few words.
SEARCH_R1_DATA_PROMPT = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you "
    "get new information. After reasoning, if you find you lack some knowledge, you can call a search engine "
    "by <search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external knowledge "
    "needed, you can directly provide the answer inside <answer> and </answer>, without detailed "
    "illustrations. For example, <answer> Beijing </answer>. Question: {question}\n"
)

QUESTIONS = [
    ("nq", "Where was Tarquin Oskaley born?", ["Velmora"]),
    ("nq", "Which city is in Dravenia?", ["Velmora", "Ostrel"]),
    ("nq", "Who founded Quellon Works?", ["Mirelle Dask"]),
    ("hotpotqa", "In which country is the city where Tarquin Oskaley was born?", ["Dravenia"]),
    ("hotpotqa", "What is the capital of the country of Velmora?", ["Ostrel"]),
]


def write_search_r1_test_parquet(path):
    """A test file in the schema Search-R1's qa_search_test_merge.py writes (two sources merged)."""
    rows = {"data_source": [], "prompt": [], "ability": [], "reward_model": [], "extra_info": []}
    index = {}
    for source, question, golds in QUESTIONS:
        rows["data_source"].append(source)
        rows["prompt"].append([{"role": "user", "content": SEARCH_R1_DATA_PROMPT.format(question=question)}])
        rows["ability"].append("fact-reasoning")
        rows["reward_model"].append({"style": "rule", "ground_truth": {"target": golds}})
        rows["extra_info"].append({"split": "test", "index": index.setdefault(source, 0)})
        index[source] += 1
    pq.write_table(pa.table(rows), path)
    return path


@pytest.fixture(scope="module")
def answering_model(tmp_path_factory):
    """A tiny model taught to answer "Velmora" to these prompts (greedy: on its first turn), so EM is 1 on
    some questions and 0 on others."""
    from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer, teach_to_emit

    root = tmp_path_factory.mktemp("eval_model")
    base = build_tiny_causal_lm(root / "base", build_tiny_tokenizer(root / "tok"))
    prompts = [SEARCH_R1_DATA_PROMPT.format(question=q) for _, q, _ in QUESTIONS]
    return teach_to_emit(
        base, root / "answering", prompts, "<think> easy </think>\n<answer> Velmora </answer>"
    )


def test_eval_command_on_a_search_r1_parquet(tmp_path, answering_model):
    from rllib_search.cli import main
    from rllib_search.data.formats import write_corpus_jsonl
    from tests.helpers import PASSAGES

    data = write_search_r1_test_parquet(tmp_path / "test.parquet")
    write_corpus_jsonl(PASSAGES, tmp_path / "corpus.jsonl")
    out = tmp_path / "eval"
    argv = [
        "eval",
        "--model",
        str(answering_model),
        "--data",
        str(data),
        "--corpus",
        str(tmp_path / "corpus.jsonl"),
    ]
    argv += ["--max-turn-tokens", "24", "--max-total-tokens", "1024", "--batch-size", "2", "--no-progress"]
    assert main([*argv, "--out", str(out), "--resamples", "200"]) == 0

    result = json.loads((out / "eval.json").read_text())
    assert {k: v["n"] for k, v in result["sources"].items()} == {"nq": 3, "hotpotqa": 2}
    assert result["questions"] == 5 and "num_hops" not in result["by"]
    assert result["prompt"] == "the data's own template" and result["instruction"] == SEARCH_R1_DATA_PROMPT
    assert result["settings"]["topk"] == 3 and result["settings"]["max_turns"] == 5  # Search-R1's defaults
    assert result["policy"]["model"] == str(answering_model) and result["policy"]["checkpoint"] is None
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert [r["uid"] for r in rows] == ["nq/0", "nq/1", "nq/2", "hotpotqa/0", "hotpotqa/1"]
    assert [r["prediction"] for r in rows] == ["Velmora"] * 5  # the taught answer, parsed from the response
    # The metrics are a recomputation from the predictions file.
    again = score_predictions(
        [r["prediction"] for r in rows],
        [r["golden_answers"] for r in rows],
        [r["data_source"] for r in rows],
        resamples=200,
    ).to_dict()
    for source in ("nq", "hotpotqa"):
        for metric in ("em", "f1", "cover_em"):
            assert result["sources"][source][metric] == again["groups"][source][metric]
    assert result["sources"]["nq"]["em"]["value"] == pytest.approx(2 / 3)
    assert result["sources"]["hotpotqa"]["em"]["value"] == 0.0
    assert result["average"]["em"]["value"] == pytest.approx((2 / 3 + 0) / 2)
    assert result["pooled"]["em"]["value"] == pytest.approx(2 / 5)
    markdown = (out / "eval.md").read_text()
    assert "| nq | 3 | 0.667 [" in markdown and "**average**" in markdown

    # --limit-per-source: a seeded sample of each source, in file order; the same seed, the same sample.
    for name in ("lim1", "lim2"):
        assert main([*argv, "--out", str(tmp_path / name), "--limit-per-source", "1", "--seed", "4"]) == 0
    limited = [json.loads((tmp_path / name / "eval.json").read_text()) for name in ("lim1", "lim2")]
    assert {k: v["n"] for k, v in limited[0]["sources"].items()} == {"nq": 1, "hotpotqa": 1}
    samples = [(tmp_path / name / "predictions.jsonl").read_text() for name in ("lim1", "lim2")]
    assert samples[0] == samples[1]


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_checkpoint_and_its_export_evaluate_the_same(ray_cluster, tmp_path, world, lora, monkeypatch):
    """A GRPO checkpoint (one training iteration) evaluated from its RLModule gives the predictions of its
    exported Hugging Face directory, and its weights are the learner's (with LoRA the checkpoint holds only
    the adapters, loaded over the base model; the export has them merged)."""
    import torch
    from transformers import AutoModelForCausalLM

    from rllib_search import ENV_ID
    from rllib_search.algos import SearchGRPOConfig
    from rllib_search.algos.evaluation.evaluate import EvalSettings, build_runner, evaluate, load_policy
    from rllib_search.data.formats import write_corpus_jsonl
    from rllib_search.env.protocols import get_protocol
    from rllib_search.llm.models import merged_state_dict
    from rllib_search.llm.tiny import build_tiny_causal_lm, build_tiny_tokenizer

    model_dir = build_tiny_causal_lm(tmp_path / "model", build_tiny_tokenizer(tmp_path / "tok"))
    corpus = tmp_path / "corpus.jsonl"
    write_corpus_jsonl(world.passages, corpus)
    env = {"protocol": "search_r1", "max_turns": 3, "max_total_tokens": 700, "max_obs_tokens": 80, "topk": 2}
    algo = (
        SearchGRPOConfig()
        .environment(
            ENV_ID,
            env_config={"retriever": {"type": "bm25", "corpus": str(corpus)}, "dataset": world.train, **env},
        )
        .rl_module(model_config={"model": str(model_dir), "lora": {"r": 4, "alpha": 8} if lora else None})
        .rollouts(group_size=2, prompts_per_sample=2, max_turn_tokens=16)
        .training(lr=1e-2, micro_batch_size=2, entropy_coeff=0.05)  # a gradient whatever the rewards
        .debugging(seed=11)
        .build_algo()
    )
    algo.train()
    checkpoint = algo.save_to_path(str(tmp_path / "runs" / "tiny_cpu_grpo" / "checkpoint"))  # the main job's
    exported = algo.export(tmp_path / "export")
    learned = merged_state_dict(algo.learner_group._learner.module["default_policy"].unwrapped().model)
    learned = {name: tensor.clone() for name, tensor in learned.items()}
    algo.stop()

    policy = load_policy(checkpoint=checkpoint)
    assert policy.model_config["model"] == str(model_dir) and policy.iteration == 1
    assert policy.trained_settings == {**env, "max_turn_tokens": 16}
    settings = EvalSettings(**policy.trained_settings, batch_size=4)
    retriever = {"type": "bm25", "corpus": str(corpus)}
    runner = build_runner(policy, retriever, world.test[:1], settings, get_protocol("search_r1"))
    loaded = merged_state_dict(runner.module.model)
    initial = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    assert any(not torch.equal(learned[name], initial[name]) for name in learned)  # it trained
    assert loaded.keys() == learned.keys()
    for name, tensor in learned.items():
        torch.testing.assert_close(loaded[name], tensor)
    runner.stop()

    records = world.test[:6]
    from_checkpoint = evaluate(policy, records, retriever, settings, resamples=50, progress=False)
    from_export = evaluate(
        load_policy(model=str(exported)), records, retriever, settings, resamples=50, progress=False
    )
    keys = ("uid", "prediction", "response", "searches", "em")
    assert [{k: r[k] for k in keys} for r in from_checkpoint.predictions] == [
        {k: r[k] for k in keys} for r in from_export.predictions
    ]
    base = evaluate(
        load_policy(model=str(model_dir)), records, retriever, settings, resamples=50, progress=False
    )
    assert [r["response"] for r in base.predictions] != [r["response"] for r in from_checkpoint.predictions]
    assert from_checkpoint.info["policy"]["checkpoint"] == str(checkpoint)
    assert "num_hops" in from_checkpoint.scores  # the synthetic world's questions carry their hop count

    if not lora:
        # The embedded default: `rllib-search eval` alone evaluates the main job's checkpoint (its path under
        # the working directory) on the main job's synthetic test set with its BM25 index.
        from rllib_search.cli import main

        monkeypatch.chdir(tmp_path)
        monkeypatch.setenv("RLLIB_SEARCH_CACHE", str(tmp_path / "cache"))
        assert main(["eval", "--limit-per-source", "4", "--resamples", "50", "--no-progress"]) == 0
        result = json.loads((tmp_path / "runs" / "eval" / "eval.json").read_text())
        assert result["policy"]["checkpoint"] == str(checkpoint) and result["questions"] == 4
        assert result["retriever"]["type"] == "index" and result["settings"]["max_turn_tokens"] == 16
        assert sum(group["n"] for group in result["by"]["num_hops"]["groups"].values()) == 4
