"""What a colocated run asks of Tune and what it refuses, without starting anything: the trial's placement
group is the driver's bundle followed by one bundle per learner/EnvRunner pair (RLlib then puts EnvRunner i
on bundle i and the learners into the group), and a layout that cannot pair is refused by name."""

from __future__ import annotations

import pytest

from rllib_search.algos import SearchGRPO
from rllib_search.algos.colocation import check_pairs, pair_bundle, pairs_of
from rllib_search.recipes import search_r1_grpo
from tests.helpers import RECORDS


def paper_layout():
    return search_r1_grpo(dataset=list(RECORDS), retriever={"type": "bm25", "corpus": "unused.jsonl"})


def test_tune_reserves_the_driver_and_one_bundle_per_pair():
    config = paper_layout()
    pairs = pairs_of(config)
    assert pairs == config.num_learners == config.num_env_runners > 1
    bundle = {"CPU": float(config.num_cpus_per_env_runner), "GPU": 1.0}
    assert pair_bundle(config) == bundle
    request = SearchGRPO.default_resource_request(config)
    assert request.bundles[1:] == [bundle] * pairs
    assert request.bundles[0].get("GPU", 0) == 0  # the driver holds no GPU: its EnvRunner is hollow
    separate = config.copy(copy_frozen=False).rollouts(colocate=False)
    separate.env_runners(num_gpus_per_env_runner=1).learners(num_gpus_per_learner=1)
    assert pairs_of(separate) == 0
    assert len(SearchGRPO.default_resource_request(separate).bundles) == 1 + 2 * pairs


def test_layouts_that_cannot_pair_are_refused():
    unequal = paper_layout().learners(num_learners=2)
    with pytest.raises(ValueError, match="must equal num_env_runners"):
        check_pairs(unequal)
    too_much = paper_layout().learners(num_gpus_per_learner=0.75)
    with pytest.raises(ValueError, match="add up to at most 1"):
        check_pairs(too_much)
    check_pairs(paper_layout())
