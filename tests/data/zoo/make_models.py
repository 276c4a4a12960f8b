#!/usr/bin/env python3
"""Export reduced-cost versions of the 18 torchvision classification families to ONNX, for tests:
random weights (nothing downloaded), non-trivial BatchNorm/LayerNorm parameters, BatchNorm
statistics and biases calibrated on random inputs so that the output depends on the input (calibrate),
10 classes, small inputs, and narrower layers where torchvision's constructors allow it simply.

Usage: python make_models.py [OUTDIR] [NAME...] [--exporters ts17,dy18]
  OUTDIR defaults to this script's folder (the test set); NAMEs default to all 18 (see ARCHS).
  Writes OUTDIR/<name>.ts17.onnx (TorchScript exporter, opset 17) and OUTDIR/<name>.dy18.onnx
  (the dynamo exporter, opset 18; one self-contained file unless --external-data, which keeps the
  exporter's default NAME.onnx.data beside it), then prints path, bytes, parameters, input size.
Needs a CPU torch, torchvision, onnx and onnxscript (pip install torch torchvision onnx onnxscript);
not the tests, which read the files this writes.
"""
import argparse, os, sys, warnings
from functools import partial

warnings.filterwarnings("ignore")
import torch
import torch.library as _library
from torch import nn

_register = _library.register_fake           # the PyPI torchvision's compiled ops do not match a
_library.register_fake = lambda *a, **k: (lambda f: f)   # CPU torch: skip their fake registrations
import torchvision
from torchvision import models as tvm
_library.register_fake = _register

NUM_CLASSES = 10


