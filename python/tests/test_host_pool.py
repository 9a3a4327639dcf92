"""The host memory a Scaler on the CPU takes its rounded copies and gradients from (`_core.HostPool`,
python/csrc/host_pool.h): a block is taken again only when torch has let go of every tensor on it, a
training step takes its blocks again at the next step instead of new memory, and the pool gives back
what a step stopped needing."""
import torch
from torch import nn
from torch.utils.dlpack import from_dlpack

from gradscale import _core
from gradscale.torch import Scaler

FIXED = {"policy": "adaptive", "method": "fixed", "fixed_scale": 4, "init_scale": 8}


def pooled(pool, shape, strides):
    return from_dlpack(pool.tensor(shape, strides))


def test_a_block_is_taken_again_only_when_the_last_tensor_on_it_is_gone():
    pool = _core.HostPool()
    t = pooled(pool, [4, 3, 5, 5], [75, 1, 15, 3])  # channels_last strides
    assert t.dtype == torch.float32 and t.stride() == (75, 1, 15, 3)
    assert t.is_contiguous(memory_format=torch.channels_last)
    t.fill_(2.5)
    address = t.data_ptr()
    view = t.detach()[1:]  # shares the storage: the block stays out
    del t
    other = pooled(pool, [4, 3, 5, 5], [75, 1, 15, 3])
    assert other.data_ptr() != address
    other.fill_(-1.0)
    assert torch.all(view == 2.5)
    del view
    again = pooled(pool, [4, 3, 5, 5], [75, 1, 15, 3])
    assert again.data_ptr() == address
    assert pool.reused == 1 and pool.taken == 3


def test_a_capsule_torch_never_took_gives_its_block_back():
    pool = _core.HostPool()
    capsule = pool.tensor([10], [1])
    del capsule
    assert pool.free_bytes == pool.held_bytes > 0


def test_bad_shapes_are_refused():
    pool = _core.HostPool()
    for shape, strides in (([0], [1]), ([3], [-1]), ([2, 2], [1])):
        try:
            pool.tensor(shape, strides)
        except RuntimeError as e:
            assert "HostPool.tensor" in str(e)
        else:
            raise AssertionError(f"{shape}, {strides} accepted")


# Tensors of 128 x 128 floats and more are the pool's (HostPool.mapped_bytes: 64 KiB); smaller ones
# torch's own.
WIDTH = 128
assert WIDTH * WIDTH * 4 == _core.HostPool.mapped_bytes


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(WIDTH, WIDTH)
        self.fc2 = nn.Linear(WIDTH, WIDTH)
        self.fc3 = nn.Linear(WIDTH, 4)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def train_step(model, scaler, opt, x, y):
    opt.zero_grad()
    out = model(x)
    scaler.scale(nn.functional.cross_entropy(out, y)).backward()
    scaler.step(opt)
    scaler.update()
    return out


def test_rounded_outputs_and_gradients_the_user_keeps_are_never_written_again():
    """A layer output (rounded into a pool block) and an input gradient (the core's rounding of it, in
    another) kept by the user across later steps hold their own step's values."""
    model = Net()
    scaler = Scaler(model, scaler=FIXED, format="fp16")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    outputs = []
    model.fc2.register_forward_hook(lambda module, inputs, output: outputs.append(output.detach()))
    kept, copies = [], []
    for _ in range(4):
        x = torch.randn(WIDTH, WIDTH, generator=gen).requires_grad_()
        train_step(model, scaler, opt, x, torch.randint(0, 4, (WIDTH,), generator=gen))
        out = outputs.pop()
        kept.append((out, x.grad))
        copies.append((out.clone(), x.grad.clone()))
        del out, x
    for (out, grad), (out_copy, grad_copy) in zip(kept, copies):
        assert torch.equal(out, out_copy) and torch.equal(grad, grad_copy)
    assert not torch.equal(kept[0][0], kept[1][0])
    assert scaler._tracker.pool.reused > 0  # the steps did take blocks given back


def test_a_step_takes_the_last_steps_blocks_and_the_pool_shrinks_with_the_batch():
    model = Net()
    scaler = Scaler(model, scaler=FIXED, format="fp16")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    pool = scaler._tracker.pool
    big = (torch.randn(256, WIDTH), torch.randint(0, 4, (256,)))
    for _ in range(3):
        train_step(model, scaler, opt, *big)
    held, taken, reused = pool.held_bytes, pool.taken, pool.reused
    assert held >= 256 * WIDTH * 4 * 2  # at least two activations of fc2's size
    train_step(model, scaler, opt, *big)
    # A step like the last ones: every block it took was one given back, none new.
    assert pool.taken - taken == pool.reused - reused > 0
    assert pool.held_bytes == held
    small = (torch.randn(4, WIDTH), torch.randint(0, 4, (4,)))
    for _ in range(3):
        train_step(model, scaler, opt, *small)
    assert pool.held_bytes < held / 16  # the big batch's blocks went back to the system


def test_the_pool_gives_the_same_bits_as_new_memory():
    """The same training with every pooled tensor replaced by torch.empty_like's: the same weights."""
    def train(with_pool):
        model = Net()
        scaler = Scaler(model, scaler=FIXED, format="fp16")
        if not with_pool:
            scaler._tracker.pool = None
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(2)
        for _ in range(5):
            train_step(model, scaler, opt, torch.randn(WIDTH, WIDTH, generator=gen),
                       torch.randint(0, 4, (WIDTH,), generator=gen))
        return [p.detach().clone() for p in model.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(train(True), train(False)))


def test_an_evaluation_loop_over_changing_shapes_holds_only_what_its_last_batches_need():
    model = Net()
    pool = Scaler(model, scaler=FIXED, format="fp16")._tracker.pool
    with torch.no_grad():
        for n in range(WIDTH, 704, 8):  # a new batch size every call
            model(torch.randn(n, WIDTH))
    # Every shape but the last two calls' is gone: a call's pool tensors are the rounded input of each
    # layer and the outputs of fc1 and fc2, 5 blocks of at most 696 x 128 floats.
    assert 0 < pool.held_bytes <= 2 * 5 * 696 * WIDTH * 4


def test_tensors_on_the_pool_outlive_the_scaler():
    model = Net()
    scaler = Scaler(model, scaler=FIXED, format="fp16")
    pool = scaler._tracker.pool
    with torch.no_grad():
        out = model.fc2(torch.randn(WIDTH, WIDTH))  # fc2's output rounded: a pool block
    assert pool.held_bytes - pool.free_bytes == WIDTH * WIDTH * 4
    copy = out.clone()
    scaler.remove()
    del scaler, pool
    import gc
    gc.collect()
    assert torch.equal(out, copy)  # its block is the tensor's until torch frees it
    out.add_(1.0)
    del out
