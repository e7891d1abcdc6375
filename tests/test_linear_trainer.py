"""The numpy trainer of the linear heads (fedalign.heads.linear) against an independent oracle:
PyTorch autograd and torch.optim, the implementation it replaced, on the same draws.

Same maths, other arithmetic (float64 numpy vs float32 torch): the heads agree to float32
rounding (observed ≤ 3e-6 relative after 200 steps), every option included.
"""

import numpy as np
import pytest

from fedalign.heads import linear
from heads_data import C, D, blobs

torch = pytest.importorskip("torch")


def torch_train(X, y, n_classes, *, epochs, lr, batch_size, optimizer="sgd", momentum=0.9,
                weight_decay=1e-5, softmax_before_ce=False, seed=0, init=None, logit_offset=None,
                transport=None, taus=None):
    """The torch trainer as it was (mini-batch order and initialisation from the same numpy
    generator; the final loss on all rows)."""
    X = np.asarray(X, dtype=np.float32)
    n, d = X.shape
    rng = np.random.default_rng(seed)
    W0, b0 = init if init is not None else linear.default_init(d, n_classes, int(rng.integers(2**31)))
    W = torch.tensor(np.asarray(W0, np.float32), requires_grad=True)
    b = torch.tensor(np.asarray(b0, np.float32), requires_grad=True)
    opt = (torch.optim.SGD([W, b], lr=lr, momentum=momentum, weight_decay=weight_decay)
           if optimizer == "sgd" else torch.optim.AdamW([W, b], lr=lr, weight_decay=weight_decay))
    X0, yt = torch.from_numpy(X), torch.from_numpy(np.asarray(y, np.int64))
    delta = None
    if transport is not None:
        A, t = (np.asarray(a, np.float64) for a in transport)
        delta = torch.from_numpy((X @ A.T + t - X).astype(np.float32))
    off = None if logit_offset is None else torch.tensor(np.asarray(logit_offset, np.float32))

    def loss_of(Xb, yb):
        z = Xb @ W.T + b + (0 if off is None else off)
        return torch.nn.functional.cross_entropy(torch.softmax(z, 1) if softmax_before_ce else z, yb)

    Xt = X0
    for e in range(epochs):
        if delta is not None:
            Xt = X0 + float(taus[e]) * delta
        order = torch.from_numpy(rng.permutation(n))
        for s in range(0, n, batch_size):
            idx = order[s:s + batch_size]
            loss = loss_of(Xt[idx], yt[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        final = float(loss_of(Xt, yt))
    return W.detach().numpy().astype(np.float64), b.detach().numpy().astype(np.float64), final


def _offset(y):
    with np.errstate(divide="ignore"):
        return np.log(np.bincount(y, minlength=C) / len(y))


@pytest.mark.parametrize("case", ["sgd", "softmax-before-ce", "logit-offset", "adamw", "transport",
                                  "no-momentum", "full-batch"])
def test_numpy_trainer_matches_torch_autograd(case, one_thread):
    X, y = blobs(150, 1)
    rng = np.random.default_rng(3)
    A, t = np.eye(D) + 0.1 * rng.normal(size=(D, D)), rng.normal(size=D)
    kw = dict(epochs=20, lr=0.01, batch_size=16, seed=5)
    kw.update({"sgd": {}, "softmax-before-ce": dict(softmax_before_ce=True, lr=1e-3),
               "logit-offset": {}, "adamw": dict(optimizer="adamw"),
               "transport": dict(transport=(A, t), taus=list(np.linspace(0.0, 0.4, 20))),
               "no-momentum": dict(momentum=0.0), "full-batch": dict(batch_size=200)}[case])
    if case == "logit-offset":  # classes 3 absent at this client: offset −inf, no gradient
        y = y % 3
        kw["logit_offset"] = _offset(y)
    info = {}
    W, b = linear.train_softmax(X, y, C, info=info, **kw)
    Wt, bt, final = torch_train(X, y, C, **kw)
    scale = max(np.abs(Wt).max(), np.abs(bt).max())
    assert np.abs(W - Wt).max() <= 2e-5 * scale and np.abs(b - bt).max() <= 2e-5 * scale
    assert info["final_loss"] == pytest.approx(final, rel=1e-4, abs=1e-6)
    assert info["steps"] == kw["epochs"] * -(-150 // kw["batch_size"])
    assert W.dtype == np.float64 and W.shape == (C, D) and b.shape == (C,)


def test_numpy_trainer_reduces_to_one_gradient_step():
    # closed form: one full-batch SGD step without momentum or decay from W = 0, b = 0 is
    # −lr ∇L with ∇_z L = (softmax(0) − e_y)/n = (1/C − e_y)/n
    X, y = blobs(40, 2)
    W, b = linear.train_softmax(X, y, C, epochs=1, lr=0.5, batch_size=64, momentum=0.0,
                                weight_decay=0.0, init=(np.zeros((C, D)), np.zeros(C)))
    G = (np.full((40, C), 1.0 / C) - np.eye(C)[y]) / 40
    assert np.allclose(W, -0.5 * G.T @ X.astype(np.float64), rtol=1e-12, atol=1e-15)
    assert np.allclose(b, -0.5 * G.sum(0), rtol=1e-12, atol=1e-15)


def test_heads_that_train_import_no_torch():
    """evaluate's heads run without torch (its import alone is ~1.5 s of every evaluate)."""
    import ast
    from pathlib import Path

    import fedalign.heads

    for name in ("linear", "ofedavg", "centralized", "fedpft"):
        tree = ast.parse((Path(fedalign.heads.__file__).parent / f"{name}.py").read_text())
        mods = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        mods |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not any(m == "torch" or m.startswith("torch.") for m in mods), name
