"""RUN/samples.index (drmas_bench.run_index): kept in step with samples.jsonl, trusted only while it
covers the same bytes, extended or rebuilt otherwise; one record read per distinct signature."""

from __future__ import annotations

import json
import random

from drmas_bench.run_index import INDEX, SampleIndex, cut_partial_line
from drmas_bench.run_samples import parse_sample_line
from drmas_bench.run_stamps import mismatch_signature, sample_mismatch


def _rec(b: str, i: int, s: int, agents=("solver",), temp=0.6, seed=0) -> dict:
    return {"task": {"benchmark": b, "id": str(i), "question": "q" * (i % 7)}, "sample_idx": s,
            "turns": [{"agent": a, "wg": "g", "request": {"sampling": {"temperature": temp, "seed": seed + i}},
                       "completion": {"text": "x"}} for a in agents], "run": {"identity": "abc", "workflow": "toy"}}


def _append(run, idx: SampleIndex, recs: list[dict]) -> None:
    lines = [json.dumps(r).encode() for r in recs]
    with open(run / "samples.jsonl", "ab") as f:
        f.write(b"".join(x + b"\n" for x in lines))
        end = f.tell()
    idx.add(recs, lines, end)


def _open(run) -> SampleIndex:
    return SampleIndex(run, run / "samples.jsonl", lambda raw, lineno: parse_sample_line(raw), mismatch_signature).load()


def _keys_by_reading(run) -> set:
    out = set()
    for line in (run / "samples.jsonl").read_bytes().splitlines():
        r = parse_sample_line(line)
        if r is not None:
            out.add((r["task"]["benchmark"], r["task"]["id"], r["sample_idx"]))
    return out


def test_keys_and_representatives_match_a_full_read_on_random_runs(tmp_path):
    rng = random.Random(7)
    for trial in range(5):
        run = tmp_path / f"r{trial}"
        run.mkdir()
        idx = _open(run)
        recs = [_rec(rng.choice("ab"), rng.randrange(30), rng.randrange(3), agents=("s", "c")[: rng.randint(1, 2)],
                     temp=rng.choice([0.6, 1.0])) for _ in range(rng.randint(1, 60))]
        for i in range(0, len(recs), 7):
            _append(run, idx, recs[i:i + 7])
        again = _open(run)
        assert not again.rebuilt and len(again) == len(recs)
        assert again.opened_keys == _keys_by_reading(run)
        # the plain loop: the first record of each signature, in file order
        want, seen = [], set()
        for n, r in enumerate(recs, 1):
            if mismatch_signature(r) not in seen:
                seen.add(mismatch_signature(r))
                want.append((n, r))
        assert list(again.representatives()) == want


def test_lines_appended_after_the_index_are_indexed_from_samples(tmp_path):
    """A kill between the samples append and the index append: the tail is read, nothing else."""
    idx = _open(tmp_path)
    _append(tmp_path, idx, [_rec("a", i, 0) for i in range(5)])
    with open(tmp_path / "samples.jsonl", "ab") as f:
        f.write(b"".join(json.dumps(_rec("a", i, 1)).encode() + b"\n" for i in range(3)))
    again = _open(tmp_path)
    assert not again.rebuilt and len(again) == 8 and again.opened_keys == _keys_by_reading(tmp_path)
    assert len((tmp_path / INDEX).read_text().splitlines()) == 8


def test_a_changed_samples_file_or_a_damaged_index_rebuilds_it(tmp_path):
    idx = _open(tmp_path)
    _append(tmp_path, idx, [_rec("a", i, 0) for i in range(6)])
    lines = (tmp_path / "samples.jsonl").read_bytes().splitlines(keepends=True)
    (tmp_path / "samples.jsonl").write_bytes(b"".join(lines[:2] + lines[3:]))  # a repair moved line 3 aside
    again = _open(tmp_path)
    assert again.rebuilt and len(again) == 5 and again.opened_keys == _keys_by_reading(tmp_path)
    (tmp_path / INDEX).write_text("not json\n")
    third = _open(tmp_path)
    assert third.rebuilt and len(third) == 5
    (tmp_path / INDEX).write_bytes((tmp_path / INDEX).read_bytes()[:-9])  # cut off mid-line by a kill
    fourth = _open(tmp_path)
    assert not fourth.rebuilt and len(fourth) == 5 and fourth.opened_keys == _keys_by_reading(tmp_path)


def test_state_changes_with_every_append(tmp_path):
    idx = _open(tmp_path)
    states = [idx.state()]
    for i in range(3):
        _append(tmp_path, idx, [_rec("a", i, 0)])
        states.append(idx.state())
    assert len({tuple(s) for s in states}) == 4
    assert _open(tmp_path).state() == states[-1]


def test_records_of_one_signature_get_one_answer_from_the_resume_check():
    """The signature covers what sample_mismatch reads and nothing more: records alike but for their
    per-call seeds share one; records that differ in a compared field get different answers."""
    rng = random.Random(11)
    configs = [{"identity": {"sampling": {a: {"temperature": t} for a in ("s", "c")}, "team": {}}} for t in (0.6, 1.0)]
    recs = [_rec(rng.choice("ab"), rng.randrange(50), 0, agents=("s", "c")[: rng.randint(1, 2)],
                 temp=rng.choice([0.6, 1.0]), seed=rng.randrange(10**9)) for _ in range(200)]
    by_sig: dict = {}
    for r in recs:
        by_sig.setdefault(mismatch_signature(r), []).append(r)
    assert len(by_sig) <= 8  # 2 benchmarks x 2 agent lists x 2 temperatures, whatever the seeds
    for group in by_sig.values():
        for cfg in configs:
            assert len({tuple(sample_mismatch(r, cfg)) for r in group}) == 1


def test_a_partial_last_line_is_cut_as_the_whole_file_rule_cuts_it(tmp_path):
    """Reading from the end in blocks against the plain rule (everything after the last newline goes),
    on random files with lines longer than a block."""
    rng = random.Random(5)
    for trial in range(150):
        data = b"".join(rng.choice([b"a" * rng.randrange(0, 70000), b"x\n", b"\n", b"yy"]) for _ in range(rng.randrange(1, 6)))
        f = tmp_path / f"s{trial}.jsonl"
        f.write_bytes(data)
        cut_partial_line(f)
        assert f.read_bytes() == (data if data.endswith(b"\n") else data[: data.rfind(b"\n") + 1])
