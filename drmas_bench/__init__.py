"""drmas-bench: evaluate and train teams of LLM agents.

Layout (DESIGN.md): tasks/ (benchmark registry), workflows/ (multi-agent episodes as async code),
engines/ (hf, openai, sglang), pool/ (who is awake), grading/, metrics.py, pricing.py, store.py,
commands/ (the CLI). The trainer lives in ``drmas_trainer``, retrieval in ``drmas_retrieval``.
"""

__version__ = "0.1.0"
