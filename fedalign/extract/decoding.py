"""Decoding images (in DataLoader worker processes) and batching them.

A corrupt or unreadable image is returned as an error, never replaced by another one: the
extraction loop decides (fail naming the file, or skip it).
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path



def decode_image(path) -> tuple:
    """Read and decode one image to RGB.

    Returns
    -------
    image : PIL.Image.Image
        RGB (grayscale, palette and alpha images are converted).
    sha256 : str
        Hex SHA-256 of the file's bytes.

    Raises
    ------
    OSError, ValueError, PIL.UnidentifiedImageError
        for unreadable, truncated or corrupt files (PIL's ``LOAD_TRUNCATED_IMAGES`` stays off).
    """
    from PIL import Image

    data = Path(path).read_bytes()
    with Image.open(io.BytesIO(data)) as im:
        im.load()
        rgb = im.convert("RGB")
    return rgb, hashlib.sha256(data).hexdigest()


class ImageDataset:
    """Map-style dataset over an :class:`ImageList`: item ``i`` → ``(i, tensor|None, sha, error)``.

    Failures are returned, not raised, so the main process decides (error or skip) and names
    the file; nothing is substituted for a bad image.
    """

    def __init__(self, paths, transform):
        self.paths = [str(p) for p in paths]
        self.transform = transform

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        try:
            img, sha = decode_image(self.paths[i])
            return i, self.transform(img), sha, None
        except Exception as e:  # noqa: BLE001 - any decoder failure is reported by name
            msg = str(e).splitlines()[0] if str(e) else ""
            return i, None, "", f"{type(e).__name__}: {msg}".rstrip(": ")


def collate(items):
    """Batch decoded items: ``(indices (m,), images (m', 3, H, W) or None, shas, errors)``.

    ``errors`` maps a listing index to its error message; ``images`` holds only good items.
    """
    import torch

    idx = [it[0] for it in items]
    good = [it for it in items if it[3] is None]
    x = torch.stack([it[1] for it in good]) if good else None
    return idx, x, [it[2] for it in good], {it[0]: it[3] for it in items if it[3] is not None}
