"""A Boston-housing-sized regression (506 rows, 13 features), generated, and a timed fit.

The articles compare CPU and GPU on the Boston housing data (506 rows). That data set is no
longer shipped by scikit-learn (its ethics problems), so we generate one of the same shape:
13 standardised features and a target from a fixed nonlinear function plus noise.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from .devices import as_device, synchronize


def boston_like(n: int = 506, features: int = 13, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(X, y): float32 features (n, features) with mean 0 / std 1 and a target (n, 1)."""
    for name, v in (("n", n), ("features", features)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 2:
            raise ValueError(f"boston_like: {name} must be an int >= 2, got {v!r}")
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, features, generator=g)
    w = torch.randn(features, 1, generator=g)
    y = X @ w + 0.5 * torch.tanh(X[:, :1] * X[:, 1:2]) + 0.1 * torch.randn(n, 1, generator=g)
    return X, (y - y.mean()) / y.std()


def mlp(features: int = 13, hidden: int = 64) -> nn.Module:
    return nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, 1))


def fit(X: torch.Tensor, y: torch.Tensor, device: str | torch.device, *, steps: int = 100,
        hidden: int = 64, lr: float = 0.05, seed: int = 0) -> dict[str, float]:
    """Full-batch training for `steps` steps on `device`; returns seconds (after one warm-up
    step, device synchronised, copies of the data included once) and the final MSE."""
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"fit: steps must be an int >= 1, got {steps!r}")
    dev = as_device(device)  # a clear error for 'cuda' on a machine without one
    torch.manual_seed(seed)
    net = mlp(X.shape[1], hidden).to(dev)
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    loss_fn = nn.MSELoss()

    def step(Xd: torch.Tensor, yd: torch.Tensor) -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(Xd), yd)
        loss.backward()
        opt.step()
        return loss.detach()

    step(X.to(dev), y.to(dev))  # warm-up: kernels, allocator, CUDA context
    synchronize(dev)
    t0 = time.perf_counter()
    Xd, yd = X.to(dev), y.to(dev)
    for _ in range(steps):
        loss = step(Xd, yd)
    synchronize(dev)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "mse": float(loss.item()), "rows": X.shape[0]}
