"""Fork calibration: the teacher's first turns weighted so a pair of 2-hop plans is a soft target at " its",
and the momentum-free SFT phase that trains on them until the forks lie in the window."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from rllib_search.algos import SearchSFTConfig
from rllib_search.algos.learners.losses import masked_mean
from rllib_search.env.search_env import MultiTurnSearchEnv, SearchEnvConfig
from rllib_search.env.teacher import hops_of
from rllib_search.llm.tiny import build_tiny_causal_lm
from rllib_search.recipes.tiny_cpu.calibration import (
    FOLLOW,
    ForkCalibration,
    calibrate_forks,
    calibration_demonstrations,
    follow_position,
    fork_positions,
)
from rllib_search.recipes.tiny_cpu.plan_forks import ForkWindow, fork_contexts, mean_forks
from rllib_search.serve.retrieval.bm25 import BM25Retriever
from tests.helpers import ENV_SETTINGS, make_config

SETTINGS = ForkCalibration(its_target=0.3, emphasis=2.0, lr=1e-3, questions_per_step=2, max_steps=2)


@pytest.fixture(scope="module")
def questions(world):
    return {h: [r for r in world.train + world.test if len(hops_of(r)) == h][:3] for h in (1, 2)}


@pytest.fixture(scope="module")
def calibration_set(world, smollm2_tokenizer, questions):
    config = SearchEnvConfig.from_dict(ENV_SETTINGS)
    env = MultiTurnSearchEnv(smollm2_tokenizer, None, None, config)
    contexts = {h: fork_contexts(questions[h], env, smollm2_tokenizer) for h in questions}
    demos = calibration_demonstrations(
        smollm2_tokenizer, BM25Retriever(world.passages), questions, contexts, config, SETTINGS, seed=0
    )
    return contexts, demos


def token_id(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"][0]


def test_each_question_gives_its_first_turns_with_the_forks_weighted(smollm2_tokenizer, calibration_set):
    contexts, demos = calibration_set
    assert len(demos) == 3 * 3  # per question: the 1-hop turn, the 2-hop plan that goes on, the hesitant one
    for k in range(3):
        one, full, hesitant = demos[3 * k : 3 * k + 3]
        for rollout in (one, full, hesitant):
            assert len(rollout.turn_spans) == 1  # the first turn only: plan and first search
            text = smollm2_tokenizer.decode(rollout.token_ids[rollout.turn_spans[0][0] :])
            assert text.rstrip().endswith("</search>")
        assert "then" not in smollm2_tokenizer.decode(one.token_ids[one.turn_spans[0][0] :])
        for rollout, context, forks in (
            (one, contexts[1][k], {0: (".", SETTINGS.emphasis)}),
            (full, contexts[2][k], {0: (",", SETTINGS.emphasis / 2), 1: (" its", SETTINGS.emphasis * 0.3)}),
            (
                hesitant,
                contexts[2][k],
                {0: (",", SETTINGS.emphasis / 2), 1: (" answer", SETTINGS.emphasis * 0.7)},
            ),
        ):
            positions = fork_positions(rollout, context)
            generated = float(rollout.loss_mask.sum())
            weighted = set()
            for index, (text, weight) in forks.items():
                position = positions[index]
                assert int(rollout.token_ids[position]) == token_id(smollm2_tokenizer, text)
                assert rollout.nll_weights[position] == pytest.approx(weight * generated)
                weighted.add(position)
            others = [p for p in np.flatnonzero(rollout.loss_mask) if p not in weighted]
            assert np.all(rollout.nll_weights[others] == 1.0)
            assert np.all(rollout.nll_weights[rollout.loss_mask == 0] == 0.0)


def test_a_pair_of_plans_is_the_soft_cross_entropy_at_the_second_fork(calibration_set):
    """Under per-sequence aggregation the two 2-hop turns' fork terms add up to emphasis x (NLL(",") +
    cross-entropy against P(" its") = its_target): with NLL only at the forks, the batch mean is that / 2."""
    contexts, demos = calibration_set
    full, hesitant = demos[1], demos[2]
    width = max(len(full), len(hesitant))
    nll = torch.zeros(2, width)
    mask = torch.zeros(2, width)
    p_goes_on, p_its = 0.8, 0.6
    for row, (rollout, p_second) in enumerate(((full, p_its), (hesitant, 1.0 - p_its))):
        first, second = fork_positions(rollout, contexts[2][0])
        weights = torch.as_tensor(rollout.nll_weights)
        nll[row, first] = -math.log(p_goes_on) * weights[first]
        nll[row, second] = -math.log(p_second) * weights[second]
        mask[row, : len(rollout)] = torch.as_tensor(rollout.loss_mask, dtype=torch.float32)
    expected = SETTINGS.emphasis * (
        -math.log(p_goes_on) - (0.3 * math.log(p_its) + 0.7 * math.log(1.0 - p_its))
    )
    assert float(masked_mean(nll, mask, "sequence")) == pytest.approx(expected / 2, rel=1e-5)


def test_two_turns_keep_the_turn_after_the_first_search_as_the_plan_says(
    world, smollm2_tokenizer, questions, calibration_set
):
    """With turns=2 each demonstration also keeps its second turn: the plan that goes on restates its next
    clause and searches again, the hesitant plan and the 1-hop turn answer; the token after the restated plan
    is weighted as a fork."""
    contexts, first_turns = calibration_set
    config = SearchEnvConfig.from_dict(ENV_SETTINGS)
    demos = calibration_demonstrations(
        smollm2_tokenizer,
        BM25Retriever(world.passages),
        questions,
        contexts,
        config,
        dataclasses.replace(SETTINGS, turns=2),
        seed=0,
    )
    assert len(demos) == len(first_turns)
    for k in range(3):
        one, full, hesitant = demos[3 * k : 3 * k + 3]
        seconds = {}
        for name, rollout, first_turn in zip(
            ("one", "full", "hesitant"), (one, full, hesitant), first_turns[3 * k : 3 * k + 3]
        ):
            assert len(rollout.turn_spans) == 2
            # The first turn and its fork weights are the ones calibration keeps with turns=1; the weights
            # scale with the generated tokens, now both turns'.
            end = rollout.turn_spans[0][1]
            assert np.array_equal(rollout.token_ids[:end], first_turn.token_ids[:end])
            scale = float(rollout.loss_mask.sum()) / float(first_turn.loss_mask.sum())
            heavy = first_turn.nll_weights[:end] > 1.0
            assert np.allclose(rollout.nll_weights[:end][heavy], first_turn.nll_weights[:end][heavy] * scale)
            # The second turn: weight 1, but emphasis at the token after its restated plan.
            second_start, second_end = rollout.turn_spans[1]
            alternatives = {
                kind: smollm2_tokenizer(text, add_special_tokens=False)["input_ids"]
                for kind, text in FOLLOW.items()
            }
            follow, kind = follow_position(rollout, alternatives)
            assert kind == ("search" if name == "full" else "answer")
            assert second_start < follow < second_end
            generated = float(rollout.loss_mask.sum())
            assert rollout.nll_weights[follow] == pytest.approx(SETTINGS.emphasis * generated)
            rest = [p for p in range(second_start, second_end) if p != follow]
            assert np.all(rollout.nll_weights[rest] == rollout.loss_mask[rest])
            seconds[name] = (
                smollm2_tokenizer.decode(rollout.token_ids[second_start:follow]),
                smollm2_tokenizer.decode(rollout.token_ids[follow:second_end]),
            )
        # Restated plan | what follows it.
        assert seconds["one"][0].rstrip().endswith(".") and "then" not in seconds["one"][0]
        assert seconds["one"][1].startswith(" </think>") and "<answer>" in seconds["one"][1]
        assert seconds["full"][0].rstrip().endswith(".") and ", then its" in seconds["full"][0]
        assert seconds["full"][1].startswith(" Next I need") and "<search>" in seconds["full"][1]
        assert seconds["hesitant"][0].rstrip().endswith(", then answer.")
        assert seconds["hesitant"][1].startswith(" </think>") and "<answer>" in seconds["hesitant"][1]


@pytest.mark.slow
def test_calibration_trains_in_order_without_momentum_and_stops_in_the_window(
    ray_cluster, tmp_path, world, corpus, smollm2_tokenizer, calibration_set
):
    smollm2_tokenizer.save_pretrained(tmp_path / "tok")
    model_dir = str(build_tiny_causal_lm(tmp_path / "lm", tmp_path / "tok", seed=1))
    contexts, demos = calibration_set
    algo = (
        make_config(SearchSFTConfig, model_dir, world, corpus, grad_clip=None)
        .sft(demonstrations=demos, sft_batch_size=4)
        .build_algo()
    )
    learner = algo.learner_group._learner
    algo.train()  # momentum gathered by an ordinary SFT step

    def read():
        return algo.on_policy_module(lambda module: mean_forks(module.model, smollm2_tokenizer, contexts))

    before = read()
    anywhere = ForkWindow(one_hop_goes_on=1.0, two_hop_goes_on=0.0, its=(0.0, 1.0))
    seen = []
    readings = calibrate_forks(algo, demos, read, SETTINGS, anywhere, lambda *step: seen.append(step))
    assert [r["step"] for r in readings] == [1] and readings[0]["in_window"] and len(seen) == 1
    at_least_two = dataclasses.replace(SETTINGS, min_steps=2)
    assert [r["step"] for r in calibrate_forks(algo, demos, read, at_least_two, anywhere)] == [1, 2]
    assert readings[0]["forks"] != before  # the step trained
    assert all(group["base_lr"] == SETTINGS.lr for group in learner.param_groups())
    # In order, from the start of each phase: two steps took 12 turns (the 9, then 3 again), so the next
    # batch is the next 2 questions' 3 turns each.
    assert [d.uid for d in algo.next_demonstrations()] == [d.uid for d in (demos + demos)[3:9]]

    # Without momentum a step's first moment is its own gradient's share: m = (1 - b1) g, where the
    # second moment gives |g| = sqrt((v - b2 v_old) / (1 - b2)).
    optimizer = learner.optimizers()[0][1]
    beta1, beta2 = optimizer.param_groups[0]["betas"]
    never = ForkWindow(one_hop_goes_on=-1.0)
    readings = calibrate_forks(algo, demos, read, SETTINGS, never)
    assert [r["step"] for r in readings] == [1, 2] and not any(r["in_window"] for r in readings)

    def first_moments_are_the_last_gradients() -> bool:
        moments, shares = [], []
        for param, state in optimizer.state.items():
            gradient = ((state["exp_avg_sq"] - beta2 * old[id(param)]) / (1 - beta2)).clamp(min=0).sqrt()
            moments.append(state["exp_avg"].abs().flatten())
            shares.append((1 - beta1) * gradient.flatten())
        moments, shares = torch.cat(moments), torch.cat(shares)
        scale = float(shares.abs().max())
        return bool(torch.allclose(moments, shares, rtol=1e-3, atol=1e-4 * scale))

    old = {id(p): s["exp_avg_sq"].clone() for p, s in optimizer.state.items()}
    calibrate_forks(algo, demos, read, ForkCalibration(lr=1e-3, questions_per_step=2, max_steps=1), never)
    assert first_moments_are_the_last_gradients()
    # The control: an ordinary step keeps the running mean, which the same check tells apart.
    algo.retune_optimizer(momentum=True)
    old = {id(p): s["exp_avg_sq"].clone() for p, s in optimizer.state.items()}
    algo.train()
    assert not first_moments_are_the_last_gradients()
    algo.stop()


def test_a_turn_without_a_follow_token_is_refused(calibration_set):
    _, first_turns = calibration_set
    with pytest.raises(ValueError, match="no second turn"):
        follow_position(first_turns[0], {"search": [0]})


def test_calibration_needs_both_kinds_of_question(world, smollm2_tokenizer, questions):
    config = SearchEnvConfig.from_dict(ENV_SETTINGS)
    with pytest.raises(ValueError, match="1-hop and 2-hop"):
        calibration_demonstrations(
            smollm2_tokenizer, BM25Retriever(world.passages), {1: questions[1], 2: []}, {}, config, SETTINGS
        )


def test_the_settings_are_checked():
    with pytest.raises(ValueError, match="its_target"):
        ForkCalibration(its_target=1.0)
    with pytest.raises(ValueError, match="positive"):
        ForkCalibration(lr=0.0)
    with pytest.raises(ValueError, match="min_steps"):
        ForkCalibration(min_steps=3, max_steps=2)
    with pytest.raises(ValueError, match="turns"):
        ForkCalibration(turns=3)
