"""Goal Interpretation: the user's goal and questions, and the questions every report answers."""

from __future__ import annotations

from . import Context

EVERY_REPORT = (
    "where the GPU time goes (Observations, Appendix), whether the GPU is kept busy "
    "(Observations, Visualizations) and what happens phase by phase (Execution Story)"
)


def _goal(goal, questions, analyses) -> list[str]:
    if not goal and not questions:
        return [
            f"**Original Goal**: none given (pass `--goal TEXT`). The report answers what every report "
            f"answers: {EVERY_REPORT}.",
            "",
        ]
    out = [f"**Original Goal**: {goal if goal else 'none given (pass --goal TEXT)'}", "", "**Interpreted As**:", ""]
    qs = list(questions) + [
        "Where does the GPU time go, and what is the ceiling if the top category got faster? (Observations, Appendix)",
        "Is the GPU kept busy, or is the run launch-/host-bound? (Observations, Visualizations)",
        "What happens phase by phase, and how do the steps differ? (Execution Story)",
    ]
    out += [f"{i}. {q}" for i, q in enumerate(qs, 1)]
    return out + [""]


def _answers(answers) -> list[str]:
    """Each question of the user mapped to the findings and sections that answer it."""
    if not answers:
        return []
    out = ["**Answers** (from these inputs):", ""]
    for a in answers:
        if a.answered:
            where = f" See {', '.join(a.sections)}." if a.sections else ""
            said = "; ".join(a.findings) if a.findings else "the numbers are in the sections named"
            out.append(f'- "{a.question}" ({", ".join(a.intents)}): {said}.{where}')
        else:
            out.append(f'- "{a.question}": not answered by these inputs ({a.why_not}).')
    return out + [""]


def render(c: Context) -> list[str]:
    if c.no_trace:
        return [c.no_trace, ""]
    o = c.results.options
    return _goal(o.goal, o.questions, c.results.analyses) + _answers(c.results.answers)
