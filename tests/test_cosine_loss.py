import pytest
import torch

from helpers import cosine_loss as cl


@pytest.mark.parametrize("seed", [0, 1])
def test_loop_and_vectorised_agree_in_value_and_gradient(seed):
    emb, labels = cl.random_instances(2, 5, 8, 3, seed=seed)
    emb = emb.double().detach().requires_grad_(True)
    a = cl.loss_loop(emb, labels)
    ga, = torch.autograd.grad(a, emb)
    b = cl.loss_vectorised(emb, labels)
    gb, = torch.autograd.grad(b, emb)
    assert torch.allclose(a, b, atol=1e-10)
    assert torch.allclose(ga, gb, atol=1e-10)


def test_perfect_embedding_has_zero_loss():
    # two instances embedded along orthogonal axes: pull = 0, push = 0
    labels = torch.zeros(1, 4, 4, dtype=torch.long)
    labels[0, :2] = 1
    emb = torch.zeros(1, 2, 4, 4)
    emb[0, 0][labels[0] == 0] = 1.0
    emb[0, 1][labels[0] == 1] = 3.0
    assert cl.loss_vectorised(emb, labels).item() == pytest.approx(0.0, abs=1e-6)
    assert cl.loss_loop(emb, labels).item() == pytest.approx(0.0, abs=1e-6)


def test_missing_instance_ids_are_skipped():
    emb, labels = cl.random_instances(1, 3, 6, 2, seed=3)
    labels = labels * 2   # ids {0, 2}: id 1 absent
    assert torch.allclose(cl.loss_loop(emb, labels), cl.loss_vectorised(emb, labels), atol=1e-6)


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match="emb must be"):
        cl.loss_vectorised(torch.zeros(2, 3, 4), torch.zeros(2, 3, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="labels must be"):
        cl.loss_vectorised(torch.zeros(1, 2, 4, 4), torch.zeros(1, 4, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="integer"):
        cl.loss_loop(torch.zeros(1, 2, 4, 4), torch.zeros(1, 4, 4))
