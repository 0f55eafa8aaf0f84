"""The toy suite: one-digit additions from a seed, no files; the toy (solver <-> checker) and
toy_fixer workflows, for smoke runs and the CPU recipes."""