def scaled_conv(k):
    """A torchvision BasicConv2d builder with in/out channels divided by k (the RGB input kept)."""
    def build(cls):
        return lambda i, o, **kw: cls(i if i == 3 else i // k, o // k, **kw)
    return build


def slim_sequential(seq, k, last_out=None):
    """A copy of a plain nn.Sequential (Conv2d/BatchNorm2d/Linear/others) with every channel count
    divided by k, except the RGB input and (with last_out) the last Linear's output."""
    layers, linears = [], [m for m in seq if isinstance(m, nn.Linear)]
    for m in seq:
        if isinstance(m, nn.Conv2d):
            m = nn.Conv2d(m.in_channels if m.in_channels == 3 else m.in_channels // k, m.out_channels // k,
                          m.kernel_size, m.stride, m.padding, m.dilation, m.groups, m.bias is not None)
        elif type(m).__name__ == "Fire":   # squeezenet's
            m = type(m)(m.inplanes // k, m.squeeze.out_channels // k, m.expand1x1.out_channels // k,
                        m.expand3x3.out_channels // k)
        elif isinstance(m, nn.BatchNorm2d):
            m = nn.BatchNorm2d(m.num_features // k, m.eps, m.momentum)
        elif isinstance(m, nn.Linear):
            out = last_out if (m is linears[-1] and last_out) else m.out_features // k
            m = nn.Linear(m.in_features // k, out, m.bias is not None)
        layers.append(m)
    return nn.Sequential(*layers)


def alexnet():
    # the constructor has no width: the plain Sequentials are rebuilt 8x narrower (classifier 64x)
    m = tvm.alexnet(weights=None, num_classes=NUM_CLASSES)
    m.features = slim_sequential(m.features, 8)
    c = m.classifier   # Dropout, Linear(9216, 4096), ReLU, Dropout, Linear(4096, 4096), ReLU, Linear(4096, n)
    m.classifier = nn.Sequential(c[0], nn.Linear(9216 // 8, 64), c[2], c[3], nn.Linear(64, 64), c[5],
                                 nn.Linear(64, NUM_CLASSES))
    return m


def vgg11_bn():
    cfg = [4, "M", 8, "M", 16, 16, "M", 32, 32, "M", 32, 32, "M"]   # cfg "A" / 16
    m = tvm.VGG(tvm.vgg.make_layers(cfg, batch_norm=True), num_classes=NUM_CLASSES, init_weights=True)
    c = m.classifier   # Linear(25088, 4096), ReLU, Dropout, Linear(4096, 4096), ReLU, Dropout, Linear
    m.classifier = nn.Sequential(nn.Linear(32 * 7 * 7, 32), c[1], c[2], nn.Linear(32, 32), c[4], c[5],
                                 nn.Linear(32, NUM_CLASSES))
    return m


def slim_resnet(block, layers, k, **kw):
    """torchvision's ResNet with every stage (and the stem) k times narrower: ResNet has no width
    parameter, but each stage is built by _make_layer(block, planes, ...), which a subclass narrows;
    the stem and fc, built with literal widths, are rebuilt to match."""
    class SlimResNet(tvm.ResNet):
        def _make_layer(self, block, planes, blocks, stride=1, dilate=False):
            if planes == 64:               # the first stage: its input is the narrowed stem
                self.inplanes = 64 // k
            return super()._make_layer(block, planes // k, blocks, stride, dilate)
    m = SlimResNet(block, layers, num_classes=NUM_CLASSES, **kw)
    m.conv1 = nn.Conv2d(3, 64 // k, kernel_size=7, stride=2, padding=3, bias=False)
    m.bn1 = nn.BatchNorm2d(64 // k)
    m.fc = nn.Linear(512 * block.expansion // k, NUM_CLASSES)
    return m


def googlenet():
    g = sys.modules["torchvision.models.googlenet"]
    conv = scaled_conv(8)(g.BasicConv2d)
    m = g.GoogLeNet(num_classes=NUM_CLASSES, aux_logits=False, init_weights=True,
                    blocks=[conv, partial(g.Inception, conv_block=conv), g.InceptionAux])
    m.fc = nn.Linear(1024 // 8, NUM_CLASSES)
    return m


def inception_v3():
    i = sys.modules["torchvision.models.inception"]
    conv = scaled_conv(16)(i.BasicConv2d)
    m = i.Inception3(num_classes=NUM_CLASSES, aux_logits=False, init_weights=True,
                     inception_blocks=[conv] + [partial(b, conv_block=conv) for b in
                                                (i.InceptionA, i.InceptionB, i.InceptionC, i.InceptionD,
                                                 i.InceptionE)] + [i.InceptionAux])
    m.fc = nn.Linear(2048 // 16, NUM_CLASSES)
    return m


def squeezenet1_1():
    m = tvm.squeezenet1_1(weights=None, num_classes=NUM_CLASSES)
    m.features = slim_sequential(m.features, 4)         # the Fire modules rebuilt 4x narrower
    m.classifier[1] = nn.Conv2d(512 // 4, NUM_CLASSES, kernel_size=1)
    return m


def mobilenet_v2():
    from torchvision.ops.misc import Conv2dNormActivation
    m = tvm.mobilenet_v2(weights=None, width_mult=0.25, num_classes=NUM_CLASSES)
    # the last 1x1 conv is 1280 wide whatever width_mult: rebuilt 256 wide
    m.features[-1] = Conv2dNormActivation(m.features[-1][0].in_channels, 256, kernel_size=1,
                                          norm_layer=nn.BatchNorm2d, activation_layer=nn.ReLU6)
    m.classifier[1] = nn.Linear(256, NUM_CLASSES)
    return m


def mnasnet0_5():
    m = tvm.MNASNet(0.125, num_classes=NUM_CLASSES)
    # the last 1x1 conv (layers[-3], its BatchNorm layers[-2]) is 1280 wide whatever alpha: 256 here
    m.layers[-3] = nn.Conv2d(m.layers[-3].in_channels, 256, 1, bias=False)
    m.layers[-2] = nn.BatchNorm2d(256)
    m.classifier[1] = nn.Linear(256, NUM_CLASSES)
    return m


def efficientnet_b0():
    e = sys.modules["torchvision.models.efficientnet"]
    setting, last = e._efficientnet_conf("efficientnet_b0", width_mult=0.25, depth_mult=0.5)
    return e.EfficientNet(setting, 0.2, num_classes=NUM_CLASSES, last_channel=last)


def efficientnet_v2_s():
    e = sys.modules["torchvision.models.efficientnet"]
    F, M = e.FusedMBConvConfig, e.MBConvConfig
    setting = [F(1, 3, 1, 8, 8, 2), F(4, 3, 2, 8, 16, 2), F(4, 3, 2, 16, 24, 2),
               M(4, 3, 2, 24, 32, 2), M(6, 3, 1, 32, 40, 2), M(6, 3, 2, 40, 64, 2)]
    return e.EfficientNet(setting, 0.2, num_classes=NUM_CLASSES, last_channel=256,
                          norm_layer=partial(nn.BatchNorm2d, eps=1e-03))


def regnet(se_ratio):
    r = sys.modules["torchvision.models.regnet"]
    params = r.BlockParams(depths=[1, 1, 2, 2], widths=[16, 32, 64, 128], group_widths=[8] * 4,
                           bottleneck_multipliers=[1.0] * 4, strides=[2] * 4, se_ratio=se_ratio)
    return r.RegNet(params, num_classes=NUM_CLASSES, stem_width=16)


def convnext_tiny():
    c = sys.modules["torchvision.models.convnext"]
    C = c.CNBlockConfig
    # layer_scale 1.0, not torchvision's 1e-6, so that each block's branch shows in the output
    return c.ConvNeXt([C(8, 16, 1), C(16, 32, 1), C(32, 64, 2), C(64, None, 1)],
                      stochastic_depth_prob=0.0, layer_scale=1.0, num_classes=NUM_CLASSES)


# name -> (builder, input size, how it was reduced)
ARCHS = {
    "alexnet": (alexnet, 224, "features 8x and classifier 64x narrower (Sequentials rebuilt); 224: "
                "the TorchScript exporter needs the 6x6 adaptive pool to divide the feature map"),
    "vgg11_bn": (vgg11_bn, 224, "make_layers(cfg A / 16) + classifier 32 wide; 224 for the 7x7 adaptive pool"),
    "resnet18": (lambda: slim_resnet(tvm.resnet.BasicBlock, [2, 2, 2, 2], 8), 64,
                 "stem and stages 8x narrower (a ResNet subclass narrows _make_layer), depth kept"),
    "resnext50_32x4d": (lambda: slim_resnet(tvm.resnet.Bottleneck, [1, 1, 1, 1], 8, groups=8, width_per_group=8),
                        64, "one block per stage, 8x narrower, 8 groups (1..8 channels each) instead of 32x4"),
    "wide_resnet50_2": (lambda: slim_resnet(tvm.resnet.Bottleneck, [1, 1, 1, 1], 16, width_per_group=128), 64,
                        "one block per stage, 16x narrower, inner width still 2x (width_per_group 128)"),
    "squeezenet1_1": (squeezenet1_1, 64, "Fire modules and final conv rebuilt 4x narrower"),
    "densenet121": (lambda: tvm.DenseNet(growth_rate=8, block_config=(2, 3, 4, 3), num_init_features=16,
                                         bn_size=2, num_classes=NUM_CLASSES), 64,
                    "growth 8, blocks (2,3,4,3), 16 initial features"),
    "googlenet": (googlenet, 64, "every BasicConv2d 8x narrower (blocks=), fc rebuilt"),
    "inception_v3": (inception_v3, 75, "every BasicConv2d 16x narrower (inception_blocks=), fc rebuilt; 75 = min size"),
    "mobilenet_v2": (mobilenet_v2, 64, "width_mult 0.25, last conv 256 instead of 1280"),
    "mobilenet_v3_small": (lambda: tvm.mobilenet_v3_small(weights=None, width_mult=0.5, reduced_tail=True,
                                                          num_classes=NUM_CLASSES), 64,
                           "width_mult 0.5, reduced_tail"),
    "mnasnet0_5": (mnasnet0_5, 64, "alpha 0.125, last conv 256 instead of 1280"),
    "shufflenet_v2_x0_5": (lambda: tvm.ShuffleNetV2([2, 2, 2], [24, 24, 48, 96, 256], num_classes=NUM_CLASSES),
                           64, "stages (2,2,2), channels 24/24/48/96/256"),
    "efficientnet_b0": (efficientnet_b0, 64, "width_mult 0.25, depth_mult 0.5"),
    "efficientnet_v2_s": (efficientnet_v2_s, 64, "6 stages of 2 blocks, 8..64 channels, last 256"),
    "regnet_x_400mf": (lambda: regnet(None), 64, "BlockParams depths 1,1,2,2 widths 16..128 groups of 8"),
    "regnet_y_400mf": (lambda: regnet(0.25), 64, "as regnet_x + SE 0.25"),
    "convnext_tiny": (convnext_tiny, 64, "CNBlockConfig 8/16/32/64 x (1,1,2,1), layer_scale 1.0"),
}


def randomize_norms(model):
    """BatchNorm and LayerNorm scale/shift, which torchvision initializes to 1 and 0, made random."""
    for m in model.modules():
        if isinstance(m, (nn.modules.batchnorm._BatchNorm, nn.LayerNorm)) and m.weight is not None:
            m.weight.data.uniform_(0.5, 1.5); m.bias.data.uniform_(-0.1, 0.1)


def calibrate(model, size, batch=8):
    """Make the output depend on the input. With random weights a deep ReLU net maps every input
    to nearly the same output (each layer's common, per-channel mean grows while the input's part
    shrinks: exports whose BatchNorm statistics are uniform noise change by ~1e-7 relative
    from one random input to another for
    efficientnet_b0, googlenet, mnasnet, mobilenet_v2/v3), so that a comparison of outputs tests
    little. Here, in the order the forward pass reaches them, each BatchNorm gets the running
    statistics of what reaches it and each Conv2d/Linear with a bias and no BatchNorm after it is
    rescaled to zero-mean, unit-variance outputs per channel, on a batch of random inputs (the
    data-dependent initialisation of LSUV / weight normalization)."""
    x = torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(1))
    order = []
    hooks = [m.register_forward_pre_hook(lambda mod, _: order.append(mod) if mod not in order else None)
             for m in model.modules()]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    targets = [m for m in order if isinstance(m, nn.modules.batchnorm._BatchNorm)
               or (isinstance(m, (nn.Conv2d, nn.Linear)) and m.bias is not None)]
    for m in targets:
        def hook(mod, inputs, output):
            if isinstance(mod, nn.modules.batchnorm._BatchNorm):
                dims = [d for d in range(inputs[0].dim()) if d != 1]
                mod.running_mean.copy_(inputs[0].mean(dims)); mod.running_var.copy_(inputs[0].var(dims))
            else:
                dims = [d for d in range(output.dim()) if d != (1 if isinstance(mod, nn.Conv2d) else output.dim() - 1)]
                mean, std = output.mean(dims), output.std(dims).clamp_min(1e-3)
                shape = (-1,) + (1,) * (mod.weight.dim() - 1)
                mod.weight.div_(std.reshape(shape)); mod.bias.sub_(mean).div_(std)
        h = m.register_forward_hook(hook)
        with torch.no_grad():
            model(x)
        h.remove()


def strip_metadata(path, external_data):
    """Drop the dynamo exporter's per-node metadata (stack traces with this machine's paths, FX
    nodes, module names: ~15% of a small model's bytes); the graph itself is unchanged."""
    import onnx
    model = onnx.load(path)
    for node in model.graph.node:
        del node.metadata_props[:]
        node.doc_string = ""
    if external_data:
        onnx.save(model, path, save_as_external_data=True, location=os.path.basename(path) + ".data")
    else:
        onnx.save(model, path)


def export(name, out, exporters, external_data=False, keep_metadata=False, size=None):
    build, default_size, _ = ARCHS[name]
    stem = name if size in (None, default_size) else f"{name}.s{size}"   # a size of one's own: in the name
    size = size or default_size
    torch.manual_seed(0)
    model = build().eval()
    with torch.no_grad():
        randomize_norms(model)
    calibrate(model, size)
    x = torch.randn(1, 3, size, size)
    written = []
    for cfg in exporters:
        dynamo, opset = cfg.startswith("dy"), int(cfg[2:])
        path = os.path.join(out, f"{stem}.{cfg}.onnx")
        for p in (path, path + ".data"):
            if os.path.exists(p):
                os.remove(p)
        try:
            torch.onnx.export(model, (x,), path, opset_version=opset, dynamo=dynamo,
                              input_names=["input"], output_names=["output"],
                              **({"external_data": external_data} if dynamo else {}))
        except TypeError:   # an older torch without external_data=
            torch.onnx.export(model, (x,), path, opset_version=opset, dynamo=dynamo,
                              input_names=["input"], output_names=["output"])
        if dynamo and not keep_metadata:
            strip_metadata(path, external_data)
        total = sum(os.path.getsize(p) for p in (path, path + ".data") if os.path.exists(p))
        params = sum(p.numel() for p in model.parameters())
        print(f"{path}\t{total}\t{params}\tinput {size}", flush=True)
        written.append((path, total))
    return written


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("names", nargs="*")
    ap.add_argument("--exporters", default="ts17,dy18")
    ap.add_argument("--external-data", action="store_true",
                    help="let the dynamo exporter write its weights to NAME.onnx.data (its default) "
                         "instead of one self-contained file")
    ap.add_argument("--size", type=int, help="input size instead of each architecture's own (the file "
                    "is then NAME.sSIZE.CFG.onnx); e.g. vgg11_bn --exporters dy18 --size 64 gives the "
                    "dynamo exporter's GatherND/Where form of a 7x7 adaptive pool over a 2x2 map")
    ap.add_argument("--keep-metadata", action="store_true",
                    help="keep the dynamo exporter's per-node metadata (stack traces, module names)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for name in a.names or ARCHS:
        export(name, a.out, a.exporters.split(","), a.external_data, a.keep_metadata, a.size)
