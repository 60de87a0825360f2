"""``tracestory serve --help`` lists every engine switch the code reads (the variables are the
modules' own constants, so a renamed or new switch must be listed too)."""

import subprocess
import sys

from tracestory.models import decode_attn, pdl
from tracestory.serve import allreduce, fresh_attention, stackwatch


def test_serve_help_names_the_engine_switches():
    out = subprocess.run([sys.executable, "-m", "tracestory.cli", "serve", "--help"], capture_output=True,
                         text=True, check=True).stdout
    tail = out.split("engine switches")[1]
    for name in (pdl.ENV, decode_attn.ENV, fresh_attention.ENV, allreduce.ENV, "TRACESTORY_SMALL_M",
                 "TRACESTORY_GLUE", stackwatch.ENV, stackwatch.DIR_ENV):
        assert name in tail, name
