"""The benchmarked convolutions: representative ResNet-50 layers, batch 1, float32."""
from csa import ConvSpec


def _conv(c, hw, k, rs, stride=1, pad=0):
    return ConvSpec(1, c, hw, hw, k, rs, rs, stride=(stride, stride), padding=(pad,) * 4)


LAYERS = [
    _conv(3, 224, 64, 7, stride=2, pad=3),     # stem
    _conv(64, 56, 256, 1),                     # conv2_x expand
    _conv(64, 56, 64, 3, pad=1),               # conv2_x 3x3
    _conv(256, 56, 64, 1),                     # conv2_x reduce
    _conv(128, 28, 128, 3, pad=1),             # conv3_x 3x3
    _conv(256, 14, 256, 3, pad=1),             # conv4_x 3x3
    _conv(512, 7, 512, 3, pad=1),              # conv5_x 3x3
    _conv(1024, 14, 2048, 1, stride=2),        # conv5_1 projection shortcut
]
