"""Reading a capture folder is an input format: it lives in :mod:`tracestory.ingest.capture_folder`
(re-exported here for the capture code and its tests)."""

from ..ingest.capture_folder import (  # noqa: F401
    LOAD_SUMMARY,
    MANIFEST,
    TOOL_FOLDERS,
    ArtifactFolder,
    load_artifact_folder,
)
