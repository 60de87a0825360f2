"""HTML report: a self-contained page, checked statically and in headless Chromium.

The Chromium test drives Debian's ``chromium`` through the DevTools protocol (a minimal
websocket client below: handshake, masked text frames out, unmasked frames in) so that every
console message the page produces is seen, including failed resource loads and CSP
violations, which ``--enable-logging`` does not print.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import time
import urllib.request
import zlib
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from conftest import H200_LLAMA
from tracestory.cli import main as cli_main
from tracestory.errors import TraceFormatError
from tracestory.render.html import render_html, write_html

CHROMIUM = "/usr/bin/chromium"


def _png_1px() -> bytes:
    """A 1x1 red PNG: signature, IHDR, IDAT (zlib of filter byte 0 + RGB), IEND."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00"))
            + chunk(b"IEND", b""))


_PNG_1PX = _png_1px()


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    """``tracestory report <H200 fixture> --plots``, rendered to HTML next to it."""
    out = tmp_path_factory.mktemp("report")
    md = out / "report.md"
    assert cli_main(["report", str(H200_LLAMA), "-o", str(md), "--plots"]) == 0
    write_html(md, out / "report.html")
    return md


def _images_in_markdown(text: str) -> list[str]:
    return re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", text)


def _h2_outside_fences(text: str) -> list[str]:
    heads, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("## "):
            heads.append(line[3:].strip())
    return heads


# ----------------------------------------------------------------------------- static checks


def test_every_plot_is_embedded_byte_for_byte(report):
    text = report.read_text()
    page = report.with_suffix(".html").read_text()
    refs = _images_in_markdown(text)
    # --plots writes at least the category breakdown and the timeline for this fixture.
    assert any("breakdown" in r for r in refs) and any("timeline" in r for r in refs), refs
    srcs = re.findall(r'<img src="([^"]*)"', page)
    assert len(srcs) == len(refs)
    for ref, src in zip(refs, srcs):
        prefix = "data:image/png;base64,"
        assert src.startswith(prefix)
        assert base64.b64decode(src[len(prefix):]) == (report.parent / ref).read_bytes()


def test_page_references_nothing_outside_itself(report):
    page = report.with_suffix(".html").read_text()
    assert "<script" not in page.lower()
    assert "<link" not in page.lower()
    for attr, value in re.findall(r'\b(src|href)="([^"]*)"', page):
        if attr == "src":
            assert value.startswith("data:"), value
        else:  # only <a> links (no <link>): navigation on a click, never loaded with the page
            assert value.startswith(("#", "http://", "https://")), value


def test_contents_lists_every_section_and_targets_exist(report):
    text = report.read_text()
    page = report.with_suffix(".html").read_text()
    nav = page[page.index('<nav class="toc">'):page.index("</nav>")]
    entries = re.findall(r'<li><a href="#([^"]+)">(.*?)</a></li>', nav)
    assert [re.sub(r"<[^>]+>", "", label) for _, label in entries] == _h2_outside_fences(text)
    ids = set(re.findall(r'\sid="([^"]+)"', page))
    assert all(target in ids for target, _ in entries)
    assert len(ids) == len(re.findall(r'\sid="', page))  # ids are unique


