"""FAKE ``sglang.srt.managers`` (tests only)."""
