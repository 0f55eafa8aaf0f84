"""A 2-agent multiple-choice team: a proposer picks a letter, a judge accepts it or sends it back."""

import re
from collections import Counter

from drmas_bench.suite import (Benchmark, Effects, Episode, Family, FormatRule, Suite, Task, chat, format_rule,
                               mean_or_none, register, register_family, register_suite, workflow)

QUESTIONS = [("What is 2 + 2?", "3 4 5 22", "B"), ("Which is prime?", "4 6 7 9", "C"), ("Which is largest?", "1 9 3 5", "B")]


def mcq_tasks() -> list[Task]:
    return [Task(f"q{i}", "mcq_demo", q + "".join(f"\n{k}) {c}" for k, c in zip("ABCD", cs.split())), [gold])
            for i, (q, cs, gold) in enumerate(QUESTIONS)]


def letter(text: str | None) -> str | None:
    found = re.findall(r"\b([A-D])\b", text or "")
    return found[-1] if found else None


def verdict(text: str) -> str:
    return "accept" if "accept" in text.lower() else "reject"


register_suite(Suite("mcq", workflow="propose_judge", max_new_tokens=16, family="mcq"))
register(Benchmark("mcq_demo", "mcq", "Multiple choice (demo)", 3, to_task=lambda rec, i, b: Task.from_dict(rec),
                   generate=mcq_tasks))
register_family("mcq", Family(lambda pairs, timeout_s, grader: [(letter(a) == g[0], {}) for a, g in pairs]))
PROPOSE = format_rule(FormatRule("mcq_letter", lambda t: [] if letter(t) else ["no_letter"], ("no_letter",),
                                 parse=lambda t: (letter(t), None), labels={"no_letter": "no A-D letter"}))
JUDGE = format_rule(FormatRule("mcq_verdict", lambda t: [], parse=lambda t: (None, verdict(t)), labels={
    "verdicts": "rulings", "reasoned": "rulings with a reason"}, agent_figures=lambda texts: {
    "verdicts": dict(Counter(map(verdict, texts))), "reasoned": sum("because" in t for t in texts)}))
RETRIES = Effects("mcq", lambda recs: {"episodes": len(recs), "retried": mean_or_none(  # over the run's records
    [len(r.agent_turns("proposer")) > 1 for r in recs])}, {"retried": "answered twice (%)", "episodes": "episodes"},
    phrase="answered twice in {retried}")


@workflow("propose_judge", agents=("proposer", "judge"), family="mcq", title="propose-judge",
          rules={"proposer": PROPOSE, "judge": JUDGE}, effects=RETRIES)
async def propose_judge(ep: Episode, tries: int = 2) -> None:
    note = ""
    for _ in range(tries):
        said = await ep.proposer(chat("Answer with one letter, A to D.", ep.task.question + note))
        said.valid, ep.final_answer = not PROPOSE.reasons(said.completion.text), said.completion.text
        judged = await ep.judge(chat("Reply accept or reject.", f"{ep.task.question}\nProposed: {ep.final_answer}"))
        if verdict(judged.completion.text) == "accept":
            break
        note = f"\n{ep.final_answer} was rejected."
