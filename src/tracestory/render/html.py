"""The Markdown report as one self-contained HTML page.

Model
-----
The report's Markdown is parsed with ``markdown-it-py`` (CommonMark plus GitHub tables and
strikethrough; raw HTML in the Markdown is escaped, not passed through). The token stream is
then adjusted before rendering:

* every heading gets an ``id`` (a slug of its text, made unique with ``-2``, ``-3`` ...), and
  the ``##`` headings become the table of contents placed after the ``#`` title;
* every image whose source is a local file (relative to ``base_dir``, absolute, or ``file:``)
  is read and inlined as a ``data:image/...;base64`` URI (type from the file's magic bytes:
  PNG, JPEG, GIF, WebP, SVG);
* a fenced block whose info string names a PNG (```` ```text png=NAME ````: an ASCII chart and
  its PNG twin) is left out when that image is in the page, so the page shows each chart once
  (the PNG; the Markdown keeps both);
* an image with a remote source (``http:``, ``https:`` ...) is not fetched: it is rendered as
  a link carrying its alt text, so opening the page never touches the network;
* tables are wrapped in a horizontally scrolling box, so a wide table scrolls instead of
  widening the page; code blocks are monospace, never wrapped, and scroll the same way.

The page carries a Content-Security-Policy (``default-src 'none'``; images only from ``data:``;
inline styles only), so a reference that slipped through could not load anything either. It
holds no JavaScript, except the interactive timeline (:mod:`.timeline_page`) when the page is
written from results: then the one inline script is allowed by its hash.

Limits: only what CommonMark and GFM tables cover renders (no footnotes, no math). A local
image that does not exist is an error, not a broken picture.
"""

from __future__ import annotations

import base64
import html as _html
import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

from .. import outputs
from ..analysis.results import Results
from ..errors import TraceFormatError
from .timeline_data import build_timeline
from .timeline_page import TimelineSection, timeline_section

# (magic prefix, MIME type). WebP is RIFF....WEBP; SVG is text and checked separately.
_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)

_CSS = """
:root { color-scheme: light; }
* { box-sizing: border-box; }
body { margin: 0; background: #fff; color: #1c2230;
  font: 15px/1.55 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", "Liberation Sans", sans-serif; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 32px 64px; }
h1 { font-size: 1.75em; border-bottom: 2px solid #d9e0eb; padding-bottom: .3em; }
h2 { font-size: 1.35em; margin-top: 2.2em; border-bottom: 1px solid #e3e8f0; padding-bottom: .2em; }
h3 { font-size: 1.1em; margin-top: 1.6em; }
a { color: #0b5cad; }
code, pre { font-family: "DejaVu Sans Mono", Menlo, Consolas, "Liberation Mono", monospace; }
code { font-size: .9em; background: #f1f3f7; border-radius: 3px; padding: 0 .25em; }
pre { background: #f7f8fa; border: 1px solid #e1e6ee; border-radius: 6px; padding: 10px 12px;
  overflow-x: auto; white-space: pre; line-height: 1.2; font-size: 12.5px; }
pre code { background: none; padding: 0; font-size: inherit; white-space: pre; }
.table-wrap { overflow-x: auto; margin: 1em 0; }
table { border-collapse: collapse; font-size: 14px; }
th, td { border: 1px solid #d8dee8; padding: 4px 9px; vertical-align: top; }
th { background: #f2f5f9; text-align: left; }
tbody tr:nth-child(even) { background: #fafbfd; }
td code, th code { white-space: nowrap; }
img { display: block; max-width: 100%; height: auto; margin: 14px 0; border: 1px solid #e1e6ee; }
blockquote { margin: 1em 0; padding: .2em 1em; border-left: 4px solid #d9e0eb; color: #45506a; }
nav.toc { background: #f6f8fb; border: 1px solid #e1e6ee; border-radius: 6px; padding: .4em 1.4em;
  margin: 1.2em 0 1.6em; }
nav.toc h2 { font-size: 1em; margin: .6em 0 .3em; border: 0; padding: 0; }
nav.toc ol { margin: .2em 0 .6em; padding-left: 1.4em; }
.missing-image { color: #8a5a00; }
"""

_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"


def _markdown_parser():
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})
    md.enable(["table", "strikethrough"])

    def table_open(self, tokens, idx, options, env):
        return '<div class="table-wrap">' + self.renderToken(tokens, idx, options, env)

    def table_close(self, tokens, idx, options, env):
        return self.renderToken(tokens, idx, options, env) + "</div>\n"

    def image(self, tokens, idx, options, env):
        tok = tokens[idx]
        src = tok.attrGet("src") or ""
        if src.startswith("data:"):
            return self.image(tokens, idx, options, env)
        # Not embeddable (remote): a link, so nothing is fetched when the page opens.
        alt = self.renderInlineAsText(tok.children or [], options, env) or src
        return f'<a class="missing-image" href="{_html.escape(src)}">[image not embedded: {_html.escape(alt)}]</a>'

    md.add_render_rule("table_open", table_open)
    md.add_render_rule("table_close", table_close)
    md.add_render_rule("image", image)
    return md


def _slug(text: str, used: dict[str, int]) -> str:
    base = re.sub(r"[^\w]+", "-", text.lower(), flags=re.UNICODE).strip("-_") or "section"
    n = used.get(base, 0) + 1
    used[base] = n
    return base if n == 1 else f"{base}-{n}"


def _plain(children) -> str:
    """Text of an inline token's children (text and code spans), for slugs."""
    return "".join(c.content for c in children or [] if c.type in ("text", "code_inline"))


