"""The papers' training recipes as config presets, one file per paper, each with its citations.

Every recipe is a function returning an RLlib ``AlgorithmConfig`` (``.build_algo()``, ``tune.Tuner``) at
one of two scales:

- ``scale="paper"``: the paper's model, hyperparameters and GPU layout (vLLM rollouts, E5/BGE retriever
  and judge on Ray Serve, several learners): what ``ray job submit`` runs on a GPU cluster;
- ``scale="cpu"``: the same algorithm, reward and protocol on the embedded default (the bundled
  SmolLM2-135M-Instruct policy and Gemma-3-270M judge, the synthetic world, a served BM25 retriever) at a
  size two CPU cores train in minutes (``embedded.py`` prepares the world and the services).

Where a user's data and services live is theirs: every recipe takes ``dataset``, ``retriever`` (and
``judge`` for R-Search) as an RLlib ``env_config`` would.
"""

from rllib_search.recipes.r1_searcher import r1_searcher_reinforce_pp
from rllib_search.recipes.r_search import r_search_grpo
from rllib_search.recipes.search_r1 import search_r1_grpo, search_r1_ppo

RECIPES = {
    "search_r1_grpo": search_r1_grpo,
    "search_r1_ppo": search_r1_ppo,
    "r1_searcher": r1_searcher_reinforce_pp,
    "r_search": r_search_grpo,
}

__all__ = ["RECIPES", "r1_searcher_reinforce_pp", "r_search_grpo", "search_r1_grpo", "search_r1_ppo"]
