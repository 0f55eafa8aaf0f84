"""Imported once by the grading pool's forkserver, before it forks workers.

Grading a few typical answers here loads the parts of sympy that load lazily on first use
(numeric evaluation, polynomial code, printing) once, in the server, so every forked worker
starts with them in memory instead of paying for them on its first items.
"""

from __future__ import annotations

from drmas_bench.grading.math import answers_equal

_SAMPLES = (
    ("\\frac{1}{2}", "0.5"),
    ("3\\sqrt{13}", "\\sqrt{117}"),
    ("x^2-1", "(x-1)(x+1)"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\pi/2)"),
    ("1 \\pm \\sqrt{19}", "1-\\sqrt{19}, 1+\\sqrt{19}"),
    ("5x - 7y + 11z + 4 = 0", "-5x+7y-11z-4=0"),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix} 1 \\\\ 3 \\end{pmatrix}"),
    ("\\ln 2 + i\\pi / 3", "\\log(2)+\\frac{\\pi i}{3}"),
    ("\\cot x", "\\frac{\\cos x}{\\sin x}"),
    ("(0,9) \\cup (9,36)", "(0,9)\\cup(9,36)"),
)


def warm_up() -> None:
    for gold, pred in _SAMPLES:
        try:
            answers_equal(gold, pred)
        except Exception:  # a warm-up must never stop the server from starting
            pass


warm_up()
