"""Goal Interpretation: the user's goal and questions, and the questions every report answers."""

from __future__ import annotations

from . import Context


def _goal(goal, questions, analyses) -> list[str]:
    out = [f"**Original Goal**: {goal if goal else 'none given (pass --goal TEXT)'}", "",
           "**Interpreted As**:", ""]
    qs = list(questions) + ["Where does the GPU time go, and what is the ceiling if the top "
                            "category got faster? (Observations, Appendix)",
                            "Is the GPU kept busy, or is the run launch-/host-bound? "
                            "(Observations, Visualizations)",
                            "What happens phase by phase, and how do the steps differ? "
                            "(Execution Story)"]
    out += [f"{i}. {q}" for i, q in enumerate(qs, 1)]
    return out + [""]


def render(c: Context) -> list[str]:
    if c.no_trace:
        return [c.no_trace, ""]
    o = c.results.options
    return _goal(o.goal, o.questions, c.results.analyses)
