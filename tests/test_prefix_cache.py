"""PrefixCache on hand-made KV tensors: longest match, the last-token rule, LRU by bytes."""

from __future__ import annotations

import torch

from serve_app.engine.prefix_cache import PrefixCache, kv_nbytes
from serve_app.engine.protocol import SHARED_CACHE
from serve_app.sequences import common_prefix_len

SALT = "account-1"

LAYERS, HEADS, DIM = 2, 2, 4


def make_kv(token_ids: list[int]) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
    """KV whose position ``i`` holds the value ``token_ids[i]``, so crops are checkable."""
    pos = torch.tensor(token_ids, dtype=torch.float32).view(1, 1, -1, 1)
    keys = pos.expand(1, HEADS, len(token_ids), DIM).clone()
    return tuple((keys.clone(), -keys.clone()) for _ in range(LAYERS))


def test_common_prefix_len() -> None:
    assert common_prefix_len([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix_len([1, 2, 3], [1, 2, 3, 4]) == 3
    assert common_prefix_len([], [1]) == 0
    assert common_prefix_len([5], [1]) == 0


def test_miss_on_empty_cache() -> None:
    cache = PrefixCache(1 << 20)
    assert cache.lookup([1, 2, 3], SALT) == (0, None)
    assert (cache.queries, cache.hits) == (1, 0)


def test_longest_common_prefix_is_returned_cropped() -> None:
    cache = PrefixCache(1 << 20)
    cache.insert([1, 2, 3, 4, 5], make_kv([1, 2, 3, 4, 5]), SALT)
    cache.insert([1, 2, 9, 9], make_kv([1, 2, 9, 9]), SALT)
    n, kv = cache.lookup([1, 2, 3, 4, 7, 8], SALT)
    assert n == 4
    assert len(kv) == LAYERS
    assert kv[0][0].shape == (1, HEADS, 4, DIM)
    assert kv[1][0][0, 0, :, 0].tolist() == [1, 2, 3, 4]
    assert kv[1][1][0, 0, :, 0].tolist() == [-1, -2, -3, -4]
    assert (cache.hits, cache.hit_tokens) == (1, 4)


def test_a_shared_head_is_looked_up_with_the_account_and_counted_once() -> None:
    """A prompt whose first tokens are a head kept in another partition (the decisions
    prompt's public head): the longer of the two hits wins, the head's whole length included,
    and the lookup is one query and at most one hit in the stats."""
    cache = PrefixCache(1 << 20)
    cache.insert([1, 2, 3], make_kv([1, 2, 3]), "public")
    prompt = [1, 2, 3, 7, 8]
    n, kv = cache.lookup(prompt, SALT, shared=(3, "public"))
    assert n == 3 and kv[0][0][0, 0, :, 0].tolist() == [1, 2, 3]
    assert (cache.queries, cache.hits, cache.hit_tokens) == (1, 1, 3)
    cache.insert([1, 2, 3, 7], make_kv([1, 2, 3, 7]), SALT)  # the account's own, longer
    assert cache.lookup(prompt, SALT, shared=(3, "public"))[0] == 4
    assert cache.lookup([5, 6, 7], SALT, shared=(2, "public")) == (0, None)
    assert (cache.queries, cache.hits, cache.hit_tokens) == (3, 2, 7)


def test_leaves_the_last_prompt_token_uncomputed() -> None:
    cache = PrefixCache(1 << 20)
    cache.insert([1, 2, 3, 4], make_kv([1, 2, 3, 4]), SALT)
    n, kv = cache.lookup([1, 2, 3, 4], SALT)
    assert n == 3
    assert kv[0][0].shape[-2] == 3
    n, _ = cache.lookup([1, 2], SALT)
    assert n == 1


def test_min_match_tokens() -> None:
    cache = PrefixCache(1 << 20, min_match_tokens=3)
    cache.insert([1, 2, 3, 4], make_kv([1, 2, 3, 4]), SALT)
    assert cache.lookup([1, 2, 8, 8], SALT)[0] == 0
    assert cache.lookup([1, 2, 3, 8], SALT)[0] == 3


def test_insert_supersedes_prefixes_and_skips_covered() -> None:
    cache = PrefixCache(1 << 20)
    assert cache.insert([1, 2, 3], make_kv([1, 2, 3]), SALT)
    assert cache.insert([1, 2, 3, 4], make_kv([1, 2, 3, 4]), SALT)  # replaces [1, 2, 3]
    assert len(cache) == 1
    assert not cache.insert([1, 2], make_kv([1, 2]), SALT)  # already covered
    assert len(cache) == 1
    assert cache.bytes_used == kv_nbytes(make_kv([1, 2, 3, 4]))


def test_lru_eviction_by_bytes() -> None:
    entry = kv_nbytes(make_kv([0] * 10))
    cache = PrefixCache(entry * 2)
    a, b, c = ([k] * 10 for k in (1, 2, 3))
    cache.insert(a, make_kv(a), SALT)
    cache.insert(b, make_kv(b), SALT)
    assert cache.lookup(a + [0], SALT)[0] == 10  # touch a: b is now least recently used
    cache.insert(c, make_kv(c), SALT)
    assert len(cache) == 2
    assert cache.bytes_used <= cache.max_bytes
    assert cache.lookup(b + [0], SALT)[0] == 0
    assert cache.lookup(a + [0], SALT)[0] == 10
    assert cache.lookup(c + [0], SALT)[0] == 10


def test_logits_added_to_a_stored_prompt_stay_within_the_limit() -> None:
    """The same prompt stored again with its last logits grows its entry: older entries
    make room at once, not at the next insert."""
    entry = kv_nbytes(make_kv([0] * 10))
    logits = torch.zeros(entry // 8)  # float32: half an entry's bytes
    cache = PrefixCache(entry * 2 + entry // 8)
    a, b = [1] * 10, [2] * 10
    cache.insert(a, make_kv(a), SALT)
    cache.insert(b, make_kv(b), SALT)
    assert cache.bytes_used <= cache.max_bytes
    cache.insert(b, make_kv(b), SALT, logits=logits)
    assert cache.bytes_used <= cache.max_bytes
    assert cache.lookup(a + [0], SALT)[0] == 0  # the least recently used made room
    assert cache.whole(b, SALT) is not None


def test_too_large_entry_and_disabled_cache() -> None:
    cache = PrefixCache(16)
    assert not cache.insert([1, 2, 3], make_kv([1, 2, 3]), SALT)
    off = PrefixCache(0)
    assert not off.insert([1, 2, 3], make_kv([1, 2, 3]), SALT)
    assert off.lookup([1, 2, 3, 4], SALT) == (0, None)
    assert off.queries == 0


def test_stored_tensors_are_not_views_of_the_callers() -> None:
    """A stored entry must not pin a caller's larger buffer (byte accounting stays honest)."""
    big = make_kv(list(range(1, 9)))
    cropped = tuple((k[..., :5, :], v[..., :5, :]) for k, v in big)
    cache = PrefixCache(1 << 20)
    cache.insert([1, 2, 3, 4, 5], cropped, SALT)
    assert cache.bytes_used == kv_nbytes(make_kv([1, 2, 3, 4, 5]))
    _, kv = cache.lookup([1, 2, 3, 4, 5, 6], SALT)
    assert kv[0][0].untyped_storage().data_ptr() != big[0][0].untyped_storage().data_ptr()


def test_entries_of_one_salt_are_invisible_to_another() -> None:
    """The cross-account oracle: a prompt cached under one account's salt is no hit for
    another account, however long the common prefix; the shared cache (``SHARED_CACHE``) is a
    partition of its own."""
    cache = PrefixCache(1 << 20)
    secret = [1, 2, 3, 4, 5, 6]
    cache.insert(secret, make_kv(secret), salt="a")
    assert cache.lookup([*secret, 7], salt="b") == (0, None)
    assert cache.lookup([*secret, 7], SHARED_CACHE) == (0, None)
    assert cache.lookup([*secret, 7], salt="a")[0] == len(secret)
    cache.insert(secret, make_kv(secret), salt="b")  # same tokens, other account: own entry
    assert len(cache) == 2
