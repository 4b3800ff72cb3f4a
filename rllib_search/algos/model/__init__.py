"""The policy model both sides share: the LLM as an RLlib RLModule, and the forward that reads a group's
shared prompt once."""
