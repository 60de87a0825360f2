"""Exports of analyzed traces to other tools' formats.

* :func:`tracestory.export.perfetto.export_perfetto`: a Chrome-trace JSON of the analyzed
  timeline for ui.perfetto.dev and chrome://tracing.
"""
