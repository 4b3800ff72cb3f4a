"""The CPU main job's settings: one frozen config, its defaults the recipe's."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class TinyCPUConfig:
    """Every setting of the CPU main job (``run``). ``bf16`` is resolved before the job starts (None:
    fp32); ``smoke()`` gives every stage at its smallest size."""

    model: str = "smollm2-135m-instruct"
    out: str | None = None  # None: runs/tiny_cpu_grpo (in a submitted Ray job: ~/rllib_search_runs/...)
    protocol: str = "search_r1_compact"  # Search-R1's tags with a short system instruction
    world_seed: int = 0
    seed: int = 0
    threads: int = 2
    bf16: bool = False
    metrics_port: int | None = None
    # Evaluation: held-out questions per hop count, greedy; the base model's answers cached on disk.
    eval_questions: int = 50
    eval_cache: bool = True
    # Env budgets: a turn's tokens (the teacher's longest turn is 60), passages an observation shows.
    max_turn_tokens: int = 64
    topk: int = 2
    # Warm start: masked SFT on teacher trajectories (None: start RL from ``warm_start``, a HF directory).
    warm_start: str | None = None
    demonstrations: int = 60  # 1-hop questions demonstrated
    two_hop_demonstrations: int = 60
    early_answer: float = 0.25  # share of 2-hop demonstrations answered after the first hop
    decision_weight: float = 5.0  # SFT weight of the tokens where the plans of 1 and 2 hops part
    sft_steps: int = 12
    sft_batch: int = 8
    sft_lr: float = 8e-5
    micro_batch: int = 4  # episodes per forward/backward in SFT and calibration
    # Plan calibration after SFT (runs where both kinds of question are demonstrated).
    calibration_its: float = 0.3  # target P(" its") after ", then"
    calibration_lr: float = 4e-5
    calibration_steps: int = 8
    calibration_min_steps: int = 1
    calibration_turns: int = 2  # the plan's turn and the turn after the first search
    calibration_questions: int = 6
    # GRPO on never-demonstrated training questions, 2 of each hop count an iteration.
    rl_iterations: int = 8
    rl_two_hop: int = 300
    rl_one_hop: int = 150
    prompts: int = 4
    group_size: int = 8
    minibatch: int = 16
    rl_micro_batch: int = 16
    rl_lr: float = 5e-6
    kl_coeff: float = 0.001
    temperature: float = 1.0
    rl_trained_turns: int = 1  # the loss credits each episode's first turn: the plan and the first query
    execution_temperature: float = 0.0  # the uncredited turns run greedily, as evaluation runs them
    rl_guidance: bool = True  # teacher guidance of groups with no right answer
    placebo_rewards: bool = False  # a control: each sample's rewards permuted among its episodes
    # Validations: after these iterations (and the last) RL keeps the best weights, then reads
    # the WiSE-FT mixes of the warm start and the kept weights at these fractions.
    rl_validate_at: tuple[int, ...] = (4, 6)
    validation_questions: int = 20
    rl_interpolate: tuple[float, ...] = (0.25,)
    # Questions the plan's branch probabilities are read on (per hop count; also the validation pool).
    fork_questions: int = 30
    teacher: dict[str, Any] = field(
        default_factory=lambda: {"state_plan": True, "lazy_plan": True, "echo_plan": True}
    )

    def __post_init__(self) -> None:
        for name in ("calibration_questions", "micro_batch", "rl_micro_batch", "topk", "group_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not 1 <= self.validation_questions <= self.fork_questions:
            raise ValueError(
                f"validation_questions must lie in 1..{self.fork_questions}, got {self.validation_questions}"
            )
        if not 1 <= self.calibration_min_steps <= self.calibration_steps:
            raise ValueError(f"calibration_min_steps must lie in 1..{self.calibration_steps}")
        if any(not 0 < a < 1 for a in self.rl_interpolate):
            raise ValueError(
                f"each rl_interpolate fraction lies strictly in (0, 1), got {self.rl_interpolate}"
            )
        if self.rl_iterations < 0:
            raise ValueError(
                f"rl_iterations must be at least 0 (0: the warm start alone), got {self.rl_iterations}"
            )
        if self.rl_iterations == 0 and self.warm_start:
            raise ValueError(
                "rl_iterations 0 runs the warm start alone: it takes no warm_start to start from"
            )
        if any(i < 1 for i in self.rl_validate_at):
            raise ValueError(f"rl_validate_at counts iterations from 1, got {self.rl_validate_at}")
        if self.rl_interpolate and not self.rl_validate_at:
            raise ValueError("rl_interpolate chooses by validations: it needs rl_validate_at")

    @property
    def calibrates(self) -> bool:
        """Plan calibration runs after SFT, where SFT runs on both kinds of demonstration."""
        return bool(self.demonstrations and self.two_hop_demonstrations) and not self.warm_start

    @property
    def validation_iterations(self) -> tuple[int, ...]:
        """The iterations after which RL is read: those asked for that it reaches, and always its last."""
        if not self.rl_validate_at:
            return ()
        return tuple(
            sorted({i for i in self.rl_validate_at if i < self.rl_iterations} | {self.rl_iterations})
        )

    def smoke(self) -> TinyCPUConfig:
        """Every stage at the smallest size (a few minutes)."""
        return replace(
            self,
            demonstrations=8,
            two_hop_demonstrations=2,  # calibration pairs 1-hop and 2-hop questions
            sft_steps=1,
            sft_batch=4,
            rl_iterations=1,
            prompts=1,
            eval_questions=2,
            max_turn_tokens=32,
            calibration_steps=1,
            calibration_min_steps=1,
            validation_questions=2,
        )
