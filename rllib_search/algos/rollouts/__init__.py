"""The sampling side: the EnvRunner, the lock-step multi-turn rollout loop, the policies that write turns,
the Rollout record the learner consumes, question samplers, dynamic sampling, reward schedules and teacher
demonstrations."""
