"""models.decode_attn, the host side of the paged split-KV decode kernels, read without a GPU:
the split count, the key tiles each split reads, the workspace and query-tile shapes, the
switch. The kernels themselves run in tests/gpu (test_decode_attn_gpu.py); under Triton's
interpreter they are checked by tools/decode_attn_interpret.py, outside CI (no Triton there)."""

import pytest
import torch

from tracestory.models import decode_attn as da
from tracestory.models.llama_config import LlamaConfig
from tracestory.models.switches import opted_in
from tracestory.serve.model import PagedLlama


@pytest.mark.parametrize("batch, kv_heads, sms, max_keys, expected", [
    (1, 8, 132, 8192, 32),     # ceil(264 / 8) = 33 programs wanted, capped at 32
    (1, 8, 132, 600, 10),      # 600 keys = 10 tiles of 64: no more splits than tiles
    (4, 8, 132, 8192, 9),      # ceil(264 / 32) = 9
    (16, 8, 132, 8192, 3),     # ceil(264 / 128) = 3
    (64, 8, 132, 8192, 1),     # more programs than 2 waves already: one split
    (1, 4, 132, 16, 1),        # one tile
])
def test_split_count_aims_at_two_waves_within_the_tiles(batch, kv_heads, sms, max_keys, expected):
    assert da.num_splits(batch, kv_heads, sms, max_keys) == expected


def test_split_count_rejects_empty_inputs():
    with pytest.raises(ValueError, match="num_splits"):
        da.num_splits(0, 8, 132, 600)


@pytest.mark.parametrize("pos, splits", [(0, 1), (0, 32), (14, 3), (63, 2), (64, 2), (599, 32), (3999, 32),
                                         (3999, 3), (8191, 7)])
def test_splits_cover_every_key_tile_once_and_empty_ones_come_last(pos, splits):
    ranges = da.split_ranges(pos, splits)
    tiles = pos // 64 + 1                     # keys 0..pos in tiles of 64
    read = [t for a, b in ranges for t in range(a, b)]
    assert read == list(range(tiles))
    used = [b > a for a, b in ranges]
    n_used = sum(used)
    assert used == [True] * n_used + [False] * (splits - n_used)
    # the combine kernel's count of splits holding keys: ceil(tiles / ceil(tiles / splits))
    per = -(-tiles // splits)
    assert n_used == -(-tiles // per)


def test_workspace_and_query_tile_shapes():
    assert da.workspace_shapes(2, 32, 5, 128) == {"max": (2, 32, 5), "sum": (2, 32, 5), "acc": (2, 32, 5, 128)}
    assert [da.query_rows(g) for g in (1, 4, 16, 17, 64)] == [16, 16, 16, 32, 64]


@pytest.mark.parametrize("value, on", [("0", False), ("off", False), ("1", True), ("", True)])
def test_the_switch_and_the_device_decide(monkeypatch, value, on):
    monkeypatch.setenv(da.ENV, value)
    assert da.wanted("bfloat16", on_cuda=True) is on
    assert da.wanted("float32", on_cuda=True) is on
    assert da.wanted("bfloat16", on_cuda=False) is False
    assert da.wanted("float64", on_cuda=True) is False


@pytest.mark.parametrize("value, on", [(None, False), ("", False), ("0", False), ("off", False), ("1", True),
                                       ("yes", True)])
def test_the_opt_in_variants_are_off_unless_set(monkeypatch, value, on):
    for name in (da.FUSED_ENV, da.QUANT_ENV):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
        assert opted_in(name) is on


def test_a_cpu_model_keeps_flex_in_its_decode_graph_bodies(monkeypatch):
    monkeypatch.setenv(da.ENV, "1")
    m = PagedLlama(LlamaConfig.from_name("tiny"), layers=1, num_blocks=8, block_size=4, vocab=64,
                   dtype=torch.float32, attention="flex")
    info = m.prepare(max_num_seqs=2, max_batch_tokens=16)
    assert m._pick_decode_attn() is None and m._decode_attn is None
    assert "decode_attn" not in info           # recorded where the decode graphs are built (CUDA)
