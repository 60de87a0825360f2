"""The chunk call's KV tiles (serve.paged_attention): groups of cache blocks on CUDA, the cache
sized to whole groups, and the tile lists built from block tables. Expected values worked out by
hand from the definitions (tile ``b // group`` holds block ``b``; 128 query rows per tile), and
the lists checked against the mask itself evaluated densely (numpy, the mask's formula)."""

import numpy as np

from tracestory.serve.paged_attention import Q_TILE, cache_blocks, chunk_tiles, kv_group


def test_kv_group_is_64_keys_of_blocks_when_compiled():
    assert kv_group(16, compiled=True) == 4
    assert kv_group(32, compiled=True) == 2
    assert kv_group(16, compiled=False) == 1      # eager (CPU): one block per tile, as before
    assert kv_group(64, compiled=True) == 1
    assert kv_group(48, compiled=True) == 1       # does not divide 64


def test_cache_holds_whole_groups_after_the_scratch_block():
    assert cache_blocks(10, 16, compiled=True) == 12     # 10 + scratch = 11 -> 3 groups of 4
    assert cache_blocks(11, 16, compiled=True) == 12     # 12 exactly
    assert cache_blocks(10, 16, compiled=False) == 11


def test_whole_tables_without_causal_trim_or_full_tiles_as_before():
    a = (0, 3, 0, [0, 5])                    # rows 0..2, blocks 0 and 5 -> groups 0, 1
    b = (3, 130, 0, list(range(8, 17)))      # rows 3..132, blocks 8..16 -> groups 2, 3, 4
    ct = chunk_tiles([a, b], 16, 256, group=4, causal=False, full=False)
    assert ct.kv_num.tolist() == [5, 3]      # tile 0 (rows 0..127): a and b; tile 1: b only
    assert ct.kv_idx.tolist() == [[0, 1, 2, 3, 4], [2, 3, 4, 2, 2]]     # padding repeats the first
    assert ct.full_num.tolist() == [0, 0]
    ct = chunk_tiles([a], 16, 128, causal=False, full=False)
    assert ct.kv_num.tolist() == [2] and ct.kv_idx.tolist() == [[0, 5]]


def test_causal_trim_and_full_tiles_by_hand():
    # a: rows 0..2 at positions 0..2 -> only its logical block 0 (physical 0, group 0) is seen;
    # b: rows 3..132 at positions 0..129; tile 0 holds b's positions 0..124 -> logical blocks
    # 0..7 = physical 8..15 = groups 2, 3; tile 1 holds positions 125..129 -> logical 0..8 =
    # physical 8..16 = groups 2, 3, 4. Tile 0 holds two members: nothing full. Tile 1 holds b
    # alone from p_lo = 125: blocks wholly <= 125 are logical 0..6 (ends 15..111; logical 7 ends
    # at 127 > 125) = physical 8..14: group 2 (8..11) has all 4, group 3 (12..15) only 3.
    a = (0, 3, 0, [0, 5])
    b = (3, 130, 0, list(range(8, 17)))
    ct = chunk_tiles([a, b], 16, 256, group=4)
    assert ct.kv_num.tolist() == [3, 2]
    assert ct.kv_idx.tolist() == [[0, 2, 3], [3, 4, 3]]
    assert ct.full_num.tolist() == [0, 1]
    assert ct.full_idx.tolist() == [[0], [2]]
    # a later chunk of one prompt: positions 512..767 (rows 0..255), blocks 100..147 -> groups
    # 25..36. Tile 0: p_lo 512, p_hi 639 -> seen logical 0..39 = groups 25..34; wholly <= 512:
    # logical 0..31 (ends at 511) = groups 25..32 full; masked 33, 34.
    c = (0, 256, 512, list(range(100, 148)))
    ct = chunk_tiles([c], 16, 256, group=4)
    assert ct.full_idx[0, :ct.full_num[0]].tolist() == list(range(25, 33))
    assert ct.kv_idx[0, :ct.kv_num[0]].tolist() == [33, 34]
    # tile 1: p_lo 640 (logical 0..39 wholly before: groups 25..34), p_hi 767 (logical 0..47)
    assert ct.full_idx[1, :ct.full_num[1]].tolist() == list(range(25, 35))
    assert ct.kv_idx[1, :ct.kv_num[1]].tolist() == [35, 36]


def _dense(spans, bs, rows, nblocks):
    """The chunk mask of every (row, physical slot), from its formula: the slot's block belongs
    to the row's member and its position is at or before the row's."""
    owner = np.full(nblocks, -1)
    logical = np.zeros(nblocks, dtype=np.int64)
    row_owner = np.full(rows, -2)
    row_pos = np.zeros(rows, dtype=np.int64)
    for i, (off, n, start, table) in enumerate(spans):
        owner[table] = i
        logical[table] = np.arange(len(table))
        row_owner[off:off + n] = i
        row_pos[off:off + n] = np.arange(start, start + n)
    s = np.arange(nblocks * bs)
    blk = s // bs
    return (owner[blk][None, :] == row_owner[:, None]) & (logical[blk][None, :] * bs + s % bs <= row_pos[:, None])


def test_tiles_cover_the_mask_and_full_tiles_are_all_true():
    rng = np.random.default_rng(7)
    bs, group = 16, 4
    for _ in range(30):
        nblocks = 256
        free = list(rng.permutation(nblocks - 1))      # the last block stays nobody's
        spans, off = [], 0
        for _ in range(int(rng.integers(1, 5))):
            start = int(rng.integers(0, 300))
            n = int(rng.integers(1, 400))
            if (start + n) // bs + 1 > len(free):
                break
            # mostly consecutive blocks (whole groups), sometimes scattered
            k = -(-(start + n) // bs)
            if rng.random() < 0.7:
                first = free.pop(0) // group * group
                table = [b % (nblocks - 1) for b in range(first, first + k)]
                free = [b for b in free if b not in table]
                if len(set(table)) < k or any(b in sum((list(t) for *_, t in spans), []) for b in table):
                    continue
            else:
                table = [free.pop(0) for _ in range(k)]
            spans.append((off, n, start, table))
            off += n
        if not spans:
            continue
        rows = -(-off // Q_TILE) * Q_TILE
        mask = _dense(spans, bs, rows, nblocks)
        ct = chunk_tiles(spans, bs, rows, group)
        tile_keys = bs * group
        for t in range(rows // Q_TILE):
            listed = set(ct.kv_idx[t, :ct.kv_num[t]].tolist())
            full = set(ct.full_idx[t, :ct.full_num[t]].tolist())
            assert not listed & full
            q = mask[t * Q_TILE:(t + 1) * Q_TILE]
            real = np.arange(t * Q_TILE, (t + 1) * Q_TILE) < off          # padding rows: discarded
            needed = set(np.nonzero(q.reshape(Q_TILE, -1, tile_keys).any(axis=(0, 2)))[0].tolist())
            assert needed <= listed | full                                  # no key the mask keeps is lost
            for g in full:
                assert q[real][:, g * tile_keys:(g + 1) * tile_keys].all()  # mask true on the whole tile