def test_code_fences_become_pre_blocks_verbatim(report):
    text = report.read_text()
    page = report.with_suffix(".html").read_text()
    # an ASCII chart whose fence names its PNG twin (```text png=NAME) is shown as that PNG only
    blocks = re.findall(r"^```([^\n]*)\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)
    fences = [body for info, body in blocks if " png=" not in info]
    assert len(fences) < len(blocks)
    pres = re.findall(r"<pre><code[^>]*>(.*?)</code></pre>", page, flags=re.DOTALL)
    assert len(pres) == len(fences) > 0
    import html

    for body, pre in zip(fences, pres):
        assert html.unescape(pre) == body


def test_markdown_subset_renders(tmp_path):
    md = (
        "# Title\n\n## First `part`\n\nSome **bold**, `code` and [a link](https://example.org).\n\n"
        "- one\n- two\n\n1. a\n2. b\n\n| k | v |\n| --- | ---: |\n| x | 1 |\n\n"
        "## First part\n\n<script>alert(1)</script>\n\n![remote](https://example.org/x.png)\n"
    )
    page = render_html(md, base_dir=tmp_path, title="T <&>")
    assert "<title>T &lt;&amp;&gt;</title>" in page
    assert "<strong>bold</strong>" in page and "<code>code</code>" in page
    assert '<a href="https://example.org">a link</a>' in page
    assert "<ul>\n<li>one</li>" in page and "<ol>\n<li>a</li>" in page
    assert '<div class="table-wrap"><table>' in page and '<td style="text-align:right">1</td>' in page
    # Raw HTML is escaped, not executed.
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    # A remote image is never fetched: it becomes a link.
    assert "<img" not in page and 'href="https://example.org/x.png"' in page
    # Duplicate headings get distinct ids; the TOC lists both ## headings with inline markup.
    assert 'id="first-part"' in page and 'id="first-part-2"' in page
    assert '<a href="#first-part">First <code>part</code></a>' in page
    # The title stays first, the contents follow it.
    assert page.index("<h1") < page.index('<nav class="toc">') < page.index('id="first-part"')


def test_local_images_resolve_relative_absolute_and_escaped(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a b.png").write_bytes(_PNG_1PX)
    other = tmp_path / "abs.png"
    other.write_bytes(_PNG_1PX)
    md = f"![one](sub/a%20b.png)\n\n![two](<sub/a b.png>)\n\n![three]({other})\n"
    page = render_html(md, base_dir=tmp_path, title="t")
    want = "data:image/png;base64," + base64.b64encode(_PNG_1PX).decode()
    assert re.findall(r'<img src="([^"]*)"', page) == [want] * 3


def test_missing_or_non_image_file_is_an_error(tmp_path):
    with pytest.raises(TraceFormatError, match=r"nope\.png: expected an image file .* found no such file"):
        render_html("![x](nope.png)\n", base_dir=tmp_path, title="t")
    (tmp_path / "fake.png").write_text("not an image")
    with pytest.raises(TraceFormatError, match=r"fake\.png: expected a PNG, JPEG"):
        render_html("![x](fake.png)\n", base_dir=tmp_path, title="t")


def test_write_html_title_from_heading(tmp_path):
    md = tmp_path / "r.md"
    md.write_text("# My report\n\ntext\n")
    out = write_html(md, tmp_path / "r.html")
    assert out == tmp_path / "r.html"
    assert "<title>My report</title>" in out.read_text()


# ----------------------------------------------------------------------------- Chromium


class _DevTools:
    """Just enough of a websocket client for one DevTools session."""

    def __init__(self, url: str):
        u = urlsplit(url)
        self.sock = socket.create_connection((u.hostname, u.port), timeout=60)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            f"GET {u.path} HTTP/1.1\r\nHost: {u.netloc}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        head = b""
        while not head.endswith(b"\r\n\r\n"):  # byte by byte: never read past the handshake
            head += self._read(1)
        assert head.split(b"\r\n")[0].split()[1] == b"101", head
        self.next_id, self.events = 0, []

    def _read(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise EOFError("DevTools connection closed")
            buf += chunk
        return bytes(buf)

    def _send(self, obj) -> None:
        data = json.dumps(obj).encode()
        n = len(data)
        size = bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + n.to_bytes(2, "big")
        mask = os.urandom(4)  # client frames must be masked
        self.sock.sendall(b"\x81" + size + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def _recv(self) -> dict:
        msg = b""
        while True:
            b0, b1 = self._read(2)
            n = b1 & 0x7F
            if n >= 126:
                n = int.from_bytes(self._read(2 if n == 126 else 8), "big")
            data = self._read(n)
            if b0 & 0x0F == 0x8:
                raise EOFError("DevTools connection closed")
            msg += data
            if b0 & 0x80 and b0 & 0x0F in (0x0, 0x1):
                return json.loads(msg)

    def call(self, method: str, **params):
        self.next_id += 1
        self._send({"id": self.next_id, "method": method, "params": params})
        while True:
            m = self._recv()
            if m.get("id") == self.next_id:
                assert "error" not in m, m
                return m["result"]
            self.events.append(m)

    def wait_for(self, method: str, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(e.get("method") == method for e in self.events):
            assert time.monotonic() < deadline, f"no {method} within {timeout_s} s"
            self.events.append(self._recv())


def _console_errors(events: list[dict]) -> list[str]:
    out = []
    for e in events:
        m, p = e.get("method"), e.get("params", {})
        if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append(" ".join(str(a.get("value", a.get("description"))) for a in p.get("args", [])))
        elif m == "Runtime.exceptionThrown":
            out.append(p["exceptionDetails"].get("text", "exception"))
        elif m == "Log.entryAdded" and p["entry"]["level"] == "error":
            out.append(p["entry"]["text"])
    return out


@contextlib.contextmanager
def _chromium(workdir: Path):
    """A headless Chromium with its DevTools port open; yields the browser's HTTP endpoint.
    Called inside the test (not a fixture) so that a missing browser is a test failure."""
    exe = shutil.which("chromium") or (CHROMIUM if os.path.exists(CHROMIUM) else None)
    if exe is None:
        pytest.fail("chromium not found: install Debian's chromium package (apt-get install chromium)")
    profile = workdir / "chromium-profile"
    profile.mkdir()
    log = open(workdir / "chromium.log", "wb")  # noqa: SIM115 - closed in the finally below
    proc = subprocess.Popen(
        [exe, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run", "--hide-scrollbars",
         "--remote-debugging-port=0", f"--user-data-dir={profile}", "--window-size=1280,1000", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=log,
    )
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            assert proc.poll() is None, f"chromium exited with {proc.returncode}; see {log.name}"
            assert time.monotonic() < deadline, "chromium did not open its DevTools port"
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


_PROBE = """JSON.stringify({
  images: [...document.images].map(i => {
    const r = i.getBoundingClientRect();
    return {complete: i.complete, w: i.naturalWidth, h: i.naturalHeight,
            x: r.left + scrollX, y: r.top + scrollY, cw: r.width, ch: r.height};
  }),
  pre: [...document.querySelectorAll('pre')].map(p => {
    const s = getComputedStyle(p);
    return {ws: s.whiteSpace, font: s.fontFamily, ox: s.overflowX};
  }),
  tableWraps: [...document.querySelectorAll('.table-wrap')].map(t => getComputedStyle(t).overflowX),
  pageWidth: document.scrollingElement.scrollWidth, viewWidth: innerWidth,
  vizTop: document.getElementById('visualizations').getBoundingClientRect().top + scrollY,
  height: document.scrollingElement.scrollHeight
})"""


def test_page_in_headless_chromium(report, tmp_path):
    with _chromium(tmp_path) as endpoint:
        _check_page(report, endpoint)


def _check_page(report: Path, endpoint: str) -> None:
    import matplotlib.image as mpimg

    targets = json.load(urllib.request.urlopen(f"{endpoint}/json/list", timeout=30))
    page = next(t for t in targets if t["type"] == "page")
    dt = _DevTools(page["webSocketDebuggerUrl"])
    for domain in ("Runtime", "Log", "Page"):
        dt.call(f"{domain}.enable")
    # Narrower than the widest code block and table: they must scroll inside, not the page.
    dt.call("Emulation.setDeviceMetricsOverride", width=1000, height=1000, deviceScaleFactor=1, mobile=False)
    dt.call("Page.navigate", url=report.with_suffix(".html").resolve().as_uri())
    dt.wait_for("Page.loadEventFired")
    state = json.loads(dt.call("Runtime.evaluate", expression=_PROBE, returnByValue=True)["result"]["value"])

    assert _console_errors(dt.events) == []
    assert len(state["images"]) == len(_images_in_markdown(report.read_text())) > 0
    for img in state["images"]:
        assert img["complete"] and img["w"] > 0 and img["h"] > 0, img
    assert state["pre"] and all(p["ws"] == "pre" and "Mono" in p["font"] and p["ox"] == "auto"
                                for p in state["pre"])
    assert state["tableWraps"] and set(state["tableWraps"]) == {"auto"}
    assert state["pageWidth"] <= state["viewWidth"]

    # Screenshots: the whole page (capped at 16000 px, the usual texture limit) and the
    # Visualizations section down to the last plot; each plot's own area must not be blank.
    shots = report.parent / "screenshots"
    shots.mkdir(exist_ok=True)

    def shot(name: str, x: float, y: float, w: float, h: float) -> Path:
        png = base64.b64decode(dt.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                                       clip={"x": x, "y": y, "width": w, "height": h, "scale": 1})["data"])
        assert png.startswith(b"\x89PNG\r\n\x1a\n")
        (shots / name).write_bytes(png)
        return shots / name

    full = shot("page.png", 0, 0, 1000, min(state["height"], 16000))
    assert mpimg.imread(full).shape[:2] == (min(state["height"], 16000), 1000)
    last = state["images"][-1]
    shot("visualizations.png", 0, state["vizTop"], 1000, last["y"] + last["ch"] + 10 - state["vizTop"])
    for i, img in enumerate(state["images"]):
        pixels = mpimg.imread(shot(f"plot{i}.png", img["x"], img["y"], img["cw"], img["ch"]))
        # The clip is in CSS pixels, which need not be whole: allow one pixel of rounding.
        assert abs(pixels.shape[0] - img["ch"]) <= 1 and abs(pixels.shape[1] - img["cw"]) <= 1
        # A drawn plot has many colours; a broken or blank image has one or two.
        colours = {tuple(p) for p in (pixels[::4, ::4, :3] * 255).astype(int).reshape(-1, 3)}
        assert len(colours) > 20, (i, len(colours))
    dt.sock.close()
