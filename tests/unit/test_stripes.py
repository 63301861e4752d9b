"""Stripes: which index shards hold a self-feeding worker's own keys, and who helps with a key."""

from __future__ import annotations

import math

import pytest
from coworker.data.layout import shard_of, stripe_shards
from coworker.engine.feeder import helper_of

KEYS = [f"task-{i}" for i in range(3000)]


@pytest.mark.parametrize(("stripes", "shards"), [(1, 4), (2, 4), (3, 4), (4, 4), (6, 4), (12, 4), (5, 3), (7, 16)])
def test_every_key_of_a_stripe_lies_in_the_shards_named_for_it(stripes, shards):
    named = {stripe: stripe_shards(stripe, stripes, shards) for stripe in range(stripes)}
    for key in KEYS:
        assert shard_of(key, shards) in named[shard_of(key, stripes)]
    # ... and no more shards than its keys need: shards / gcd(stripes, shards) each
    assert {len(found) for found in named.values()} == {shards // math.gcd(stripes, shards)}


def test_where_the_shards_divide_the_stripes_a_worker_reads_one_shard():
    # 12 worker slots (the deployed defaults: 120 tasks at once, 10 a worker) over 4 shards
    assert [stripe_shards(stripe, 12, 4) for stripe in range(12)] == [[stripe % 4] for stripe in range(12)]


@pytest.mark.parametrize("stripes", [2, 3, 6, 12])
def test_a_key_is_helped_by_one_other_stripe_and_every_other_stripe_helps(stripes):
    helpers: dict[int, set[int]] = {owner: set() for owner in range(stripes)}
    for key in KEYS:
        owner, helper = shard_of(key, stripes), helper_of(key, stripes)
        assert helper != owner and 0 <= helper < stripes
        helpers[owner].add(helper)
    assert all(found == set(range(stripes)) - {owner} for owner, found in helpers.items())


def test_a_single_stripe_helps_itself():
    assert {helper_of(key, 1) for key in KEYS[:50]} == {0}