def _image_mime(path: Path, data: bytes) -> str:
    for magic, mime in _MAGIC:
        if data.startswith(magic):
            return mime
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    head = data[:512].lstrip().lower()
    if head.startswith(b"<svg") or (head.startswith(b"<?xml") and b"<svg" in head):
        return "image/svg+xml"
    raise TraceFormatError(
        path, "a PNG, JPEG, GIF, WebP or SVG image referenced by the report", f"a file starting with {data[:8]!r}"
    )


def _local_image(src: str, base_dir: Path) -> Path | None:
    """The local file an image source names, or None for a remote (or data:) source."""
    parts = urlsplit(src)
    if parts.scheme == "file":
        return Path(unquote(parts.path))
    # One-letter "schemes" are Windows drive letters, not URLs.
    if parts.scheme and len(parts.scheme) > 1:
        return None
    path = Path(unquote(parts.path if not parts.scheme else src))
    return path if path.is_absolute() else base_dir / path


def _data_uri(path: Path) -> str:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TraceFormatError(path, "an image file the report references", "no such file") from None
    except OSError as e:
        raise TraceFormatError(path, "a readable image file the report references", str(e)) from None
    mime = _image_mime(path, data)
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def _twin_of(info: str) -> str | None:
    """The PNG a fence's info string names (``text png=report_timeline.png``), or None."""
    word = next((w for w in info.split()[1:] if w.startswith("png=")), None)
    return word[4:] if word else None


def render_html(markdown_text: str, *, base_dir: Path, title: str, timeline: TimelineSection | None = None) -> str:
    """One self-contained HTML page of ``markdown_text``: local images (relative paths resolve
    against ``base_dir``) embedded as data URIs, a table of contents from the ``##`` headings,
    inline CSS, no network references; no JavaScript but the ``timeline`` section when given
    (placed after the first section, the Executive Summary, and listed in the contents). See the module docstring."""
    md = _markdown_parser()
    env: dict = {}
    tokens = md.parse(markdown_text, env)
    # Each chart once: a fenced ASCII chart whose info names its PNG twin (``text png=NAME``) is
    # left out when that image is in the page (the Markdown keeps both).
    images = {c.attrGet("src") for t in tokens if t.type == "inline" for c in t.children or [] if c.type == "image"}
    tokens = [t for t in tokens if not (t.type == "fence" and _twin_of(t.info) in images)]
    base_dir = Path(base_dir)

    used: dict[str, int] = {}
    toc: list[tuple[str, str]] = []  # (id, inner HTML) of each ## heading
    for i, tok in enumerate(tokens):
        if tok.type == "heading_open":
            inline = tokens[i + 1]
            hid = _slug(_plain(inline.children), used)
            tok.attrSet("id", hid)
            if tok.tag == "h2":
                toc.append((hid, md.renderer.renderInline(inline.children or [], md.options, env)))
        elif tok.type == "inline":
            for child in tok.children or []:
                if child.type != "image":
                    continue
                local = _local_image(child.attrGet("src") or "", base_dir)
                if local is not None:
                    child.attrSet("src", _data_uri(local))

    # The title heading (a leading "# ...") stays first; the contents follow it.
    head_end = 3 if len(tokens) >= 3 and tokens[0].type == "heading_open" and tokens[0].tag == "h1" else 0
    top = md.renderer.render(tokens[:head_end], md.options, env) if head_end else ""
    # The interactive timeline follows the first section (the Executive Summary), before the details.
    h2 = [i for i, t in enumerate(tokens) if i >= head_end and t.type == "heading_open" and t.tag == "h2"]
    split = h2[1] if timeline and len(h2) > 1 else len(tokens)
    body = md.renderer.render(tokens[head_end:split], md.options, env)
    rest = md.renderer.render(tokens[split:], md.options, env) if split < len(tokens) else ""
    if timeline:
        toc.insert(1 if split < len(tokens) else len(toc), ("interactive-timeline", "Interactive timeline"))
    nav = ""
    if toc:
        items = "\n".join(f'<li><a href="#{hid}">{inner}</a></li>' for hid, inner in toc)
        nav = f'<nav class="toc">\n<h2 id="contents">Contents</h2>\n<ol>\n{items}\n</ol>\n</nav>\n'

    csp = f"{_CSP}; {timeline.csp_script}" if timeline else _CSP
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n'
        '<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        '<meta name="generator" content="tracestory">\n'
        f"<title>{_html.escape(title)}</title>\n"
        f"<style>{_CSS}</style>\n"
        "</head>\n<body>\n<main>\n"
        f"{top}{nav}{body}{timeline.html if timeline else ''}{rest}"
        "</main>\n</body>\n</html>\n"
    )


def _title_of(markdown_text: str, fallback: str) -> str:
    m = re.search(r"^# +(.+?)\s*#*\s*$", markdown_text, flags=re.MULTILINE)
    return m.group(1).strip() if m else fallback


def write_html(markdown_path: Path, html_path: Path, results: Results | None = None) -> Path:
    """Render the Markdown report at ``markdown_path`` (images relative to its folder) into
    ``html_path``; the page title is the report's ``#`` heading. With the report's ``results``,
    the page also holds the interactive timeline (:mod:`.timeline_data`). Returns ``html_path``."""
    markdown_path, html_path = Path(markdown_path), Path(html_path)
    try:
        text = markdown_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TraceFormatError(markdown_path, "a Markdown report", "no such file") from None
    except UnicodeDecodeError as e:
        raise TraceFormatError(markdown_path, "UTF-8 Markdown text", f"undecodable bytes ({e.reason})") from None
    model = build_timeline(results) if results is not None else None
    timeline = timeline_section(model) if model is not None else None
    page = render_html(
        text, base_dir=markdown_path.parent, title=_title_of(text, markdown_path.stem), timeline=timeline
    )
    outputs.write_text(html_path, page)
    return html_path
