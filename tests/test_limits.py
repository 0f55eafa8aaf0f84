"""Run limits (`--max-usd`, `--max-tokens`, a team file's `limits:`): a run stops cleanly before the
call that would start past one, keeps what finished, says so in its summary and exit code, and a
re-run with a higher limit resumes it to the same samples an unlimited run gives."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from drmas_bench import EvalConfig, evaluate
from drmas_bench.cli import main
from drmas_bench.limits import EXIT_CODE, LimitedEngine, LimitReached, Limits, Meter
from drmas_bench.pricing import PriceSheet
from drmas_bench.types import Completion, Request, Sampling, UserError

TOY = ["eval", "--model", "tiny-random", "--suite", "toy", "--no-progress", "--max-new-tokens", "12", "--n", "2",
       "--limit", "4", "--concurrency", "1", "--flush-every", "1"]
PLANNED = 8  # 4 questions x 2 samples


def _cfg(out: Path, **kw) -> EvalConfig:
    return EvalConfig(model="tiny-random", suite="toy", n=2, limit=4, max_new_tokens=12, concurrency=1, flush_every=1,
                      progress=False, out=str(out), **kw)


def _samples(run: Path) -> dict[tuple, tuple]:
    """(benchmark, task id, sample) -> what the sample said, call by call."""
    out = {}
    for line in (run / "samples.jsonl").read_text().splitlines():
        r = json.loads(line)
        out[(r["task"]["benchmark"], r["task"]["id"], r["sample_idx"])] = (
            r["final_answer"], tuple((t["agent"], t["completion"]["text"]) for t in r["turns"]))
    return out


def _tokens(run: Path) -> int:
    return sum(t["completion"]["prompt_tokens"] + t["completion"]["completion_tokens"]
               for line in (run / "samples.jsonl").read_text().splitlines() for t in json.loads(line)["turns"])


def test_max_usd_stops_part_way_keeping_finished_samples(tmp_path, capsys):
    prices = tmp_path / "prices.yaml"
    prices.write_text("models:\n  tiny-random: {input_per_1m: 1000, output_per_1m: 1000}\n")  # ~$0.15 an episode
    run = tmp_path / "run"
    assert main(TOY + ["--out", str(run), "--prices", str(prices), "--max-usd", "0.3"]) == EXIT_CODE
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("drmas-bench: stopped: --max-usd 0.3 reached ($0.") and "re-run with a higher limit" in err
    kept = _samples(run)
    assert 0 < len(kept) < PLANNED
    summary = json.loads((run / "summary.json").read_text())
    stop = summary["run"]["stopped"]
    assert stop["limit"] == "--max-usd" and stop["value"] == 0.3 and stop["used"] >= 0.3 and stop["agent"] is None
    used = summary["run"]["limits"]["used"]
    # what the kept samples cost (the summary's own figure) plus what the abandoned episode had spent
    kept_usd = sum(json.loads(line)["cost_usd"] for line in (run / "samples.jsonl").read_text().splitlines())
    assert used["usd"] == pytest.approx(kept_usd + used["abandoned"]["usd"], abs=1e-6)
    assert used["usd"] - kept_usd < 0.3  # overshoot: at most the one call in flight (concurrency 1)
    md = (run / "summary.md").read_text()
    assert md.splitlines()[0].startswith("> **Stopped by a limit:** --max-usd 0.3 reached") and \
        f"{len(kept)} of {PLANNED} samples are finished" in md.splitlines()[0]
    # the export layer reads the stop from the summary
    from drmas_bench.export.source import stop_reason
    assert stop_reason(summary).startswith("--max-usd 0.3 reached")
    # the same command with a higher limit resumes and finishes the run
    assert main(TOY + ["--out", str(run), "--prices", str(prices), "--max-usd", "100"]) == 0
    done = json.loads((run / "summary.json").read_text())
    assert "stopped" not in done["run"] and done["run"]["episodes_resumed"] == len(kept)
    assert len(_samples(run)) == PLANNED and all(_samples(run)[k] == v for k, v in kept.items())


def test_resume_with_a_higher_limit_gives_the_unlimited_run(tmp_path):
    run, plain = tmp_path / "limited", tmp_path / "plain"
    with pytest.raises(LimitReached) as e:
        evaluate(_cfg(run, max_tokens=300))
    first = _samples(run)
    assert e.value.summary.run_dir == run and 0 < len(first) < PLANNED
    stop = e.value.stop
    assert stop["limit"] == "--max-tokens" and stop["used"] >= 300
    gone = e.value.summary["run"]["limits"]["used"]["abandoned"]
    assert gone["tokens"] > 0  # the episode in flight had spent a call before it was abandoned
    assert stop["used"] == _tokens(run) + gone["tokens"]
    # the same limit again: already reached by the kept samples and the abandoned calls, nothing runs
    with pytest.raises(LimitReached) as again:
        evaluate(_cfg(run, max_tokens=300))
    assert again.value.summary["run"]["episodes_run"] == 0 and _samples(run) == first
    assert again.value.stop["limit"] == "--max-tokens"
    # a higher limit resumes the same run directory and finishes it
    s = evaluate(_cfg(run, max_tokens=10**6))
    assert "stopped" not in s["run"] and s["run"]["episodes_resumed"] == len(first)
    assert s["run"]["limits"]["used"]["tokens"] == _tokens(run) + gone["tokens"]
    evaluate(_cfg(plain))
    assert _samples(run) == _samples(plain)


def test_many_episodes_in_flight_stop_near_the_limit(tmp_path):
    """256 episodes may run at once; a new one starts only while the finished ones' mean spending says
    it and those in flight fit, so a tight limit is not overrun by a wave of first calls."""
    run = tmp_path / "run"
    with pytest.raises(LimitReached) as e:
        evaluate(EvalConfig(model="tiny-random", suite="toy", n=4, limit=16, max_new_tokens=12, progress=False,
                            out=str(run), max_tokens=1500))
    kept = _samples(run)
    per_episode = _tokens(run) / len(kept)
    used = e.value.summary["run"]["limits"]["used"]
    assert 1500 <= used["tokens"] < 1500 + 2 * per_episode
    assert used["tokens"] == _tokens(run) + used["abandoned"]["tokens"]
    assert len(kept) >= (1500 - per_episode) // per_episode


def test_a_limit_below_one_episode_keeps_nothing_and_says_so(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(TOY + ["--out", str(run), "--max-tokens", "10"]) == EXIT_CODE
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("drmas-bench: stopped: --max-tokens 10 reached (") and "before any sample finished" in err
    assert not (run / "summary.json").exists() and not (run / "samples.jsonl").exists()


def test_per_agent_limit_from_a_team_file(tmp_path):
    team = tmp_path / "team.yaml"
    team.write_text("worker_groups: {a: {model: tiny-random}}\n"
                    "agents: {solver: a, checker: {wg: a, limits: {max_tokens: 200}}}\n")
    run = tmp_path / "run"
    with pytest.raises(LimitReached) as e:
        evaluate(EvalConfig(team=str(team), suite="toy", n=2, limit=4, max_new_tokens=12, concurrency=1, flush_every=1,
                            progress=False, out=str(run)))
    stop = e.value.stop
    assert stop["agent"] == "checker" and stop["limit"] == "--max-tokens" and stop["value"] == 200
    assert stop["reason"].startswith(f"agent 'checker': max_tokens 200 ({team}: agents.checker.limits.max_tokens) reached")
    used = e.value.summary["run"]["limits"]["used"]["agents"]
    assert used["checker"]["tokens"] >= 200 and used["solver"]["tokens"] > 0  # the solver alone had no limit
    assert 0 < len(_samples(run)) < PLANNED
    # a team file's run-wide limit, overridden by the flag
    team.write_text("worker_groups: {a: {model: tiny-random}}\nagents: {solver: a, checker: a}\nlimits: {max_tokens: 100}\n")
    s = evaluate(EvalConfig(team=str(team), suite="toy", n=2, limit=4, max_new_tokens=12, progress=False, out=str(run),
                            max_tokens=10**6))
    assert s["run"]["limits"]["max_tokens"] == 10**6 and len(_samples(run)) == PLANNED


def test_bad_limits_are_refused_before_the_run_dir(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(TOY + ["--out", str(run), "--max-usd", "1"]) == 2
    assert capsys.readouterr().err.strip() == ("drmas-bench: error: --max-usd needs a price sheet to count dollars: "
                                               "pass --prices FILE (docs/pricing.md), or limit tokens with --max-tokens")
    assert main(TOY + ["--out", str(run), "--max-tokens", "0"]) == 2
    assert "--max-tokens must be an integer >= 1, got 0" in capsys.readouterr().err
    team = tmp_path / "team.yaml"
    team.write_text("worker_groups: {a: {model: tiny-random}}\nagents: {solver: {wg: a, limits: {max_usd: 2}}, checker: a}\n")
    assert main(["eval", "--team", str(team), "--suite", "toy", "--out", str(run)]) == 2
    assert f"{team}: agents.solver.limits.max_usd needs a price sheet" in capsys.readouterr().err
    team.write_text("worker_groups: {a: {model: tiny-random}}\nagents: {solver: a, checker: a}\nlimits: {max_usd: -1}\n")
    assert main(["eval", "--team", str(team), "--suite", "toy", "--out", str(run)]) == 2
    assert "limits.max_usd" in capsys.readouterr().err
    assert not run.exists()


def _turn(agent: str, wg: str, pt: int, ct: int, **c) -> dict:
    return {"agent": agent, "wg": wg, "completion": {"prompt_tokens": pt, "completion_tokens": ct, "latency_s": 0.5, **c}}


def test_meter_counts_as_a_plain_loop():
    prices = PriceSheet.from_dict({"models": {"big": {"input_per_1m": 3.0, "output_per_1m": 15.0},
                                              "small": {"input_per_1m": 0.2, "output_per_1m": 0.6, "gpu_hour": 2.0}}})
    records = [{"turns": [_turn("solver", "big", 1200, 300), _turn("verifier", "small", 900, 40)]},
               {"turns": [_turn("solver", "big", 1100, 500, cache_hit=True, cached_usd=0.01),
                          _turn("verifier", "small", 950, 20, usage="counted")]},
               {"turns": [_turn("solver", "big", 1000, 250)]}]
    meter = Meter(Limits(max_usd=1.0, max_tokens=10**6), prices).add_records(records)
    tokens, usd, per_agent = 0, 0.0, {}
    for r in records:  # the plain loop: a cache hit spent nothing
        for t in r["turns"]:
            c = t["completion"]
            if c.get("cache_hit"):
                continue
            p = prices.lookup(t["wg"])
            d = c["prompt_tokens"] * p.input_per_1m / 1e6 + c["completion_tokens"] * p.output_per_1m / 1e6 \
                + p.gpu_hour * p.gpus * c["latency_s"] / 3600
            tokens += c["prompt_tokens"] + c["completion_tokens"]
            usd += d
            per_agent[t["agent"]] = per_agent.get(t["agent"], 0) + c["prompt_tokens"] + c["completion_tokens"]
    assert meter.tokens == tokens and meter.usd == pytest.approx(usd)
    assert {a: int(d["tokens"]) for a, d in meter.agents.items()} == per_agent
    assert meter.reached() is None
    # a limit is reached at equality, and names itself
    assert Meter(Limits(max_tokens=tokens), prices).add_records(records).reached()["used"] == tokens
    # usage nobody counted cannot be counted against a limit that covers its agent
    unknown = [{"turns": [_turn("verifier", "small", 0, 0, usage="unknown")]}]
    with pytest.raises(UserError, match="cannot count agent 'verifier'"):
        Meter(Limits(max_tokens=10), prices).add_records(unknown)
    Meter(Limits(agents={"solver": {"max_tokens": 10}}), prices).add_records(unknown)  # not covered: fine


class _FakeEngine:
    """A fake engine for the wrapper's orchestration: every call spends 40 tokens."""

    def __init__(self) -> None:
        self.calls = 0

    async def generate(self, requests):
        self.calls += len(requests)
        return [Completion(text="x", prompt_tokens=30, completion_tokens=10) for _ in requests]


