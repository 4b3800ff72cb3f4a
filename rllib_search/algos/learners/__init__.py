"""The learner side: the framework-agnostic learner, its torch half and the FSDP2-sharded variant, the
masked losses, advantage estimators, batching and the learning-rate warmup."""
