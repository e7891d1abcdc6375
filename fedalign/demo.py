"""An offline multi-domain image set for the quick start, built from scikit-learn's digits.

scikit-learn ships 1,797 handwritten digits (8×8, 16 grey levels; ``sklearn.datasets.load_digits``),
so no download is needed. Each *domain* renders the same kind of digits in another visual style,
which gives the covariate shift that SLOT-Align and GMM-DaDiL are meant to absorb:

========= ===================================================================================
domain    style
========= ===================================================================================
ink       dark ink on white paper (bilinear upscaling)
neon      bright coloured strokes on a dark, noisy background (MNIST-M-like)
blocky    thick, pixelated white strokes on a coloured background, slightly rotated
========= ===================================================================================

Images are written in ImageFolder layout, ``OUT/<domain>/<digit>/<index>.png``; each domain
gets a disjoint subset of the digits (as real domains hold different writers).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedalign.errors import FedalignError

DOMAINS = ("ink", "neon", "blocky")


def _render(img8: np.ndarray, style: str, size: int, rng: np.random.Generator) -> np.ndarray:
    """Render one 8×8 digit (values 0..16) as a (size, size, 3) uint8 RGB image."""
    from PIL import Image

    g = (img8 / 16.0 * 255).astype(np.uint8)
    if style == "ink":
        a = np.asarray(Image.fromarray(g).resize((size, size), Image.BILINEAR), float) / 255
        rgb = 1.0 - a[..., None] * np.array([0.9, 0.9, 0.8])
    elif style == "neon":
        a = np.asarray(Image.fromarray(g).resize((size, size), Image.BICUBIC), float) / 255
        color = rng.uniform(0.5, 1.0, 3)
        bg = rng.uniform(0.0, 0.35, 3) + rng.normal(0, 0.08, (size, size, 3))
        rgb = bg * (1 - a[..., None]) + color * a[..., None]
    elif style == "blocky":
        im = Image.fromarray(g).resize((size, size), Image.NEAREST)
        im = im.rotate(float(rng.uniform(-20, 20)), resample=Image.NEAREST)
        a = np.clip(np.asarray(im, float) / 255 * 1.6, 0, 1)
        bg = rng.uniform(0.2, 0.8, 3)
        rgb = bg * (1 - a[..., None]) + a[..., None]
    else:
        raise ValueError(f"unknown style {style!r}")
    return (np.clip(rgb, 0, 1) * 255).astype(np.uint8)


def make_digit_domains(out, per_domain: int = 200, size: int = 32, seed: int = 0,
                       domains=DOMAINS) -> dict:
    """Write the quick-start domains as PNG files in ImageFolder layout.

    Parameters
    ----------
    out : folder to create (``out/<domain>/<digit>/<i>.png``)
    per_domain : images per domain (at most 1797 // len(domains)), class-balanced draw
    size : image side in pixels
    seed : controls the split into domains and the random style parameters

    Returns
    -------
    dict domain -> number of images written
    """
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(digits.target))
    share = len(order) // len(domains)
    if per_domain > share:
        raise FedalignError(f"per_domain must be at most {share}", param="per_domain")
    counts = {}
    for k, dom in enumerate(domains):
        idx = order[k * share : (k + 1) * share][:per_domain]
        drng = np.random.default_rng([seed, k])
        for i in idx:
            label = int(digits.target[i])
            folder = Path(out) / dom / str(label)
            folder.mkdir(parents=True, exist_ok=True)
            rgb = _render(digits.images[i], dom, size, drng)
            Image.fromarray(rgb).save(folder / f"{i:04d}.png")
        counts[dom] = len(idx)
    return counts
