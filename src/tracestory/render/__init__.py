"""Results -> text and images. Every module here reads an
:class:`~tracestory.analysis.results.Results` (or a part of it) and computes nothing new.

* ``markdown.py``: the story report; ``SECTIONS`` registers one module of ``sections/`` per
  heading, in the report's order; ``build.py`` writes it with its JSON and PNG plots.
* ``jsonout.py``: the JSON document (``docs/JSON.md``); ``jsonable.py`` its value conversion.
* ``html.py``: the Markdown report as one self-contained HTML page.
* ``terminal.py``: the tables ``tracestory analyze`` prints.
* ``plots.py``, ``memory.py``, ``multigpu.py`` (PNG through ``mpl.py``), ``hardware.py``,
  ``story.py``, ``batch_story.py``, ``manifest_sections.py``: the parts the sections use.
* ``compare.py``: a comparison of two runs; ``category_table.py``: the kernel-category table.
* ``checklist.py``: ``tracestory check``, reading the same section registry.
* ``md.py``: Markdown helpers (tables, fences, evidence, short kernel names), a leaf.

Numbers become text only through :mod:`tracestory.units`.
"""
