"""Helpers shared by the tests of ordinary PyTorch training code around a Scaler
(test_training_*.py): a small MLP and a batch fixed by their seeds, parameter snapshots, and the fixed
per-layer scales under which every scaled gradient is exact."""
import torch
from torch import nn
import torch.nn.functional as F

# Every GEMM layer multiplies its upstream gradient by 4, S0 = 8 (as in test_branches).
FIXED = {"policy": "adaptive", "method": "fixed", "fixed_scale": 4, "init_scale": 8,
         "scale_upper_bound": 16, "accum_upper_bound": 2 ** 40}


def mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


def batch(n=32, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    return x, (x[:, :4].argmax(dim=1))


def params_of(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def same(a, b):
    return all(torch.equal(a[n], b[n]) for n in a)


def penalised_loss(net, scale, x, y):
    """Cross-entropy plus a gradient penalty: the squared norm of d(scale(loss))/dx, its graph kept
    (create_graph). `scale` is scaler.scale, or the identity for PyTorch's own reference."""
    xin = x.clone().requires_grad_()
    out = net(xin)
    grad, = torch.autograd.grad(scale(F.cross_entropy(out, y)), xin, create_graph=True)
    return F.cross_entropy(out, y) + grad.pow(2).sum()
