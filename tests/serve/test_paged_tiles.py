"""The chunk call's KV tiles (serve.paged_attention): groups of cache blocks on CUDA, the cache
sized to whole groups, and the tile lists built from block tables. Expected values worked out by
hand from the definitions (tile ``b // group`` holds block ``b``; 128 query rows per tile)."""

from tracestory.serve.paged_attention import cache_blocks, chunk_tiles, kv_group


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


def test_chunk_tiles_list_each_query_tiles_groups():
    a = (0, 3, [0, 5])                      # rows 0..2, blocks 0 and 5 -> groups 0, 1
    b = (3, 130, list(range(8, 17)))        # rows 3..132, blocks 8..16 -> groups 2, 3, 4
    kv_num, kv_idx = chunk_tiles([a, b], 16, 256, group=4)
    assert kv_num.tolist() == [5, 3]        # tile 0 (rows 0..127): a and b; tile 1: b only
    assert kv_idx.tolist() == [[0, 1, 2, 3, 4], [2, 3, 4, 2, 2]]     # padding repeats the first
    # group 1: the blocks themselves
    kv_num, kv_idx = chunk_tiles([a], 16, 128)
    assert kv_num.tolist() == [2] and kv_idx.tolist() == [[0, 5]]
