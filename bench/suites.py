"""Benchmark suites: named lists of ConvSpec (float32).

- ``resnet50``: eight ResNet-50 layers, batch 1.
- ``layers``: 17 layers from ResNet-50, VGG-16, MobileNet and YOLO (3x3, 1x1, 7x7 stride 2;
  batch 1 and 8), the list the single-core targets are stated on.
- ``timm[:N]``: N convolutions sampled from ``data/timm_convs.csv`` (4556 distinct convolutions
  of the timm collection, the ConvBench set), stratified: for each kind (common, pointwise,
  dilated; groups = 1) evenly spaced by GFLOP, in proportion to the kind's size with at least
  a few of each. ``timm`` alone means ``timm:100``.
- a path to any CSV with the same columns: every row.
"""
import csv
import os
from math import ceil

from csa import ConvSpec

TIMM_CSV = os.path.join(os.path.dirname(__file__), "data", "timm_convs.csv")
SLICING_KINDS = ("common", "pointwise", "dilated")  # groups = 1; depthwise/grouped have their own path


def _conv(c, hw, k, rs, stride=1, pad=0, n=1):
    return ConvSpec(n, c, hw, hw, k, rs, rs, stride=(stride, stride), padding=(pad,) * 4)


RESNET50 = [
    _conv(3, 224, 64, 7, stride=2, pad=3),     # stem
    _conv(64, 56, 256, 1),                     # conv2_x expand
    _conv(64, 56, 64, 3, pad=1),               # conv2_x 3x3
    _conv(256, 56, 64, 1),                     # conv2_x reduce
    _conv(128, 28, 128, 3, pad=1),             # conv3_x 3x3
    _conv(256, 14, 256, 3, pad=1),             # conv4_x 3x3
    _conv(512, 7, 512, 3, pad=1),              # conv5_x 3x3
    _conv(1024, 14, 2048, 1, stride=2),        # conv5_1 projection shortcut
]

LAYERS = RESNET50 + [
    _conv(64, 56, 64, 3, pad=1, n=8),          # ResNet-50 conv2_x 3x3, batch 8
    _conv(256, 14, 1024, 1, n=8),              # ResNet-50 conv4_x expand, batch 8
    _conv(3, 224, 64, 3, pad=1),               # VGG-16 conv1_1
    _conv(128, 112, 128, 3, pad=1),            # VGG-16 conv2_2
    _conv(256, 56, 256, 3, pad=1),             # VGG-16 conv3_x (the large 3x3 of the targets)
    _conv(512, 28, 512, 3, pad=1),             # VGG-16 conv4_x
    _conv(32, 112, 64, 1),                     # MobileNet v1 pointwise
    _conv(512, 14, 512, 1),                    # MobileNet v1 pointwise
    _conv(32, 208, 64, 3, stride=2, pad=1),    # YOLOv3 downsample (416 input)
]


def read_csv(path):
    """ConvSpecs (float32) of every row of a timm_convs-style CSV, with its row dict."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    out = []
    for row in rows:
        v = {k: int(row[k]) for k in ("N", "C", "H", "W", "K", "R", "S", "stride_h", "stride_w",
                                      "pad_t", "pad_b", "pad_l", "pad_r", "dil_h", "dil_w", "groups")}
        spec = ConvSpec(v["N"], v["C"], v["H"], v["W"], v["K"], v["R"], v["S"],
                        stride=(v["stride_h"], v["stride_w"]),
                        padding=(v["pad_t"], v["pad_b"], v["pad_l"], v["pad_r"]),
                        dilation=(v["dil_h"], v["dil_w"]), groups=v["groups"])
        out.append((spec, row))
    return out


def timm_sample(count, kinds=SLICING_KINDS, path=TIMM_CSV):
    """``count`` convolutions of ``kinds``, stratified by kind and evenly spaced by GFLOP."""
    by_kind = {kind: sorted((r for r in read_csv(path) if r[1]["kind"] == kind),
                            key=lambda r: float(r[1]["gflop"])) for kind in kinds}
    total = sum(len(rows) for rows in by_kind.values())
    picked = []
    for kind, rows in by_kind.items():
        share = min(len(rows), max(3, ceil(count * len(rows) / total)))
        # mid-points of ``share`` equal slices: spread over the kind, no extreme outliers
        picked += [rows[int((i + 0.5) * len(rows) / share)][0] for i in range(share)]
    return picked[:count] if len(picked) > count else picked


def suite(name):
    """The ConvSpecs of suite ``name`` (see the module docstring)."""
    if name == "resnet50":
        return list(RESNET50)
    if name == "layers":
        return list(LAYERS)
    if name == "timm" or name.startswith("timm:"):
        return timm_sample(int(name.partition(":")[2] or 100))
    if os.path.isfile(name):
        return [spec for spec, _ in read_csv(name)]
    raise ValueError(f"unknown suite {name!r}: resnet50, layers, timm[:N] or a CSV path")
