"""Shared by the autograd tests: run a layer function forward and backward on copies of its inputs."""


def fwd_bwd(fn, x, w, b, dy):
    """``(y, dx, dW, db)`` of ``fn(x, w, b)`` with output gradient ``dy`` (inputs are cloned)."""
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    b = None if b is None else b.clone().requires_grad_()
    y = fn(x, w, b)
    y.backward(dy)
    return y.detach(), x.grad, w.grad, None if b is None else b.grad
