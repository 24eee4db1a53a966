"""The models of examples/image_classification.py: torchvision's ResNet-18 and VGG-11
adapted to 32x32 inputs (see that file's docstring), with a width multiplier."""
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


def cifar_vgg11(num_classes=10, width=1.0, batch_norm=False):
    """torchvision's VGG-11 (configuration 'A') for 32x32: features down to 1x1, one
    Linear classifier (the usual CIFAR VGG), channels x width."""
    from torchvision.models.vgg import VGG, cfgs, make_layers
    cfg = [v if v == 'M' else max(1, int(round(v * width))) for v in cfgs['A']]
    m = VGG(make_layers(cfg, batch_norm=batch_norm), num_classes=num_classes)
    m.avgpool = torch.nn.Identity()
    m.classifier = torch.nn.Linear(cfg[-2], num_classes)
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


MODELS = {'resnet18': cifar_resnet18, 'vgg11': cifar_vgg11,
          'vgg11_bn': lambda num_classes, width: cifar_vgg11(num_classes, width, batch_norm=True),
          'vgg11_imagenet_head': imagenet_head_vgg11}
DEFAULT_LR = {'resnet18': 0.05, 'vgg11': 0.01, 'vgg11_bn': 0.05, 'vgg11_imagenet_head': 0.01}
