"""reduced_sizes: remainders kept, >= 2 grid steps, structure consistent, refusals."""
import os

import numpy as np

from maxkernel_worker.reduction import reduced_sizes
from maxkernel_worker.task import load_task_dir, open_task

TASKS = os.path.join(os.path.dirname(__file__), "tasks")


def task(name):
    return open_task(load_task_dir(os.path.join(TASKS, name), 1 << 30))


def test_config_reduction_keeps_group_sizes_consistent():
    t = task("jb_grouped")
    blocks = [((1024, 128), (128, 128)), ((4, 128, 256), (-1, 128, 256)), ((1024, 256), (128, 256))]
    sizes = reduced_sizes(t, 0, blocks)
    assert sizes[1024] == 256 and 128 not in sizes and 256 not in sizes
    args = t.make_args(0, 3, sizes)
    assert args[0].shape == (256, 128)
    assert int(np.asarray(args[2]).sum()) == 256          # groups still cover the tokens
    assert t.reference(0)(*args).shape == (256, 256)


def test_remainder_and_two_steps():
    t = task("jb_hardcoded")                               # shapes hard-coded: by value
    sizes = reduced_sizes(t, 0, [((2048, 256), (96, 256)), ((2048, 256), (96, 256))])
    r = sizes[2048]
    assert r % 96 == 2048 % 96 and r >= 2 * 96 and r < 2048
    args = t.make_args(0, 1, sizes)
    assert args[0].shape == (r, 256) and args[2] == 0.5
    assert t.reference(0)(*args).shape == (r, 256)
    other = t.make_args(0, 2, sizes)
    assert not np.array_equal(args[0], other[0])


def test_nothing_to_reduce():
    t = task("jb_matmul")                                  # already 2 steps of 128
    assert reduced_sizes(t, 0, [((256, 128), (128, 128)), ((256, 256), (128, 128))]) == {}


def test_full_last_dim_block_is_left_alone():
    t = task("mk_multi")
    # 256 is tiled by 64 on rows but is a full block on columns: it must stay
    assert reduced_sizes(t, 0, [((256, 256), (64, 256))]) == {}
    sizes = reduced_sizes(t, 0, [((256, 256), (32, 64))])
    assert sizes == {256: 128}
    args = t.make_args(0, 0, sizes)
    assert args[0].shape == (128, 128)
    normed, sums = t.reference(0)(*args)
    assert sums.shape == (128,)
