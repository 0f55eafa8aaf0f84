"""FAKE ``sglang.srt`` (tests only; see ``tests/fake_sglang/sglang/__init__.py``)."""
