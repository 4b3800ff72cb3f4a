"""The CPU main job's recipe: warm start, plan calibration, GRPO and evaluation of SmolLM2 on the synthetic
world, on two CPU cores."""
