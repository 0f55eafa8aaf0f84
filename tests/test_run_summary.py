"""A finished run's closing summary says what is so: the reward windows of a short
run do not overlap, and a grad-norm spread with every norm 0 is "none", not "inf"."""

from __future__ import annotations

import json

from drmas_trainer import metric_names as mn
from drmas_trainer.runlog import METRICS, summarize


def _run(tmp_path, rewards, norms):
    with open(tmp_path / METRICS, "w", encoding="utf-8") as f:
        for i, (r, g) in enumerate(zip(rewards, norms), 1):
            f.write(json.dumps({"step": i, mn.SCORE: r, mn.agent("checker", mn.GRAD_NORM): g}) + "\n")
    return summarize(tmp_path, len(rewards))


def test_a_4_step_run_compares_its_first_2_steps_with_its_last_2(tmp_path):
    s = _run(tmp_path, [0.1, 0.2, 0.5, 0.6], [1.0, 2.0, 3.0, 4.0])
    assert s["reward_window"] == 2
    assert s["reward_first5"] == (0.1 + 0.2) / 2 and s["reward_last5"] == (0.5 + 0.6) / 2


def test_a_long_run_keeps_its_5_step_windows(tmp_path):
    rewards = [i / 20 for i in range(20)]
    s = _run(tmp_path, rewards, [1.0] * 20)
    assert s["reward_window"] == 5 and s["reward_first5"] == sum(rewards[:5]) / 5


def test_every_norm_0_has_no_spread_rather_than_inf(tmp_path):
    s = _run(tmp_path, [0.3] * 4, [0.0] * 4)
    assert s["grad_norm_spread"]["checker"] == {"max": 0.0, "median": 0.0}


def test_files_written_whole_follow_the_umask_like_any_other_file(tmp_path):
    """train_report.html, summary.*, config.yaml are written by atomic_write: they were 0600 (the
    temporary file's mode) where every other file of the run is 0644 under umask 022."""
    import os
    import stat

    from drmas_bench.files import atomic_write

    old = os.umask(0o022)
    try:
        atomic_write(tmp_path / "summary.json", "{}")
        (tmp_path / "plain.txt").write_text("x")
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    assert modes["summary.json"] == modes["plain.txt"] == 0o644


def test_no_progress_turns_the_libraries_loading_bars_off_here_and_in_workers(monkeypatch):
    """--no-progress left transformers' "Loading weights" bars on: they are its, not ours."""
    import os

    from transformers.utils import logging as hf_logging

    from drmas_bench.commands.train import quiet_loading_bars

    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    hf_logging.enable_progress_bar()
    try:
        quiet_loading_bars()
        assert not hf_logging.is_progress_bar_enabled()
        assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"  # a worker process reads it at import
    finally:
        hf_logging.enable_progress_bar()
        import huggingface_hub

        huggingface_hub.utils.enable_progress_bars()
