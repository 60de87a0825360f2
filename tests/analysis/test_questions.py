"""Questions mapped to findings and sections; expectations written from the intent table."""

from __future__ import annotations

from dataclasses import dataclass

from tracestory.analysis.questions import answer, answer_all


@dataclass
class F:
    rule: str
    title: str


FINDINGS = [F("step_trend", "Decode step time grows 2.1% per step"), F("gpu_idle", "GPU idle 62% of the window"),
            F("memory", "Peak memory 71% of the device")]
SECTIONS = ("Executive Summary", "Execution Story", "Memory")


def test_decode_question_gets_the_step_findings():
    a = answer("Why is decode slow?", FINDINGS, SECTIONS)
    assert a.answered and "decode steps" in a.intents and "time breakdown" in a.intents
    assert "Decode step time grows 2.1% per step" in a.findings and "GPU idle 62% of the window" in a.findings
    assert "Execution Story" in a.sections


def test_question_the_inputs_cannot_answer_says_so():
    a = answer("Is there a straggler rank in the all-reduce?", FINDINGS, SECTIONS)
    assert not a.answered and a.intents == ("communication",)
    assert a.why_not == "these inputs hold no collectives or several ranks"


def test_unknown_topic_is_not_guessed():
    a = answer("What colour is the sky?", FINDINGS, SECTIONS)
    assert not a.answered and a.intents == () and "no known topic" in a.why_not


def test_goal_first_then_questions():
    out = answer_all("understand memory", ["why is decode slow?"], FINDINGS, SECTIONS)
    assert [a.question for a in out] == ["understand memory", "why is decode slow?"]
    assert out[0].findings == ("Peak memory 71% of the device",) and out[0].sections == ("Memory",)