def test_no_call_starts_past_a_limit():
    engine, meter = _FakeEngine(), Meter(Limits(max_tokens=100))
    limited = LimitedEngine(engine, meter, "wg")
    req = Request(agent="solver", messages=[{"role": "user", "content": "q"}], sampling=Sampling())

    async def go():
        for _ in range(3):  # 0, 40, 80 tokens before each: all start
            await limited.generate([req])
        await limited.generate([req])  # 120 >= 100: refused before the engine sees it

    with pytest.raises(LimitReached) as e:
        asyncio.run(go())
    assert engine.calls == 3 and e.value.stop["used"] == 120 and meter.record([])["used"]["abandoned"]["tokens"] == 120


def test_sweep_takes_the_limits(capsys):
    with pytest.raises(SystemExit):
        main(["sweep", "--help"])
    out = capsys.readouterr().out
    assert "--max-usd USD" in out and "--max-tokens N" in out


def _episode(tokens: int):
    """A finished episode as the runner hands it to the meter: one call of `tokens` tokens."""
    from types import SimpleNamespace

    c = Completion(text="x", prompt_tokens=tokens - 10, completion_tokens=10)
    return SimpleNamespace(turns=[SimpleNamespace(agent="solver", wg="wg", completion=c)])


def test_a_new_episode_waits_while_those_in_flight_may_spend_what_is_left():
    meter = Meter(Limits(max_tokens=100)).learn([{"turns": [_turn("solver", "wg", 30, 10)]}])  # 40 an episode
    started: list[int] = []

    async def go():
        async def episode(i: int):
            await meter.start_episode()
            started.append(i)

        await meter.start_episode()
        await meter.start_episode()  # 0 used + 2 x 40 fits 100
        third = asyncio.ensure_future(episode(3))
        await asyncio.sleep(0)
        assert started == [] and meter.running == 2  # 3 x 40 would not: it waits
        meter.add(_turn("solver", "wg", 30, 10))
        await meter.end_episode(_episode(40))  # 40 used + 2 x 40 still passes 100
        await asyncio.sleep(0)
        assert started == []
        meter.add(_turn("solver", "wg", 30, 10))
        await meter.end_episode(_episode(40))  # none in flight: one more may start (80 < 100)
        await third
        assert started == [3] and meter.running == 1
        meter.add(_turn("solver", "wg", 30, 10))
        await meter.end_episode(_episode(40))
        with pytest.raises(LimitReached):  # 120 >= 100: reached, nothing starts
            await meter.start_episode()

    asyncio.run(go())
