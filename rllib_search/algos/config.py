"""SearchConfig: the RLlib AlgorithmConfig of every search-agent algorithm (rollout and model settings).

Model settings go through RLlib's own ``config.rl_module(model_config={...})`` (keys in
``algos/model/rl_module.py``); environment settings through ``config.environment(ENV_ID,
env_config={...})``
(``registration.py``: retriever spec, dataset, protocol, token budgets); rollout settings through
:meth:`SearchConfig.rollouts`. Token budgets live in two places only: the env's (``max_turns``,
``max_obs_tokens``, ``max_total_tokens``) and the per-turn generation limit ``max_turn_tokens`` here; each
generation is capped at ``min(max_turn_tokens, env.remaining_tokens)``.
"""

from __future__ import annotations

from typing import Any

from ray.rllib.algorithms.algorithm_config import AlgorithmConfig, NotProvided
from ray.rllib.core.rl_module.rl_module import RLModuleSpec

from rllib_search.algos.learners.losses import AGGREGATIONS
from rllib_search.algos.learners.lr_warmup import LearningRateWarmup
from rllib_search.env.search_env import ENV_ID, SearchEnvConfig

ENGINES = ("hf", "vllm")
ENGINE_DTYPES = (None, "float32", "bfloat16", "float16")
ADVANTAGE_ESTIMATORS = ("grpo", "gae", "reinforce_pp", "reinforce_pp_baseline", "sft")
KL_ESTIMATORS = ("k1", "k3")
# Each policy loss and the settings it brings where ``training()`` is not told otherwise in the same call.
POLICY_LOSSES: dict[str, dict[str, Any]] = {
    "grpo": {},
    # GSPO (Zheng et al., 2025): sequence-level ratios, clipped at 3e-4 / 4e-4 (section 5.1).
    "gspo": {"clip_param": 3e-4, "clip_param_high": 4e-4, "loss_aggregation": "sequence"},
    # Dr. GRPO (Liu et al., 2025): no std scaling of advantages, one constant length normaliser.
    "dr_grpo": {"scale_by_std": False, "loss_aggregation": "constant"},
    # DAPO (Yu et al., 2025): clip-higher (0.2 / 0.28), token-level loss, soft overlong punishment.
    "dapo": {
        "clip_param": 0.2,
        "clip_param_high": 0.28,
        "loss_aggregation": "token",
        "overlong_buffer_fraction": 0.2,
    },
}
SHARDINGS = (None, "fsdp2")


