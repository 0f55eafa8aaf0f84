"""-v / -q / --debug, the one path of unexpected errors, trackers, metric names, workflow defaults."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from drmas_bench import log
from drmas_bench.cli import build_parser, main
from drmas_bench.types import UserError


@pytest.fixture()
def restore_logging():
    yield
    log.setup()  # back to the default INFO handler for the following tests


def test_verbosity_flags_set_the_level_before_or_after_the_command(restore_logging):
    p = build_parser()
    for argv, level in [(["models", "list"], logging.INFO), (["-q", "models", "list"], logging.WARNING),
                        (["models", "list", "-q"], logging.WARNING), (["-v", "models", "list"], logging.DEBUG),
                        (["data", "check", "-v"], logging.DEBUG)]:
        a = p.parse_args(argv)
        assert log.level_for(a.verbose, a.quiet) == level, argv
    assert p.parse_args(["--debug", "models", "list"]).debug is True
    assert p.parse_args(["models", "list", "--debug"]).debug is True


def test_quiet_hides_progress_messages_but_not_results(capsys, restore_logging):
    # tiny-random is already built (conftest / setup), so `prepare` only says so: an INFO message
    assert main(["models", "prepare", "tiny-random"]) == 0
    assert "tiny-random: already prepared" in capsys.readouterr().err
    assert main(["-q", "models", "prepare", "tiny-random"]) == 0
    assert capsys.readouterr().err == ""
    assert main(["-q", "models", "list"]) == 0
    assert "tiny-random" in capsys.readouterr().out  # results on stdout stay


def _fake_crash(args):
    """A fake command: a bug deep inside it."""
    raise RuntimeError("boom from the fake command")


def _fake_crash_in_run(tmp: Path):
    def cmd(args):
        try:
            raise ValueError("bad value deep in a run")
        except ValueError as e:  # what evaluate()/train do: traceback to RUN/error.log, one line up
            from drmas_bench.run_dir import write_error_log

            raise log.unexpected(e, "run stopped", log=write_error_log(tmp, e), hint="re-run to resume") from None
    return cmd


def test_unexpected_error_is_one_line_with_its_traceback_kept(monkeypatch, capsys):
    import drmas_bench.commands.models as models_cmd

    monkeypatch.setattr(models_cmd, "cmd_list", _fake_crash)
    assert main(["models", "list"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("drmas-bench: error: unexpected error (RuntimeError: boom")
    path = Path(err.rsplit("traceback in ", 1)[1])
    try:
        text = path.read_text()
        assert "Traceback (most recent call last)" in text and "_fake_crash" in text
    finally:
        path.unlink()


def test_debug_reraises_the_original_exception_with_its_traceback(monkeypatch, tmp_path):
    import drmas_bench.commands.models as models_cmd

    monkeypatch.setattr(models_cmd, "cmd_list", _fake_crash)
    with pytest.raises(RuntimeError, match="boom") as e:
        main(["--debug", "models", "list"])
    assert "_fake_crash" in {f.name for f in e.traceback}

    monkeypatch.setattr(models_cmd, "cmd_list", _fake_crash_in_run(tmp_path))
    assert main(["models", "list"]) == 2
    assert "ValueError: bad value deep in a run" in (tmp_path / "error.log").read_text()
    with pytest.raises(ValueError, match="bad value deep in a run") as e:
        main(["models", "list", "--debug"])
    assert e.value.__context__ is None or not isinstance(e.value.__context__, UserError)


def test_user_errors_stay_one_line_under_debug(monkeypatch, capsys):
    import drmas_bench.commands.models as models_cmd

    def fake_user_mistake(args):
        raise UserError("no such thing")

    monkeypatch.setattr(models_cmd, "cmd_list", fake_user_mistake)
    assert main(["--debug", "models", "list"]) == 2
    assert capsys.readouterr().err == "drmas-bench: error: no such thing\n"


# --- trackers -------------------------------------------------------------------------------------


def test_requested_tracker_that_is_missing_is_a_one_line_error(monkeypatch, tmp_path, capsys):
    from drmas_trainer import trackers

    monkeypatch.setitem(trackers.TRACKERS, "wandb", trackers.TrackerKind("wandb", "drmas_no_such_module", "wandb"))
    with pytest.raises(UserError, match=r"pip install 'drmas-bench\[wandb\]'"):
        trackers.check_tracker("wandb")
    with pytest.raises(UserError, match="unknown tracker 'tb'; use one of: none, tensorboard, wandb"):
        trackers.check_tracker("tb")
    out = tmp_path / "run"
    assert main(["train", "--recipe", "tiny", "--steps", "1", "--local", "--no-progress", "--out", str(out),
                 "--set", "tracker=wandb"]) == 2
    err = capsys.readouterr().err
    assert "drmas-bench[wandb]" in err and not out.exists()  # checked before the run directory exists


def test_tracker_none_is_the_default_and_sends_only_finite_numbers():
    from drmas_trainer.config.train import load_config
    from drmas_trainer.trackers import Tracker, make_tracker, scalars

    assert load_config("tiny", {}).tracker == "none"
    assert type(make_tracker("none", Path("unused"))) is Tracker
    assert scalars({"step": 3, "a": 1, "b": float("nan"), "c": True, "d": "x", "e": 0.5}) == {"a": 1.0, "e": 0.5}


def test_tensorboard_tracker_writes_events(tmp_path):
    pytest.importorskip("tensorboard")
    from drmas_trainer.runlog import MetricsLog

    m = MetricsLog(tmp_path, tracker="tensorboard")
    m.write({"step": 1, "critic/score/mean": 0.5})
    m.close()
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))


# --- metric names and workflow defaults -----------------------------------------------------------


def test_metric_name_scopes():
    from drmas_trainer import metric_names as N

    keys = {N.agent("solver", N.GRAD_NORM), N.agent("solver", N.GRAD_NORM_MAX), N.agent("checker", N.GRAD_NORM),
            N.wg("solver", N.GRAD_NORM), N.GRAD_NORM}
    assert N.agents_with(keys, N.GRAD_NORM) == ["checker", "solver"]
    assert N.GRAD_NORM == "actor/grad_norm" and N.SCORE == "critic/score/mean"
    assert set(N.AVERAGED) <= set(N.UPDATE_KEYS)


def test_workflow_defaults_come_from_the_signature():
    from drmas_bench.workflows.base import get_workflow, signature_defaults

    assert get_workflow("math_refine").defaults == {"rounds": 2, "prompts": None, "protocol": None}
    assert get_workflow("search_route").defaults == {"max_steps": 4, "topk": 3, "prompts": None, "protocol": None,
                                                     "last_step": "end"}

    async def fake_workflow(ep, depth: int = 3, *, style: str = "short", **extra): ...

    assert signature_defaults(fake_workflow) == {"depth": 3, "style": "short"}

    async def no_default(ep, depth): ...

    with pytest.raises(ValueError, match="depth need a default"):
        signature_defaults(no_default)
