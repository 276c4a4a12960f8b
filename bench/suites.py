"""Benchmark suites: named lists of ConvSpec (float32).

- ``quick`` (the default): ResNet-50's and MobileNet's layers, three of VGG-16's and
  ``convbench:24``; under a minute with every engine on this project's 2-core machine class.
- ``resnet50``: eight ResNet-50 layers, batch 1.
- ``vgg16``: VGG-16's nine distinct convolutions (224 x 224 input).
- ``mobilenet``: MobileNet v1's distinct convolutions (224 x 224 input), depthwise included.
- ``layers``: 17 layers from ResNet-50, VGG-16, MobileNet and YOLO (3x3, 1x1, 7x7 stride 2;
  batch 1 and 8), the list the single-core targets are stated on.
- ``convbench[:N]``: N convolutions sampled from ``data/timm_convs.csv`` (4556 distinct
  convolutions of the timm collection, the ConvBench set), stratified: for each kind (common,
  pointwise, dilated; groups = 1) evenly spaced by GFLOP, in proportion to the kind's size with
  at least a few of each. ``convbench`` alone means ``convbench:100``.
- ``depthwise[:N]``, ``grouped[:N]``: N (default 40) of timm's depthwise (one input channel
  per group) or other grouped convolutions, evenly spaced by GFLOP.
- a path to any CSV with the same columns: every row; ``PATH:N`` samples N rows as above (of
  every kind the file has).
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


VGG16 = [
    _conv(3, 224, 64, 3, pad=1),               # conv1_1
    _conv(64, 224, 64, 3, pad=1),              # conv1_2
    _conv(64, 112, 128, 3, pad=1),             # conv2_1
    _conv(128, 112, 128, 3, pad=1),            # conv2_2
    _conv(128, 56, 256, 3, pad=1),             # conv3_1
    _conv(256, 56, 256, 3, pad=1),             # conv3_2, conv3_3
    _conv(256, 28, 512, 3, pad=1),             # conv4_1
    _conv(512, 28, 512, 3, pad=1),             # conv4_2, conv4_3
    _conv(512, 14, 512, 3, pad=1),             # conv5_x
]


def _depthwise(c, hw, stride):
    return ConvSpec(1, c, hw, hw, c, 3, 3, stride=(stride, stride), padding=(1,) * 4, groups=c)


MOBILENET = [_conv(3, 224, 32, 3, stride=2, pad=1)]  # the stem; then depthwise + pointwise pairs
for _c, _hw, _stride, _k in [(32, 112, 1, 64), (64, 112, 2, 128), (128, 56, 1, 128),
                             (128, 56, 2, 256), (256, 28, 1, 256), (256, 28, 2, 512),
                             (512, 14, 1, 512), (512, 14, 2, 1024), (1024, 7, 1, 1024)]:
    MOBILENET += [_depthwise(_c, _hw, _stride), _conv(_c, _hw // _stride, _k, 1)]


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


def stratified_sample(count, path=TIMM_CSV, kinds=SLICING_KINDS):
    """``count`` convolutions of ``kinds`` (None: every kind in the file), stratified by kind
    and evenly spaced by GFLOP."""
    rows = read_csv(path)
    kinds = kinds or sorted({row.get("kind", "") for _, row in rows})
    by_kind = {kind: sorted((r for r in rows if r[1].get("kind", "") == kind),
                            key=lambda r: float(r[1]["gflop"])) for kind in kinds}
    total = sum(len(rows) for rows in by_kind.values())
    picked = []
    for kind, rows in by_kind.items():
        share = min(len(rows), max(3, ceil(count * len(rows) / total)))
        # mid-points of ``share`` equal slices: spread over the kind, no extreme outliers
        picked += [rows[int((i + 0.5) * len(rows) / share)][0] for i in range(share)]
    return picked[:count] if len(picked) > count else picked


NAMED = {"resnet50": RESNET50, "vgg16": VGG16, "mobilenet": MOBILENET, "layers": LAYERS}
GROUPED_KINDS = ("depthwise", "grouped")   # timm kinds sampled alone (default GROUPED_SAMPLE)
GROUPED_SAMPLE = 40
SUITES = ("quick, resnet50, vgg16, mobilenet, layers, convbench[:N], depthwise[:N], grouped[:N] "
          "or a CSV path[:N]")


def suite(name):
    """The ConvSpecs of suite ``name`` (see the module docstring)."""
    if name in NAMED:
        return list(NAMED[name])
    if name == "quick":
        return RESNET50 + MOBILENET + [VGG16[i] for i in (1, 5, 8)] + stratified_sample(24)
    base, _, count = name.rpartition(":") if name.rpartition(":")[2].isdigit() else (name, "", "")
    if base == "convbench":
        return stratified_sample(int(count or 100))
    if base in GROUPED_KINDS:
        return stratified_sample(int(count or GROUPED_SAMPLE), kinds=(base,))
    if os.path.isfile(base):
        return stratified_sample(int(count), base, kinds=None) if count else [s for s, _ in read_csv(base)]
    raise ValueError(f"unknown suite {name!r}: {SUITES}")
