"""Settings precedence: flag > TRACESTORY_<OPTION> > tracestory.toml > default, with sources."""

from __future__ import annotations

import pytest

from tracestory.capture import settings as S
from tracestory.errors import UsageError

TOML = """
[capture]
warmup_run = true
name = "from-file"
[capture.ncu]
launch-count = 7
set = "detailed"
[capture.torch]
count = 4
"""


@pytest.fixture
def cfg(tmp_path):
    p = tmp_path / "tracestory.toml"
    p.write_text(TOML)
    return p


def test_precedence_and_sources(cfg):
    env = {"TRACESTORY_LAUNCH_COUNT": "9", "TRACESTORY_KERNEL_NAME": "gemm", "TRACESTORY_SET": "basic"}
    st = S.resolve("ncu", {"set": "full"}, env=env, config=cfg)
    assert st["set"] == S.Setting("full", "flag")                               # flag beats env and file
    assert st["launch_count"] == S.Setting(9, "env TRACESTORY_LAUNCH_COUNT")     # env beats file, typed
    assert st["kernel_name"] == S.Setting("gemm", "env TRACESTORY_KERNEL_NAME")
    assert st["warmup_run"] == S.Setting(True, f"file {cfg}")                  # [capture] applies
    assert st["name"] == S.Setting("from-file", f"file {cfg}")
    assert st["clock_control"] == S.Setting("none", "default")
    assert "count" not in st                                                   # a torch-only option


def test_tool_table_wins_over_common_table(tmp_path):
    p = tmp_path / "t.toml"
    p.write_text('[capture]\nskip = 1\n[capture.torch]\nskip = 3\n')
    assert S.resolve("torch", {}, env={}, config=p)["skip"] == S.Setting(3, f"file {p}")
    assert S.resolve("ncu", {}, env={}, config=p)["skip"] == S.Setting(1, f"file {p}")


def test_default_config_is_read_from_current_folder(cfg, monkeypatch):
    monkeypatch.chdir(cfg.parent)
    st = S.resolve("torch", {}, env={})
    assert st["count"] == S.Setting(4, "file tracestory.toml")


def test_no_file_no_env_gives_defaults(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    st = S.resolve("nsys", {}, env={})
    assert {k: s.value for k, s in st.items() if k in ("trace", "sample", "cuda_memory_usage")} == \
        {"trace": "cuda,nvtx,osrt", "sample": "none", "cuda_memory_usage": True}
    assert all(s.source == "default" for s in st.values())


@pytest.mark.parametrize("var, raw, expected", [
    ("TRACESTORY_WARMUP_RUN", "yes", True), ("TRACESTORY_WARMUP_RUN", "0", False),
    ("TRACESTORY_SECTIONS", "SpeedOfLight, MemoryWorkloadAnalysis", ["SpeedOfLight", "MemoryWorkloadAnalysis"]),
])
def test_env_conversion(var, raw, expected, tmp_path):
    name = var[len("TRACESTORY_"):].lower()
    assert S.resolve("ncu", {}, env={var: raw}, config=_empty(tmp_path))[name].value == expected


def _empty(tmp_path):
    p = tmp_path / "empty.toml"
    p.write_text("")
    return p


def test_bad_values_name_their_source(tmp_path):
    with pytest.raises(UsageError, match="TRACESTORY_LAUNCH_COUNT.*int"):
        S.resolve("ncu", {}, env={"TRACESTORY_LAUNCH_COUNT": "many"}, config=_empty(tmp_path))
    p = tmp_path / "bad.toml"
    p.write_text("[capture.ncu]\nlaunch_count = true\n")
    with pytest.raises(UsageError, match="bad.toml.*launch_count"):
        S.resolve("ncu", {}, env={}, config=p)
    p.write_text("[capture]\nbogus = 1\n")
    with pytest.raises(UsageError, match="unknown key 'bogus'"):
        S.resolve("ncu", {}, env={}, config=p)
    with pytest.raises(UsageError, match="no such file"):
        S.resolve("ncu", {}, env={}, config=tmp_path / "missing.toml")


def test_validate_rejects_conflicts():
    with pytest.raises(UsageError, match="--skip/--count"):
        S.validate("torch", {"range": "B", "skip": 2, "count": 1, "active": 2})
    with pytest.raises(UsageError, match="needs --active"):
        S.validate("torch", {"wait": 1, "count": 1})
    with pytest.raises(UsageError, match="--skip needs --range"):
        S.validate("nsys", {"skip": 2})
    with pytest.raises(UsageError, match="--count"):
        S.validate("torch", {"count": 0})
