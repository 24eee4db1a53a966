"""The models of examples/image_classification.py: torchvision's ResNet-18 and VGG-11
adapted to 32x32 inputs (see that file's docstring), with a width multiplier.

Parameters at width 1 and 10 classes (tests/python/test_seed_data.py counts them):
  resnet18             11,173,962
  vgg11, vgg11_bn      28,144,010 / 28,149,514  (MXNet Gluon's vgg11 on 32x32 input)
  vgg11_linear          9,225,610  (one Linear(512, 10) classifier)
  vgg11_imagenet_head 128,807,306  (torchvision's 7x7-pooled ImageNet classifier)"""
import torch

def cifar_resnet18(num_classes=10, width=1.0):
    """torchvision's ResNet-18 for 32x32: 3x3 stride-1 stem, no max-pool, channels x width."""
    from torchvision.models.resnet import BasicBlock, ResNet

    def ch(c):
        return max(1, int(round(c * width)))

    class CifarResNet(ResNet):
        def _make_layer(self, block, planes, blocks, stride=1, dilate=False):
            if planes == 64:               # layer1: the stem's width decides inplanes
                self.inplanes = ch(64)
            return super()._make_layer(block, ch(planes), blocks, stride, dilate)

    m = CifarResNet(BasicBlock, [2, 2, 2, 2], num_classes=num_classes)
    m.conv1 = torch.nn.Conv2d(3, ch(64), 3, 1, 1, bias=False)
    torch.nn.init.kaiming_normal_(m.conv1.weight, mode='fan_out', nonlinearity='relu')
    m.bn1 = torch.nn.BatchNorm2d(ch(64))
    m.maxpool = torch.nn.Identity()
    m.fc = torch.nn.Linear(ch(512), num_classes)
    return m


def _vgg11_features(width, batch_norm):
    from torchvision.models.vgg import cfgs, make_layers
    cfg = [v if v == 'M' else max(1, int(round(v * width))) for v in cfgs['A']]
    return make_layers(cfg, batch_norm=batch_norm), cfg[-2]


def gluon_vgg11(num_classes=10, width=1.0, batch_norm=False):
    """MXNet Gluon's vgg11 (model_zoo.vision.vgg11) as it runs on 32x32 input: the
    eight 3x3 convolutions and five 2x2 pools end at 512x1x1, flattened into
    Dense(4096) -> ReLU -> Dropout -> Dense(4096) -> ReLU -> Dropout -> Dense(classes).
    28,144,010 parameters at width 1 (28,149,514 with batch norm), 112.6 MB of float32
    gradients a step; --width scales the channels and the 4096-wide layers.
    Convolutions are initialised as Gluon's (Xavier(gaussian, 'out', 2) = He normal
    over fan-out, zero biases); the dense layers keep PyTorch's default: Gluon's
    N(0, 0.01) left the narrow test widths (--width 0.125) at chance after 50 steps
    (loss 2.28, accuracy 0.12, against 0.08 and 0.73 with PyTorch's init)."""
    features, channels = _vgg11_features(width, batch_norm)
    hidden = max(1, int(round(4096 * width)))
    m = torch.nn.Sequential()
    m.features = features
    m.flatten = torch.nn.Flatten()   # 512 x 1 x 1 at 32x32 input (Gluon's Dense flattens)
    m.classifier = torch.nn.Sequential(
        torch.nn.Linear(channels, hidden), torch.nn.ReLU(True), torch.nn.Dropout(0.5),
        torch.nn.Linear(hidden, hidden), torch.nn.ReLU(True), torch.nn.Dropout(0.5),
        torch.nn.Linear(hidden, num_classes))
    for mod in m.features.modules():
        if isinstance(mod, torch.nn.Conv2d):
            torch.nn.init.kaiming_normal_(mod.weight, mode='fan_out', nonlinearity='relu')
            torch.nn.init.zeros_(mod.bias)
    return m


def linear_head_vgg11(num_classes=10, width=1.0):
    """VGG-11 for 32x32 with a single Linear(512, classes) classifier (the usual small
    CIFAR VGG; this example's vgg11 before it took Gluon's shape): 9,225,610
    parameters at width 1. Kept as vgg11_linear: the results in docs/performance.md and
    bench/results/ were measured on it."""
    from torchvision.models.vgg import VGG
    features, channels = _vgg11_features(width, False)
    m = VGG(features, num_classes=num_classes)
    m.avgpool = torch.nn.Identity()
    m.classifier = torch.nn.Linear(channels, num_classes)
    torch.nn.init.normal_(m.classifier.weight, 0, 0.01)
    torch.nn.init.zeros_(m.classifier.bias)
    return m


def imagenet_head_vgg11(num_classes=10, width=1.0):
    """torchvision's VGG-11 with its ImageNet classifier kept (7x7 adaptive pooling of
    the 1x1 map, 25088 -> 4096 -> 4096 -> classes): 129 M parameters, 515 MB of
    gradients a step at width 1 — the communication-heavy case of the seeds."""
    from torchvision.models.vgg import VGG, cfgs, make_layers
    cfg = [v if v == 'M' else max(1, int(round(v * width))) for v in cfgs['A']]
    m = VGG(make_layers(cfg), num_classes=num_classes)
    if width != 1.0:
        hidden = max(1, int(round(4096 * width)))
        m.classifier = torch.nn.Sequential(
            torch.nn.Linear(cfg[-2] * 49, hidden), torch.nn.ReLU(True), torch.nn.Dropout(),
            torch.nn.Linear(hidden, hidden), torch.nn.ReLU(True), torch.nn.Dropout(),
            torch.nn.Linear(hidden, num_classes))
    return m


MODELS = {'resnet18': cifar_resnet18, 'vgg11': gluon_vgg11,
          'vgg11_bn': lambda num_classes, width: gluon_vgg11(num_classes, width, batch_norm=True),
          'vgg11_linear': linear_head_vgg11, 'vgg11_imagenet_head': imagenet_head_vgg11}
# vgg11_bn: 0.05 made its dense head unstable (test accuracy 0.22-0.46 after 2 short
# epochs at width 0.125, 4 seeds); 0.02 reached 0.90-1.00.
DEFAULT_LR = {'resnet18': 0.05, 'vgg11': 0.01, 'vgg11_bn': 0.02, 'vgg11_linear': 0.01,
              'vgg11_imagenet_head': 0.01}
