"""drmas_trainer: the reference Dr. MAS trainer (agent-wise GRPO on a single controller)."""
