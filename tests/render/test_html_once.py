"""The HTML report shows each chart once: every PNG written is embedded exactly once, and an ASCII
chart that has a PNG twin is not shown beside it (the Markdown keeps both)."""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

import pytest

from conftest import A100_NCCL, H200_LLAMA, TEST_DATA
from tracestory.cli import main as cli_main


@pytest.mark.parametrize(
    "inputs", [[H200_LLAMA], [A100_NCCL], [TEST_DATA / "tp_serve_gpu"]], ids=["llama", "nccl", "tp"]
)
def test_each_chart_once(tmp_path, inputs):
    md = tmp_path / "report.md"
    assert cli_main(["report", *map(str, inputs), "-o", str(md), "--plots", "--html"]) == 0
    text, page = md.read_text(), md.with_suffix(".html").read_text()
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert any("timeline" in p for p in pngs) and any("breakdown" in p for p in pngs)
    # Markdown: each PNG referenced once
    refs = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", text)
    assert sorted(refs) == pngs
    # HTML: each PNG embedded once, byte for byte
    embedded = [base64.b64decode(s) for s in re.findall(r'<img src="data:image/png;base64,([^"]*)"', page)]
    for name in pngs:
        assert embedded.count((tmp_path / name).read_bytes()) == 1, name
    assert len(embedded) == len(pngs)
    # the ASCII twins (fences naming a PNG) are in the Markdown, not in the page; the other blocks are
    blocks = re.findall(r"^```([^\n]*)\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)
    pres = [html.unescape(p) for p in re.findall(r"<pre><code[^>]*>(.*?)</code></pre>", page, flags=re.DOTALL)]
    twins = [(info, body) for info, body in blocks if " png=" in info]
    assert {"breakdown", "timeline"} <= {Path(info.split("png=")[1]).stem.split("_")[1] for info, _ in twins}
    assert all(body not in pres for _, body in twins)
    assert pres == [body for info, body in blocks if " png=" not in info]