class SearchConfig(AlgorithmConfig):
    """Rollout and model settings shared by PPO, GRPO and REINFORCE++ (Search-R1's defaults)."""

    def __init__(self, algo_class: Any = None) -> None:
        super().__init__(algo_class=algo_class)
        from rllib_search.algos.rollouts.env_runner import LLMEnvRunner

        self.env = ENV_ID
        self.env_runner_cls = LLMEnvRunner
        self._model_config = {"model": "smollm2-135m-instruct"}
        # Rollouts (Search-R1: n = 5 samples per prompt for GRPO, temperature 1, 500 tokens a turn).
        self.group_size = 5
        self.prompts_per_sample = 8
        self.engine = "hf"
        self.engine_options: dict[str, Any] = {}
        self.engine_dtype: str | None = None  # the engine's weights (None: bf16 on a GPU, fp32 on the CPU)
        self.temperature = 1.0
        self.execution_temperature: float | None = None  # turns after trained_turns (None: temperature)
        self.top_p = 1.0
        self.max_turn_tokens = 500
        self.colocate = False
        self.one_step_off = False
        self.balance_by: str | None = None
        # DAPO's dynamic sampling: at most this many sample() rounds an iteration (0: off).
        self.dynamic_sampling_rounds = 0
        # Samples a group whose evidence judge failed waits to be judged again (0: trained at once).
        self.judge_retries = 2
        # Called on each sample's groups before they leave the runner (see rollouts()); None: none.
        self.group_hook: Any = None
        # Training (Search-R1's defaults; the subclasses in algos/grpo.py set each algorithm's own).
        self.advantage_estimator = "grpo"
        self.lr = 1e-6
        self.critic_lr = 1e-5
        self.weight_decay = 0.01
        self.warmup_ratio = 0.0
        self.lr_decay = "constant"
        self.total_training_steps: int | None = None
        self.grad_clip = 1.0
        self.grad_clip_by = "global_norm"
        self.gamma = 1.0
        self.lambda_ = 1.0
        self.policy_loss = "grpo"
        self.clip_param = 0.2
        self.clip_param_high: float | None = None  # None: clip_param (DAPO's clip-higher sets it above)
        self.max_response_tokens: int | None = None  # None: max_turns x max_turn_tokens
        self.overlong_buffer_fraction = 0.0  # DAPO's soft overlong punishment; 0: off
        self.llds_coeff = 0.0  # LLDS likelihood-preserving regulariser's weight; 0: off
        self.llds_gate = "action"  # LLDS gates each model turn ("action") or whole responses ("response")
        self.vf_clip_param = 0.5
        self.vf_loss_coeff = 0.5
        self.entropy_coeff = 0.0
        self.kl_coeff = 0.001
        self.kl_estimator = "k3"
        self.kl_in_reward = False
        self.scale_by_std = True
        self.whiten_advantages = True
        self.loss_aggregation = "sequence"
        self.mask_retrieved_tokens = True
        # Credit only the first N assistant turns of each episode (None: every turn); see training().
        self.trained_turns: int | None = None
        self.old_logprobs = "sampler"
        self.micro_batch_size = 4
        self.sharding: str | None = None  # None: DDP across learners; "fsdp2": FSDP2-sharded learners
        self.autocast: bool | None = None
        self.disk_offload = False
        # PPO-ptx (InstructGPT; OpenRLHF's ptx_coef): a masked NLL on demonstrations in every RL update.
        self.ptx_demonstrations: list[Any] | None = None
        self.ptx_coeff = 0.0
        self.ptx_batch_size = 8
        # A reward schedule (R1-Searcher's two stages); None keeps the env's reward throughout.
        self.reward_stages: list[Any] | None = None
        # Held-out questions rolled out greedily every `held_out_interval` iterations (None: no evaluation).
        self.held_out_dataset: Any = None
        self.held_out_interval = 1
        self.held_out_answers = False
        # Ray metrics of every train() result (algos/dashboard_metrics.py), tagged with this run name.
        self.dashboard_metrics_enabled = True
        self.dashboard_run_name: str | None = None
        # Fault tolerance (docs/architecture.md, "Faults"): RLlib restarts a dead EnvRunner actor (set
        # here, not left to RLlib's default) and the Algorithm samples it again, from its own data
        # position, up to `sample_retries` times within the iteration.
        self.restart_failed_env_runners = True
        self.sample_retries = 2
        # Periodic checkpoints (algos/checkpoints/periodic.py): off unless given a directory and an interval.
        self.checkpoint_dir: str | None = None
        self.checkpoint_every_n_iterations = 0
        self.checkpoint_keep_last = 3
        # Collapse monitors and their guard (algos/collapse.py): bands per monitor, and what a breach does.
        self.collapse_bands: dict[str, tuple[float | None, float | None]] = {}
        self.collapse_on_breach = "warn"
        self.collapse_patience = 1
        self.collapse_max_rollbacks = 2

    def rollouts(
        self,
        *,
        group_size: int | Any = NotProvided,
        prompts_per_sample: int | Any = NotProvided,
        engine: str | Any = NotProvided,
        engine_options: dict[str, Any] | Any = NotProvided,
        engine_dtype: str | Any | None = NotProvided,
        temperature: float | Any = NotProvided,
        top_p: float | Any = NotProvided,
        max_turn_tokens: int | Any = NotProvided,
        colocate: bool | Any = NotProvided,
        one_step_off: bool | Any = NotProvided,
        balance_by: str | Any | None = NotProvided,
        execution_temperature: float | Any | None = NotProvided,
        dynamic_sampling_rounds: int | Any = NotProvided,
        judge_retries: int | Any = NotProvided,
        group_hook: Any = NotProvided,
    ) -> SearchConfig:
        """``group_size`` samples of each of ``prompts_per_sample`` prompts per ``sample()`` call of each
        EnvRunner, generated by ``engine`` (``hf`` or ``vllm``, with ``engine_options``, e.g.
        ``{"gpu_memory_utilization": 0.4, "sleep_level": 2}``) at ``temperature``/``top_p``, at most
        ``max_turn_tokens`` new tokens per turn.

        ``engine_dtype`` (None: ``bfloat16`` on a GPU, ``float32`` on the CPU): the dtype of the weights the
        engine generates with, whatever the learner trains in (its fp32 master weights are cast at each
        weight sync). ``bfloat16`` also pays on a CPU with AVX512-BF16 or AMX; on other CPUs PyTorch emulates
        bf16, slower than fp32, and the runner logs a warning (``benchmarks/bf16_cpu_bench.py`` measures a
        machine). vLLM takes it as its ``dtype``.

        ``colocate``: the EnvRunners share their GPUs with the learners (fractional
        ``num_gpus_per_env_runner`` and ``num_gpus_per_learner``, e.g. 0.5 each; as many learners as
        EnvRunners): learner i and EnvRunner i are placed on one GPU, one placement-group bundle per pair
        (``algos/colocation.py``). While the engines sample, the learners' weights, gradients and optimizer
        state wait in host memory; then the engines sleep (vLLM sleep mode), the learners come back and
        update, the new weights go to the engines, the learners leave again and the engines wake
        (``algos/learners/offload.py``).

        ``one_step_off`` (off by default): sampling overlaps learning, as verl's one-step-off pipeline. While
        the learners update on iteration k's episodes, the remote EnvRunners already sample iteration k+1
        with the weights they hold, at most one version behind the learner's; the new weights reach them
        after that sample (``learners/batch_weights_lag``: 0 without overlap, at most 1 with it). The
        importance ratio is taken against the sampler's own log-probs (``old_logprobs="sampler"``), which
        is what makes one stale version correct under PPO's clip. It helps only where sampling and learning
        run on different devices (EnvRunners on their own GPUs, or CPU cores the learner does not use);
        it needs remote EnvRunners, and cannot help colocated engines, which sleep during the update.

        ``balance_by`` (a key of the records' ``extra``, such as a question's kind): questions are drawn
        round-robin over its values, each value's questions in their own seeded shuffle, so every sample holds
        each kind of question equally (``prompts_per_sample`` a multiple of the number of kinds keeps it exact
        per iteration). Off (one shuffle over all questions) by default.

        ``execution_temperature`` (None: ``temperature``): the temperature of every turn after the first
        ``training(trained_turns=...)`` turns, which the loss never credits, so they act as part of the
        environment: the credited turns (the plan) explore at ``temperature`` and are rewarded for what
        the rest of the episode does with them at this temperature (0: greedily, as held-out evaluation
        runs it). Needs ``trained_turns``: tokens the loss scores must be drawn at ``temperature``.

        ``dynamic_sampling_rounds`` (0: off): DAPO's dynamic sampling
        (``algos/rollouts/dynamic_sampling.py``). Groups
        whose episodes all earned the same reward (zero advantage) are dropped, and the EnvRunners sample
        again, up to this many rounds an iteration, until the iteration holds as many groups with differing
        rewards as one round draws; the update trains on those alone (on the last round as sampled when no
        round gave one). ``env_runners/sample_rounds`` and ``env_runners/informative_groups`` say what each
        iteration took. Not with ``one_step_off``.

        ``judge_retries`` (default 2; 0: off): a group with an episode whose evidence judge failed (R-Search)
        is held back from its sample and judged again, with the other held groups in one call, at each of the
        runner's next ``judge_retries`` samples; once judged it joins that sample, scored as if the judge had
        answered the first time. A group still unjudged after that is trained with its evidence term at 0
        (``judge_error`` 1), never scored as right. ``env_runners/judge_held_groups``,
        ``judge_recovered_groups`` and ``judge_unjudged_groups`` count them. An iteration whose runners hold
        back every group samples again. Held groups live in the runner's memory: a restarted runner drops
        them.

        ``group_hook`` (None: none): a picklable callable ``hook(runner, episodes, rollouts) -> rollouts``
        that every EnvRunner calls on each sample's episodes before returning them, with ``episodes`` the
        ``(record, group id)`` pairs in the order of ``rollouts`` (``group_size`` consecutive rollouts per
        group). It may replace rollouts, e.g. re-run one episode of a group with another policy through
        :meth:`LLMEnvRunner.rerun` and :meth:`LLMEnvRunner.sampling_policy`, and log its own metrics on
        ``runner.metrics``. Its ``validate(config)`` method, when it has one, runs with the config's."""
        for name, value in locals().items():
            if name != "self" and value is not NotProvided:
                setattr(self, name, value)
        return self

    def held_out(
        self,
        *,
        dataset: Any = NotProvided,
        interval: int | Any = NotProvided,
        answers: bool | Any = NotProvided,
    ) -> SearchConfig:
        """Evaluate on held-out questions (a QA file or a list of ``QARecord``) every ``interval`` training
        iterations: one greedy episode each on the local EnvRunner; results under ``evaluation/`` (EM, F1,
        cover-EM, format-valid rate, searches and turns per episode, and EM per data source). With
        ``answers``, the result also carries every question's answer under ``evaluation_answers`` (a JSON
        list of ``{"uid", "hops", "data_source", "answer", "golden_answers"}``), so that a study scores
        trials question by question (``algos/evaluation/scores.py``: bootstrap intervals, paired gains)."""
        if dataset is not NotProvided:
            self.held_out_dataset = dataset
        if interval is not NotProvided:
            self.held_out_interval = interval
        if answers is not NotProvided:
            self.held_out_answers = bool(answers)
        return self

    def reward_schedule(self, *, stages: list[Any] | Any | None = NotProvided) -> SearchConfig:
        """Move through rewards during the run: ``stages`` is a list of
        :class:`~rllib_search.algos.rollouts.reward_schedule.RewardStage` (or dicts of its fields), e.g.
        R1-Searcher's ``[{"reward": "r1_searcher_stage1", "iterations": 6}, {"reward":
        "r1_searcher_stage2"}]``. Each stage replaces the env's ``reward``/``reward_config`` (and dataset,
        when it has one) on every EnvRunner."""
        if stages is not NotProvided:
            self.reward_stages = None if stages is None else list(stages)
        return self

    def dashboard_metrics(
        self, *, enabled: bool | Any = NotProvided, run_name: str | Any | None = NotProvided
    ) -> SearchConfig:
        """Publish every ``train()`` result's figures as Ray metrics (on by default; the Ray dashboard's
        metrics view and Prometheus show them, see ``rllib_search/metrics.py``), tagged ``run`` =
        ``run_name`` (default: the Tune trial's name, or ``default``) and ``algorithm``. The callback runs
        beside the config's own ``callbacks``."""
        if enabled is not NotProvided:
            self.dashboard_metrics_enabled = bool(enabled)
        if run_name is not NotProvided:
            self.dashboard_run_name = run_name
        return self

    def fault_tolerance(self, *, sample_retries: int | Any = NotProvided, **kwargs: Any) -> SearchConfig:
        """RLlib's fault-tolerance settings (``restart_failed_env_runners`` (True here),
        ``max_num_env_runner_restarts``, ``delay_between_env_runner_restarts_s``,
        ``env_runner_health_probe_timeout_s``, ``env_runner_restore_timeout_s``, ...) plus
        ``sample_retries``: how many times within one iteration the Algorithm waits for a restarted
        EnvRunner and samples it again (from the data position it had before it died; its lost episodes are
        drawn again, never counted twice). An EnvRunner still missing after that is left out of the
        iteration (``env_runners/runner_samples_missing``) and its questions wait for its return."""
        if sample_retries is not NotProvided:
            self.sample_retries = int(sample_retries)
        super().fault_tolerance(**kwargs)
        return self

    def ptx(
        self,
        *,
        demonstrations: list[Any] | Any | None = NotProvided,
        coeff: float | Any = NotProvided,
        batch_size: int | Any = NotProvided,
    ) -> SearchConfig:
        """PPO-ptx (InstructGPT's pretraining mix, OpenRLHF's ``ptx_coef``): every RL iteration also trains
        on the next ``batch_size`` of ``demonstrations`` (teacher Rollouts, as ``SearchSFTConfig`` takes;
        reshuffled every epoch, seeded, position checkpointed), adding ``coeff`` times their masked NLL to
        the RL loss of each update. It anchors what a warm start taught (e.g. answering 1-hop questions
        after one search) while RL learns what it did not (searching again on 2-hop ones). The
        demonstrations ride in the learner batch as rows marked ``ptx`` (no advantage, no KL): they add
        ``batch_size`` episodes to the iteration's mini-batches. ``coeff`` 0 (the default) is plain RL."""
        if demonstrations is not NotProvided:
            self.ptx_demonstrations = None if demonstrations is None else list(demonstrations)
        if coeff is not NotProvided:
            self.ptx_coeff = float(coeff)
        if batch_size is not NotProvided:
            self.ptx_batch_size = int(batch_size)
        return self

    def collapse_guard(
        self,
        *,
        bands: dict[str, tuple[float | None, float | None]] | Any = NotProvided,
        on_breach: str | Any = NotProvided,
        patience: int | Any = NotProvided,
        max_rollbacks: int | Any = NotProvided,
    ) -> SearchConfig:
        """Bands on the collapse monitors (``algos/collapse.py``: ``entropy``, ``kl``, ``response_tokens``,
        ``searches``, ``valid_actions``, ``format_valid``, ``correct_likelihood``, ``displaced_actions``,
        ``reward``), e.g.
        ``bands={"entropy": (0.1, None), "valid_actions": (0.5, None)}``, and what a monitor outside its band
        for ``patience`` iterations in a row does: ``"warn"``, ``"stop"`` (the result's ``done``), or
        ``"rollback"`` to the newest periodic checkpoint saved before the breach (needs
        ``checkpointing(directory=..., every_n_iterations=...)``; after ``max_rollbacks`` it stops). The
        monitors are in every result under ``collapse/`` whether or not bands are set."""
        if bands is not NotProvided:
            self.collapse_bands = {name: tuple(band) for name, band in dict(bands or {}).items()}
        if on_breach is not NotProvided:
            self.collapse_on_breach = on_breach
        if patience is not NotProvided:
            self.collapse_patience = int(patience)
        if max_rollbacks is not NotProvided:
            self.collapse_max_rollbacks = int(max_rollbacks)
        return self

    def make_collapse_guard(self) -> Any:
        """The :class:`~rllib_search.algos.collapse.CollapseGuard` of these settings (it checks them)."""
        from rllib_search.algos.collapse import CollapseGuard

        return CollapseGuard(
            bands=dict(self.collapse_bands),
            on_breach=self.collapse_on_breach,
            patience=self.collapse_patience,
            max_rollbacks=self.collapse_max_rollbacks,
        )

    def checkpointing(
        self,
        *,
        directory: str | Any | None = NotProvided,
        every_n_iterations: int | Any = NotProvided,
        keep_last: int | Any = NotProvided,
        **kwargs: Any,
    ) -> SearchConfig:
        """Periodic checkpoints (``algos/checkpoints/periodic.py``): after every ``every_n_iterations``
        iterations (0: never) ``train()`` writes ``directory/checkpoint_<iteration>`` atomically and keeps the
        newest ``keep_last`` (0: all); ``algo.restore_latest()`` resumes from the newest. RLlib's own
        ``checkpointing`` options pass through."""
        if directory is not NotProvided:
            self.checkpoint_dir = None if directory is None else str(directory)
        if every_n_iterations is not NotProvided:
            self.checkpoint_every_n_iterations = int(every_n_iterations)
        if keep_last is not NotProvided:
            self.checkpoint_keep_last = int(keep_last)
        super().checkpointing(**kwargs)
        return self

    def training(
        self,
        *,
        advantage_estimator: str | Any = NotProvided,
        critic_lr: float | Any = NotProvided,
        weight_decay: float | Any = NotProvided,
        warmup_ratio: float | Any = NotProvided,
        total_training_steps: int | Any | None = NotProvided,
        lr_decay: str | Any = NotProvided,
        lambda_: float | Any = NotProvided,
        policy_loss: str | Any = NotProvided,
        clip_param: float | Any = NotProvided,
        clip_param_high: float | Any | None = NotProvided,
        max_response_tokens: int | Any | None = NotProvided,
        overlong_buffer_fraction: float | Any = NotProvided,
        llds_coeff: float | Any = NotProvided,
        llds_gate: str | Any = NotProvided,
        vf_clip_param: float | Any = NotProvided,
        vf_loss_coeff: float | Any = NotProvided,
        entropy_coeff: float | Any = NotProvided,
        kl_coeff: float | Any = NotProvided,
        kl_estimator: str | Any = NotProvided,
        kl_in_reward: bool | Any = NotProvided,
        scale_by_std: bool | Any = NotProvided,
        whiten_advantages: bool | Any = NotProvided,
        loss_aggregation: str | Any = NotProvided,
        mask_retrieved_tokens: bool | Any = NotProvided,
        trained_turns: int | Any | None = NotProvided,
        old_logprobs: str | Any = NotProvided,
        micro_batch_size: int | Any = NotProvided,
        sharding: str | Any | None = NotProvided,
        autocast: bool | Any | None = NotProvided,
        disk_offload: bool | Any = NotProvided,
        **kwargs: Any,
    ) -> SearchConfig:
        """RLlib's training settings (``lr``, ``grad_clip``, ``gamma``, ``num_epochs``, ``minibatch_size``
        in episodes, ...) plus:

        - ``advantage_estimator``: ``grpo`` | ``gae`` (PPO) | ``reinforce_pp`` (REINFORCE++ as published: no
          baseline, returns whitened over the batch) | ``reinforce_pp_baseline`` (REINFORCE++-baseline: the
          group's mean reward subtracted first) | ``sft``;
        - ``critic_lr``, ``weight_decay`` (AdamW), ``warmup_ratio`` of ``total_training_steps`` optimizer
          steps of linear warmup, then ``lr_decay``: ``constant`` or ``linear`` (to 0 at
          ``total_training_steps``);
        - ``policy_loss``: ``grpo`` (per-token ratios clipped at ``clip_param``: PPO's and GRPO's surrogate)
          | ``gspo`` (one ratio per sequence) | ``dr_grpo`` | ``dapo``; each sets its paper's settings
          (``POLICY_LOSSES``) where this call does not set them: GSPO clips at 3e-4 / 4e-4; Dr. GRPO drops
          the std scaling and divides by a constant (``max_response_tokens``); DAPO clips at 0.2 / 0.28,
          averages over tokens and punishes overlong responses (``overlong_buffer_fraction`` 0.2);
        - ``clip_param_high`` (None: ``clip_param``), ``max_response_tokens`` (the response budget in
          generated tokens; None: ``max_turns`` x ``max_turn_tokens``), ``overlong_buffer_fraction``: the
          last fraction of that budget over which DAPO's reward penalty falls from 0 to -1 (0: off);
        - ``llds_coeff`` (0: off; 0.2 in the LLDS paper's runs), ``llds_gate``: LLDS, added to any
          ``policy_loss``: on each model turn (``"action"``) or response (``"response"``) with advantage >= 0
          whose log-likelihood fell below the sampling policy's, the tokens whose log-probs fell are
          penalised by log pi_old - log pi (``losses.llds_penalty``);
        - ``lambda_`` (GAE), ``clip_param``, ``vf_clip_param``, ``vf_loss_coeff``, ``entropy_coeff``;
        - ``kl_coeff``, ``kl_estimator`` (``k1`` | ``k3``), ``kl_in_reward`` (PPO, REINFORCE++) or in the
          loss (GRPO);
        - ``scale_by_std`` (GRPO), ``whiten_advantages`` (GAE), ``loss_aggregation`` (``sequence`` |
          ``token`` | ``constant``), ``mask_retrieved_tokens`` (False only for Search-R1's ablation),
          ``old_logprobs`` (``sampler``: the engine's log-probs; ``recompute``: a forward pass of the
          learner, as verl);
        - ``trained_turns``: the RL loss covers only the first N assistant turns of each episode (the
          episode's reward still judges the whole episode), e.g. 1 to let RL change the plan and the first
          query while later turns stay as the warm start wrote them; the learner then trains on the
          episodes cut after those turns (None: every turn); demonstrations (PPO-ptx) keep every turn;
        - ``micro_batch_size``: episodes per forward/backward; gradients accumulate over a mini-batch;
        - ``sharding``: None (each learner holds the whole model; DDP across learners) or ``"fsdp2"``
          (torch FSDP2: weights, gradients, AdamW's moments and the reference sharded over the learners;
          see ``algos/learners/fsdp.py``);
        - ``autocast``: bf16 autocast of forward and backward passes over the fp32 master weights (None:
          on GPU only);
        - ``disk_offload``: a CPU learner keeps the frozen reference and AdamW's moments in a temporary file
          except while it scores a batch or steps (``learners/disk_offload.py``): the same values, 1.4 GB
          less host memory outside those phases for SmolLM2, about a second an iteration to read them back.
        """
        given = {
            name: value
            for name, value in locals().items()
            if name not in ("self", "kwargs", "__class__") and value is not NotProvided
        }
        if "policy_loss" in given:  # the variant's own settings, under what this call sets itself
            given = {**POLICY_LOSSES.get(given["policy_loss"], {}), **given}
        for name, value in given.items():
            setattr(self, name, value)
        super().training(**kwargs)
        return self

    def response_token_budget(self) -> int:
        """The most tokens a response generates: ``max_response_tokens``, or every turn at its budget."""
        if self.max_response_tokens:
            return int(self.max_response_tokens)
        max_turns = dict(self.env_config or {}).get("max_turns", SearchEnvConfig().max_turns)
        return int(max_turns) * int(self.max_turn_tokens)

    def build_learner_group(
        self, *, env: Any = None, spaces: Any = None, rl_module_spec: Any = None, placement_group: Any = None
    ) -> Any:
        """RLlib's LearnerGroup (with ``sharding``, its subclass that gathers every learner's state at once:
        ``learners/fsdp.py``); while a colocated Algorithm builds its actors, in the placement group of
        its learner/EnvRunner pairs (``algos/colocation.py``)."""
        from ray.rllib.core.learner.learner_group import LearnerGroup

        from rllib_search.algos.colocation import building_pairs

        group_class = LearnerGroup
        if self.sharding:
            from rllib_search.algos.learners.fsdp import FSDPLearnerGroup

            group_class = FSDPLearnerGroup
        if rl_module_spec is None:
            rl_module_spec = self.get_multi_rl_module_spec(env=env, spaces=spaces)
        placement_group = placement_group or building_pairs()
        return group_class(config=self.copy(), module_spec=rl_module_spec, placement_group=placement_group)

    def build_algo(self, *args: Any, **kwargs: Any) -> Any:
        """RLlib's ``build_algo``, once the run's resource and memory plan fits the Ray cluster (see
        :meth:`check_plan`)."""
        self.check_plan()
        return super().build_algo(*args, **kwargs)

    def check_plan(self) -> Any:
        """The plan of a GPU config (GPU learners or vLLM rollouts; ``algos/plan``) against the running Ray
        cluster, before any actor starts: a run it cannot place or whose GPUs it does not fit raises
        ``PlanError`` with the numbers, instead of actors left pending. None for a CPU config."""
        from rllib_search.algos.plan import check_config

        return check_config(self)

    def get_default_learner_class(self) -> type:
        if self.sharding == "fsdp2":
            from rllib_search.algos.learners.fsdp import SearchFSDPLearner

            return SearchFSDPLearner
        from rllib_search.algos.learners.torch_learner import SearchTorchLearner

        return SearchTorchLearner

    def get_default_rl_module_spec(self) -> RLModuleSpec:
        from rllib_search.algos.model.rl_module import LLMRLModule

        return RLModuleSpec(module_class=LLMRLModule)

    def validate(self) -> None:
        super().validate()
        self.validate_rollouts()
        self.validate_training()
        self.validate_one_step_off()
        self.validate_collapse_guard()

    def validate_collapse_guard(self) -> None:
        """The guard's bands and action; a rollback needs periodic checkpoints to roll back to."""
        self.make_collapse_guard()
        if self.collapse_on_breach == "rollback" and not (
            self.checkpoint_dir and self.checkpoint_every_n_iterations > 0
        ):
            raise ValueError(
                "collapse_guard(on_breach='rollback') needs periodic checkpoints: "
                "checkpointing(directory=..., every_n_iterations=N)"
            )

    def validate_one_step_off(self) -> None:
        """Refuse one-step-off sampling where it cannot overlap or would be wrong (the training config's
        check: RLlib's evaluation config, which never trains, keeps its own runner count)."""
        if not self.one_step_off or self.in_evaluation:
            return
        if int(self.num_env_runners or 0) < 1:
            raise ValueError(
                "rollouts(one_step_off=True) needs remote EnvRunners (env_runners(num_env_runners=1) "
                "or more): the local EnvRunner samples in the driver, which is busy updating"
            )
        if self.colocate:
            raise ValueError(
                "rollouts(one_step_off=True) cannot overlap colocated engines: they sleep during the "
                "update; use one or the other"
            )
        if self.old_logprobs != "sampler":
            raise ValueError(
                "rollouts(one_step_off=True) needs old_logprobs='sampler': the ratio must be taken "
                "against the weights that sampled, one version behind the learner's"
            )

    def validate_group_hook(self) -> None:
        """Check ``rollouts(group_hook=...)``: a callable, checked by its own ``validate(config)`` if any."""
        if self.group_hook is None:
            return
        if not callable(self.group_hook):
            raise ValueError(f"group_hook must be None or a callable, got {self.group_hook!r}")
        validate = getattr(self.group_hook, "validate", None)
        if callable(validate):
            validate(self)

    def validate_training(self) -> None:
        """Check the training settings."""
        if self.advantage_estimator not in ADVANTAGE_ESTIMATORS:
            raise ValueError(
                f"advantage_estimator must be one of {ADVANTAGE_ESTIMATORS} (reinforce_pp: REINFORCE++ with "
                f"no baseline; reinforce_pp_baseline: with the group mean subtracted), "
                f"got {self.advantage_estimator!r}"
            )
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"kl_estimator must be one of {KL_ESTIMATORS}")
        if self.loss_aggregation not in AGGREGATIONS:
            raise ValueError(f"loss_aggregation must be one of {AGGREGATIONS}")
        if self.policy_loss not in POLICY_LOSSES:
            raise ValueError(f"policy_loss must be one of {tuple(POLICY_LOSSES)}, got {self.policy_loss!r}")
        if self.clip_param_high is not None and not float(self.clip_param_high) > 0:
            raise ValueError(f"clip_param_high must be None or positive, got {self.clip_param_high}")
        if not 0 <= float(self.overlong_buffer_fraction) <= 1:
            raise ValueError(
                f"overlong_buffer_fraction must be in [0, 1], got {self.overlong_buffer_fraction}"
            )
        if float(self.llds_coeff) < 0:
            raise ValueError(f"llds_coeff must be >= 0, got {self.llds_coeff}")
        if self.llds_gate not in ("action", "response"):
            raise ValueError(f"llds_gate must be 'action' or 'response', got {self.llds_gate!r}")
        if float(self.llds_coeff) > 0 and self.advantage_estimator == "sft":
            raise ValueError("llds_coeff > 0 regularises an RL loss; SFT has none")
        if self.max_response_tokens is not None and int(self.max_response_tokens) < 1:
            raise ValueError(f"max_response_tokens must be None or positive, got {self.max_response_tokens}")
        if self.old_logprobs not in ("sampler", "recompute"):
            raise ValueError("old_logprobs must be 'sampler' or 'recompute'")
        if not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if self.warmup_ratio > 0 and not self.total_training_steps:
            raise ValueError("warmup_ratio needs total_training_steps (optimizer steps in the run)")
        LearningRateWarmup(self.warmup_ratio, self.total_training_steps, self.lr_decay)  # checks lr_decay
        for name in ("lr", "critic_lr", "clip_param", "vf_clip_param"):
            if not float(getattr(self, name)) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("kl_coeff", "entropy_coeff", "vf_loss_coeff", "weight_decay"):
            if float(getattr(self, name)) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.ptx_coeff < 0:
            raise ValueError(f"ptx coeff must be >= 0, got {self.ptx_coeff}")
        if self.ptx_coeff > 0:
            if self.advantage_estimator == "sft":
                raise ValueError("ptx(coeff>0) mixes demonstrations into RL; SFT trains on them already")
            if not self.ptx_demonstrations:
                raise ValueError("ptx(coeff>0) needs demonstrations: config.ptx(demonstrations=[...])")
            if self.ptx_batch_size < 1:
                raise ValueError(f"ptx batch_size must be at least 1, got {self.ptx_batch_size}")
        if self.trained_turns is not None:
            if int(self.trained_turns) < 1:
                raise ValueError(f"trained_turns must be None or at least 1, got {self.trained_turns}")
            if not self.mask_retrieved_tokens:
                raise ValueError(
                    "trained_turns selects generated turns; with mask_retrieved_tokens=False (Search-R1's "
                    "no-mask ablation) the loss covers retrieved tokens too: use one or the other"
                )
        if not (0 <= self.gamma <= 1 and 0 <= self.lambda_ <= 1):
            raise ValueError("gamma and lambda_ must be in [0, 1]")
        if int(self.micro_batch_size) < 1:
            raise ValueError(f"micro_batch_size must be at least 1, got {self.micro_batch_size}")
        if self.sharding not in SHARDINGS:
            raise ValueError(f"sharding must be one of {SHARDINGS}, got {self.sharding!r}")
        if self.sharding and (self.torch_compile_learner or self._torch_grad_scaler_class):
            raise ValueError(
                "sharding='fsdp2' runs eager with bf16 gathers: leave torch_compile_learner and the AMP grad "
                "scaler unset"
            )
        if self.disk_offload and (self.sharding or self.colocate or self.num_gpus_per_learner):
            raise ValueError(
                "disk_offload is for CPU learners that hold the whole model; sharding, colocation and GPU "
                "learners free memory their own way"
            )
        if int(self.checkpoint_every_n_iterations) < 0 or int(self.checkpoint_keep_last) < 0:
            raise ValueError("checkpointing every_n_iterations and keep_last must be >= 0")
        if self.checkpoint_every_n_iterations and not self.checkpoint_dir:
            raise ValueError("checkpointing(every_n_iterations=...) needs a directory")
        if self.advantage_estimator == "gae" and not self.model_config.get("value_head"):
            raise ValueError("PPO (advantage_estimator='gae') needs model_config['value_head'] = True")

    def validate_rollouts(self) -> None:
        """Check the rollout settings (also called by the EnvRunner, which may be built without an
        Algorithm)."""
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {self.engine!r}")
        for name in ("group_size", "prompts_per_sample", "max_turn_tokens"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.engine_dtype not in ENGINE_DTYPES:
            raise ValueError(f"engine_dtype must be one of {ENGINE_DTYPES}, got {self.engine_dtype!r}")
        if self.engine == "vllm" and int(self.num_env_runners or 0) > 0 and not self.num_gpus_per_env_runner:
            raise ValueError(
                "vLLM EnvRunners need a GPU each: env_runners(num_gpus_per_env_runner=1), or a fraction "
                "with rollouts(colocate=True) when they share the learners' GPUs"
            )
        if self.colocate and self.engine == "vllm" and self.engine_options.get("enable_sleep_mode") is False:
            raise ValueError(
                "rollouts(colocate=True) with vLLM needs sleep mode (engine_options enable_sleep_mode)"
            )
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError("temperature must be >= 0 and top_p in (0, 1]")
        if self.execution_temperature is not None:
            if self.execution_temperature < 0:
                raise ValueError(f"execution_temperature must be >= 0, got {self.execution_temperature}")
            if self.trained_turns is None:
                raise ValueError(
                    "rollouts(execution_temperature=...) needs training(trained_turns=N): the turns it "
                    "samples differently must be ones the loss does not score"
                )
        if int(self.judge_retries) < 0:
            raise ValueError(f"judge_retries must be >= 0, got {self.judge_retries}")
        if int(self.dynamic_sampling_rounds) < 0:
            raise ValueError(f"dynamic_sampling_rounds must be >= 0, got {self.dynamic_sampling_rounds}")
        if self.dynamic_sampling_rounds and self.one_step_off:
            raise ValueError(
                "rollouts(dynamic_sampling_rounds=...) samples again within the iteration, which "
                "one_step_off's launched sample cannot: use one or the other"
            )
        if self.dynamic_sampling_rounds and int(self.group_size) < 2:
            raise ValueError(
                "rollouts(dynamic_sampling_rounds=...) compares rewards within groups: group_size >= 2"
            )
        self.validate_group_hook()
        if int(self.sample_retries) < 0:
            raise ValueError(f"sample_retries must be >= 0, got {self.sample_retries}")
        if int(self.held_out_interval) < 1:
            raise ValueError(f"held_out interval must be at least 1, got {self.held_out_interval}")
        if self.reward_stages is not None:
            from rllib_search.algos.rollouts.reward_schedule import RewardSchedule

            RewardSchedule(self.reward_stages)  # raises on a malformed schedule
