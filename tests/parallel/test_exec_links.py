"""The ring collectives of the emulated links: the algorithm's results and its exact traffic."""

from __future__ import annotations

import pytest
import torch

from torchfl.planner.parallel.collectives import all_gather_sent, all_reduce_sent
from torchfl.runtime.parallel import Links


@pytest.mark.parametrize("p", [2, 3, 4])
def test_ring_all_reduce_sums_and_each_chip_sends_2_p_minus_1_over_p(p):
    torch.manual_seed(p)
    xs = [torch.randn(4, 6, dtype=torch.float64) for _ in range(p)]     # 24 elements: p divides them
    links = Links()
    out = links.all_reduce(list(range(p)), xs)
    want = sum(xs)
    assert all(torch.allclose(o, want, rtol=0, atol=1e-12) for o in out)
    assert all(torch.equal(o, out[0]) for o in out)                    # one sum, copied: every chip equal
    nbytes = 24 * 8
    assert set(links.bytes) == {(i, (i + 1) % p) for i in range(p)}    # ring neighbours only
    assert all(links.bytes[(i, (i + 1) % p)] == all_reduce_sent(nbytes, p) for i in range(p))
    assert links.by_kind["all_reduce"] == 2 * (p - 1) * nbytes


def test_uneven_chunks_still_sum_and_move_2_p_minus_1_tensors():
    xs = [torch.arange(7.0) * (i + 1) for i in range(3)]
    links = Links()
    out = links.all_reduce([5, 6, 7], xs)
    assert torch.equal(out[2], torch.arange(7.0) * 6)
    assert links.by_kind["all_reduce"] == 2 * 2 * 7 * 4
    assert set(links.bytes) == {(5, 6), (6, 7), (7, 5)}


def test_ring_all_gather_joins_the_blocks_in_order():
    blocks = [torch.full((2, 3), float(i)) for i in range(4)]
    links = Links()
    out = links.all_gather([0, 1, 2, 3], blocks)
    want = torch.cat(blocks, dim=-1)
    assert all(torch.equal(o, want) for o in out)
    assert all(n == all_gather_sent(want.numel() * 4, 4) for n in links.bytes.values())


def test_a_send_is_a_copy_and_one_chip_moves_nothing():
    links = Links()
    x = torch.ones(3)
    y = links.send(0, 1, x)
    y += 1
    assert torch.equal(x, torch.ones(3)) and links.bytes == {(0, 1): 12}
    solo = Links()
    assert solo.all_reduce([0], [x])[0] is x and solo.report()["total"] == 0 and not solo.calls


def test_all_to_all_delivers_each_block_and_counts_the_crossing_ones():
    blocks = [[torch.full((2,), float(10 * i + j)) for j in range(3)] for i in range(3)]
    links = Links()
    got = links.all_to_all([0, 1, 2], blocks)
    assert all(torch.equal(got[j][i], blocks[i][j]) for i in range(3) for j in range(3))
    assert links.bytes == {(i, j): 8 for i in range(3) for j in range(3) if i != j}
    assert links.by_kind["all_to_all"] == 6 * 8 and links.calls["all_to_all"] == 1
