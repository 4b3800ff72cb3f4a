"""The learner side: the framework-agnostic learner, its torch and DeepSpeed halves, the masked losses,
advantage estimators, batching and the learning-rate warmup."""
