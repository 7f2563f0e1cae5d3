"""The cosine-embedding loss of claim L20, written twice: a Python loop over elements, and vectorised.

The loss (Payer et al., "Segmenting and tracking cell instances with cosine embeddings and
recurrent hourglass networks", 2018, the one the article's author implemented): every pixel has
an embedding vector; pixels of one instance should point the same way as their instance's mean
(pull term, 1 - cos), and the means of different instances should be orthogonal (push term,
cos^2). Per image, averaged over the instances present::

    L = mean_i [ mean_{p in S_i} (1 - cos(e_p, mu_i)) + mean_{j != i} cos(mu_i, mu_j)^2 ]

(The paper pushes only against neighbouring instances; here every other instance counts.)

`loss_loop` is written the way the article warns against: Python control flow and single
elements read with `.item()`, one small operation per pixel. `loss_vectorised` computes the
same thing with one-hot masks and batched matrix products. Both give the same value and the
same gradient (tests/test_cosine_loss.py); only the number of operations differs.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F


def _check(emb: torch.Tensor, labels: torch.Tensor) -> None:
    if emb.dim() != 4:
        raise ValueError(f"emb must be (batch, dim, height, width), got shape {tuple(emb.shape)}")
    if labels.dim() != 3 or labels.shape != (emb.shape[0], *emb.shape[2:]):
        raise ValueError(f"labels must be (batch, height, width) = {(emb.shape[0], *emb.shape[2:])}, "
                         f"got {tuple(labels.shape)}")
    if labels.dtype not in (torch.int64, torch.int32, torch.uint8):
        raise ValueError(f"labels must be an integer tensor of instance ids, got {labels.dtype}")
    if labels.numel() and int(labels.min()) < 0:
        raise ValueError("labels must be instance ids >= 0")


def _unit(v: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    return v / v.norm(dim=0).clamp_min(eps)


def loss_loop(emb: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The slow way: a Python loop over images, instances and pixels."""
    _check(emb, labels)
    B, D, H, W = emb.shape
    per_image = []
    for b in range(B):
        ids = sorted(set(labels[b].flatten().tolist()))
        means, members = {}, {}
        for k in ids:
            acc, pix = torch.zeros(D, dtype=emb.dtype, device=emb.device), []
            for i in range(H):
                for j in range(W):
                    if labels[b, i, j].item() == k:  # one element at a time, as warned
                        acc = acc + emb[b, :, i, j]
                        pix.append((i, j))
            means[k], members[k] = acc / len(pix), pix
        terms = []
        for k in ids:
            mu = _unit(means[k])
            pull = sum(1 - torch.dot(_unit(emb[b, :, i, j]), mu) for i, j in members[k]) / len(members[k])
            others = [torch.dot(mu, _unit(means[m])) ** 2 for m in ids if m != k]
            push = sum(others) / len(others) if others else torch.zeros((), dtype=emb.dtype, device=emb.device)
            terms.append(pull + push)
        per_image.append(sum(terms) / len(terms))
    return sum(per_image) / B


def loss_vectorised(emb: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The same loss with a handful of batched tensor operations (no Python loop, no sync)."""
    _check(emb, labels)
    B, D = emb.shape[:2]
    K = int(labels.max()) + 1
    onehot = F.one_hot(labels.reshape(B, -1).long(), K).to(emb.dtype)      # (B, N, K)
    e = emb.reshape(B, D, -1)                                                # (B, D, N)
    counts = onehot.sum(1)                                                   # (B, K)
    present = counts > 0
    mu = (e @ onehot) / counts.clamp_min(1)[:, None, :]                      # (B, D, K)
    e_n = e / e.norm(dim=1, keepdim=True).clamp_min(1e-12)
    mu_n = mu / mu.norm(dim=1, keepdim=True).clamp_min(1e-12)
    cos_pixel = torch.einsum("bdn,bdk->bnk", e_n, mu_n)                      # (B, N, K)
    pull = ((1 - cos_pixel) * onehot).sum(1) / counts.clamp_min(1)           # (B, K)
    eye = torch.eye(K, dtype=torch.bool, device=emb.device)
    pairs = present[:, :, None] & present[:, None, :] & ~eye                 # (B, K, K)
    cos_means = torch.einsum("bdk,bdl->bkl", mu_n, mu_n) ** 2
    push = (cos_means * pairs).sum(2) / pairs.sum(2).clamp_min(1)            # (B, K)
    per_image = ((pull + push) * present).sum(1) / present.sum(1)
    return per_image.mean()


def random_instances(batch: int, dim: int, size: int, instances: int, *, seed: int = 0,
                     device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Embeddings (requires_grad) and an instance map of `instances` rectangular blobs per image."""
    for name, v in (("batch", batch), ("dim", dim), ("size", size), ("instances", instances)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"random_instances: {name} must be a positive int, got {v!r}")
    g = torch.Generator().manual_seed(seed)
    labels = torch.zeros(batch, size, size, dtype=torch.long)
    for b in range(batch):
        for k in range(1, instances):
            y0, x0 = torch.randint(0, size - 2, (2,), generator=g).tolist()
            h, w = torch.randint(2, max(3, size // 2), (2,), generator=g).tolist()
            labels[b, y0:y0 + h, x0:x0 + w] = k
    emb = torch.randn(batch, dim, size, size, generator=g)
    return emb.to(device).requires_grad_(True), labels.to(device)
