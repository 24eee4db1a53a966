#!/usr/bin/python3
"""image_classification.py: the seeds' CIFAR-10 job (VGG-11, ResNet-18) with pskv.torch.

    PYTHONPATH=build/python build/pskv-launch -n 2 -s 1 -- /usr/bin/python3 \\
        examples/image_classification.py --dataset cifar10 --model resnet18 --epochs 1 \\
        --kvstore dist_sync --stand-in fashion-mnist

MXNet's command line (example/image-classification/train_cifar10.py and the seed's
`--dataset cifar10 --model vgg11 --epochs 1 --kvstore dist_sync`): --kv-store and
--kvstore, --num-epochs and --epochs, --batch-size (per worker), --lr, --data-dir.
--gpus 0,2 trains one model replica per device on b/k of each batch (MXNet's ctx list);
this build's tensors are CPU tensors, staged to the devices: PSKV_SIM_DEVICES=k runs it on
simulated devices.

Models, adapted to 32x32 inputs: resnet18 is torchvision's ResNet-18 with a 3x3
stride-1 stem and no max-pool (the last stage sees 4x4), 11.2 M parameters; vgg11 /
vgg11_bn are MXNet Gluon's vgg11 as it runs on CIFAR: the five pools bring 32x32 to
512x1x1, flattened into Dense(4096), Dense(4096), Dense(10): 28.1 M parameters, 113 MB
of gradients a step (examples/cifar_models.py). --width scales every layer (tests use
small widths). vgg11_linear has one Linear(512, 10) classifier (9.2 M, what
docs/performance.md measured as vgg11); vgg11_imagenet_head keeps torchvision's 7x7
ImageNet classifier (129 M parameters, 515 MB of gradients a step).

Data (3x32x32, 10 classes):
  * cifar10: CIFAR-10's binary version (data_batch_1.bin ... data_batch_5.bin,
    test_batch.bin), read from --data-dir or its cifar-10-batches-bin/ folder. Nothing
    is downloaded; without the files this says which are missing, unless --stand-in
    names a stand-in to use instead (and says so).
  * cifar10-png: the d2l / Kaggle layout in --data-dir: train/<id>.png and
    trainLabels.csv (id,label with class names, numbered in sorted order); a tenth of
    each class is held out for the test accuracy (d2l's valid split).
  * --data-train X.rec [--data-val Y.rec]: MXNet RecordIO image files (im2rec's;
    X.idx beside X.rec is used when present), 32x32 JPEG/PNG images, labels 0..9,
    read with pskv.recordio; without --data-val the test accuracy is on the training
    images.
  * fashion-mnist: Debian's dataset-fashion-mnist (scripts/install-deps.sh --with-data),
    each 28x28 image padded to 32x32 and repeated over 3 channels.
  * --synthetic: random images whose class shifts their mean (learnable, no files).

Training: pskv.torch.Trainer (SGD with momentum on the servers, gradients pushed from
backward hooks) and pskv.torch.Sampler (each worker its part, the same number of
batches everywhere). --ddp trains the same model with torch.distributed's
DistributedDataParallel over gloo instead, for side-by-side samples/s: ranks come from
torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) or, under
pskv-launch, from the pskv job (rank 0 publishes its address and a free port through
the store). Rank 0 prints samples/s (all workers together; in JSON also
steady_samples_per_sec, without the first --warmup batches), loss and accuracy after
every epoch, one JSON line each with --json. During an epoch it prints MXNet's
Speedometer line every --disp-batches batches (default 20; 0: none):
`Epoch[0] Batch [20-40/468]  Speed: 812.50 samples/sec  loss=1.9 accuracy=0.31  570 s left
in the epoch`, and during evaluation a line every 10 s and the validation accuracy.
"""
import argparse
import copy
import json
import os
import socket
import struct
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # its data and models beside it
from cifar_data import (CIFAR_TEST, CIFAR_TRAIN, FMNIST_DIR, STATS, Batches, DataError,  # noqa: E402,F401
                        channel_stats, cifar_dir, read_cifar10, read_cifar_file, read_fashion_mnist,
                        read_png_folder, read_recordio, synthetic)
from cifar_models import DEFAULT_LR, MODELS  # noqa: E402


# ---------------------------------------------------------------------------- DDP

def _local_address(peer):
    """The local IPv4 address that routes to `peer` (no packet is sent)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect((peer, 9))
        return s.getsockname()[0]
    finally:
        s.close()


def _interface_of(addr):
    """The name of the interface holding IPv4 `addr` (for GLOO_SOCKET_IFNAME), or None."""
    import fcntl
    for _, name in socket.if_nameindex():
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            req = struct.pack('256s', name.encode()[:15])
            got = socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, req)[20:24])   # SIOCGIFADDR
        except OSError:
            continue
        finally:
            s.close()
        if got == addr:
            return name
    return None


def ddp_rendezvous():
    """(rank, world_size, kv or None): torchrun's environment, else the pskv job's.

    Under pskv-launch the workers join the pskv job (its store), rank 0 broadcasts its
    address and a free port through it, and torch.distributed's gloo group is made on
    them; the address is the one routing to the scheduler (DMLC_INTERFACE's if set), so
    this works on loopback and across hosts."""
    import torch.distributed as dist
    if 'RANK' in os.environ and 'WORLD_SIZE' in os.environ:
        rank, world = int(os.environ['RANK']), int(os.environ['WORLD_SIZE'])
        dist.init_process_group('gloo', rank=rank, world_size=world)
        return rank, world, None
    if not os.environ.get('DMLC_ROLE'):
        raise SystemExit('--ddp needs a launcher: torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) or '
                         'pskv-launch (DMLC_*)')
    import pskv
    pskv.configure_process(tune_allocator=True)  # PSKV_* logging/metrics; allocator for big tensors
    kv = pskv.create('dist_sync')      # a server/scheduler process never returns from here
    rank, world = kv.rank, kv.num_workers
    iface = os.environ.get('DMLC_INTERFACE')
    addr = _local_address(os.environ.get('DMLC_PS_ROOT_URI', '127.0.0.1'))
    mine = np.zeros(5, np.float64)
    if rank == 0:
        with socket.socket() as s:     # a free port (a race with other jobs is unlikely)
            s.bind((addr, 0))
            port = s.getsockname()[1]
        mine[:4] = [int(b) for b in addr.split('.')]
        mine[4] = port
    got = np.zeros(5, np.float64)
    kv.broadcast('ddp_rendezvous', mine, out=got)
    master = '.'.join(str(int(b)) for b in got[:4])
    os.environ.setdefault('GLOO_SOCKET_IFNAME', iface or _interface_of(addr) or 'lo')
    dist.init_process_group('gloo', init_method='tcp://%s:%d' % (master, int(got[4])), rank=rank,
                            world_size=world)
    return rank, world, kv


# ---------------------------------------------------------------------------- main

def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--dataset', default='cifar10', choices=['cifar10', 'cifar10-png', 'fashion-mnist'])
    ap.add_argument('--synthetic', action='store_true', help='random CIFAR-shaped data, no files')
    ap.add_argument('--stand-in', default='none', choices=['none', 'fashion-mnist', 'synthetic'],
                    help='with --dataset cifar10: what to train on when the CIFAR-10 files are absent')
    ap.add_argument('--data-dir', default=os.path.expanduser('~/.pskv/cifar10'),
                    help='CIFAR-10 binary files, or train/ + trainLabels.csv with --dataset cifar10-png '
                         '(default %(default)s)')
    ap.add_argument('--data-train', default=None, help='an MXNet RecordIO file (.rec) to train on')
    ap.add_argument('--data-val', default=None, help='with --data-train: the RecordIO file to test on')
    ap.add_argument('--fmnist-dir', default=FMNIST_DIR)
    ap.add_argument('--model', '--network', dest='model', default='resnet18', choices=sorted(MODELS))
    ap.add_argument('--width', type=float, default=1.0, help='channel multiplier (default 1)')
    ap.add_argument('--kvstore', '--kv-store', dest='kvstore', default='local')
    ap.add_argument('--epochs', '--num-epochs', dest='epochs', type=int, default=1)
    ap.add_argument('--batch-size', type=int, default=64, help='per worker (default 64)')
    ap.add_argument('--lr', type=float, default=None,
                    help='learning rate (default 0.05; 0.02 for vgg11_bn, 0.01 for the VGGs without batch norm)')
    ap.add_argument('--mom', '--momentum', dest='mom', type=float, default=0.9)
    ap.add_argument('--wd', type=float, default=5e-4)
    ap.add_argument('--max-batches', type=int, default=0, help='batches per epoch at most (0: all)')
    ap.add_argument('--train-samples', type=int, default=0, help='use only the first N training images')
    ap.add_argument('--test-samples', type=int, default=0, help='evaluate on the first N test images')
    ap.add_argument('--warmup', type=int, default=2,
                    help='batches left out of steady_samples_per_sec (default 2)')
    ap.add_argument('--seed', type=int, default=42)
    ap.add_argument('--threads', type=int, default=0, help='torch threads (default: cores / workers)')
    ap.add_argument('--ddp', action='store_true', help='torch DistributedDataParallel over gloo instead of pskv')
    ap.add_argument('--json', action='store_true', help='one JSON line per epoch (rank 0)')
    ap.add_argument('--disp-batches', type=int, default=20,
                    help="MXNet's: a progress line every N batches (rank 0: samples/s, loss and accuracy so "
                    "far, time left); 0: none (default 20)")
    ap.add_argument('--gpus', default=None,
                    help="MXNet's device list, e.g. 0,2: one model replica per device, each on its part "
                         'of the batch (b/k); this build has CPU tensors, staged to the devices '
                         '(simulated ones: PSKV_SIM_DEVICES=k)')
    args = ap.parse_args(argv)
    devices = None
    if args.gpus is not None:
        try:
            devices = ['cuda:%d' % int(g) for g in args.gpus.split(',')]
        except ValueError:
            ap.error('--gpus %s: give device numbers, e.g. --gpus 0,2' % args.gpus)
        if args.ddp:
            ap.error('--gpus goes with pskv (not --ddp)')
        import pskv
        have = pskv.cuda.device_count()
        if max(int(d[5:]) for d in devices) >= have:
            ap.error('--gpus %s: %s. Without a GPU, simulate devices: PSKV_SIM_DEVICES=%d'
                     % (args.gpus, pskv.cuda.status(), len(devices)))
    args.devices = devices
    if args.stand_in != 'none' and args.dataset != 'cifar10':
        ap.error('--stand-in is for --dataset cifar10')
    if args.data_val and not args.data_train:
        ap.error('--data-val needs --data-train (RecordIO files)')
    if args.disp_batches < 0:
        ap.error('--disp-batches must be 0 (no progress lines) or more')
    for name in ('epochs', 'batch_size'):
        if getattr(args, name) < 1:
            ap.error('--%s must be at least 1' % name.replace('_', '-'))
    if args.width <= 0:
        ap.error('--width must be positive')
    if args.lr is None:
        args.lr = DEFAULT_LR[args.model]
    return args


def load(args, log):
    """((x_train, y_train), (x_test, y_test), name) of the chosen data."""
    # synthetic data: only as many images as will be used
    syn = dict(n_train=args.train_samples or 50000, n_test=args.test_samples or 10000, seed=args.seed)
    if args.synthetic:
        return synthetic(**syn) + ('synthetic',)
    if args.data_train:
        train = read_recordio(args.data_train)
        if not args.data_val:
            log('no --data-val: the test accuracy is on the training images')
        test = read_recordio(args.data_val) if args.data_val else train
        STATS['recordio'] = channel_stats(train[0])
        return train, test, 'recordio'
    if args.dataset == 'cifar10-png':
        train, test, _ = read_png_folder(args.data_dir)
        return train, test, 'cifar10-png'
    if args.dataset == 'fashion-mnist':
        return read_fashion_mnist(args.fmnist_dir) + ('fashion-mnist',)
    if cifar_dir(args.data_dir) is None and args.stand_in != 'none':
        log('CIFAR-10 files not in %s: training on the %s stand-in (3x32x32, 10 classes)'
            % (args.data_dir, args.stand_in))
        if args.stand_in == 'synthetic':
            return synthetic(**syn) + ('synthetic',)
        return read_fashion_mnist(args.fmnist_dir) + ('fashion-mnist',)
    return read_cifar10(args.data_dir) + ('cifar10',)


def main(argv=None):
    args = parse_args(argv)
    if args.ddp:
        rank, nw, kv = ddp_rendezvous()
    else:
        import pskv
        import pskv.torch
        pskv.configure_process(tune_allocator=True)  # PSKV_* logging/metrics; allocator for big tensors
        kv = pskv.create(args.kvstore)     # a server/scheduler process never returns from here
        rank, nw = kv.rank, kv.num_workers

    def log(msg):
        if rank == 0:
            print(msg, flush=True)

    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // nw))
    torch.manual_seed(args.seed)
    try:
        (x_train, y_train), (x_test, y_test), data_name = load(args, log)
    except DataError as e:
        print('image_classification.py: error: %s' % e, file=sys.stderr, flush=True)
        return 2
    if args.train_samples:
        x_train, y_train = x_train[:args.train_samples], y_train[:args.train_samples]
    if args.test_samples:
        x_test, y_test = x_test[:args.test_samples], y_test[:args.test_samples]
    train_set = Batches(x_train, y_train, *STATS[data_name])
    test_set = Batches(x_test, y_test, *STATS[data_name])

    model = MODELS[args.model](num_classes=10, width=args.width)
    params = sum(p.numel() for p in model.parameters())
    if args.ddp:
        model = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.mom, weight_decay=args.wd)
        step = opt.step
        zero = opt.zero_grad
        mode = 'ddp-gloo'
    else:
        # mean loss per worker; the Trainer averages over workers, as DDP does
        # --gpus: one replica per device (MXNet's ctx list), each on b/k of the batch
        replicas = [model] + [copy.deepcopy(model) for _ in (args.devices or [])[1:]]
        trainer = pskv.torch.Trainer(replicas if args.devices else model,
                                     pskv.optimizer.SGD(learning_rate=args.lr, momentum=args.mom, wd=args.wd), kv,
                                     loss_reduction='mean', push_in_backward=not args.devices,
                                     devices=args.devices)
        step, zero, mode = trainer.step, (lambda: None), 'pskv-' + kv.type
        if args.devices:
            log('replicas on %s (%s)' % (', '.join(args.devices), pskv.cuda.status()))
    log('%s on %s: %s (%.2f M parameters, width %g), %d workers x batch %d, lr %g, %d training images'
        % (mode, data_name, args.model, params / 1e6, args.width, nw, args.batch_size, args.lr, len(train_set)))

    import pskv.torch as ptorch     # the Sampler is pskv's in both modes (same data per worker)
    sampler = ptorch.Sampler(len(train_set), args.batch_size, num_parts=nw, part_index=rank, seed=args.seed)
    if args.max_batches:
        sampler.epoch_size = min(sampler.epoch_size, args.max_batches)
    loader = torch.utils.data.DataLoader(
        train_set, sampler=torch.utils.data.BatchSampler(sampler, args.batch_size, drop_last=False),
        batch_size=None)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        t0, loss_sum, correct, seen, first_loss = time.time(), 0.0, 0, 0, None
        t_warm, seen_warm = None, 0
        disp_t, disp_seen = t0, 0
        for b, (x, y) in enumerate(loader):
            zero()
            if args.devices and not args.ddp:  # each replica on its part of the batch
                parts = torch.tensor_split(torch.arange(len(y)), len(replicas))
                outs = [r(x[i]) for r, i in zip(replicas, parts)]
                for o, i in zip(outs, parts):
                    torch.nn.functional.cross_entropy(o, y[i]).backward()
                out = torch.cat(outs)
                loss = torch.nn.functional.cross_entropy(out.detach(), y)
            else:
                out = model(x)
                loss = torch.nn.functional.cross_entropy(out, y)
                loss.backward()
            step()
            loss_sum += loss.item() * len(y)
            correct += int((out.argmax(1) == y).sum())
            seen += len(y)
            if first_loss is None:
                first_loss = loss.item()
            if b + 1 == args.warmup:
                t_warm, seen_warm = time.time(), seen
            if args.disp_batches and (b + 1) % args.disp_batches == 0:
                # MXNet's Speedometer: samples/s of the whole job since the last line
                # (every worker runs the same number of batches), the epoch's loss and
                # accuracy so far on this worker, and the time the epoch still needs.
                now = time.time()
                speed = (seen - disp_seen) * nw / max(now - disp_t, 1e-9)
                left = (sampler.epoch_size - b - 1) * (now - t0) / (b + 1)
                log('Epoch[%d] Batch [%d-%d/%d]\tSpeed: %.2f samples/sec\tloss=%.4f\taccuracy=%.4f\t'
                    '%.0f s left in the epoch' % (epoch, b + 1 - args.disp_batches, b + 1, sampler.epoch_size,
                                                  speed, loss_sum / seen, correct / seen, left))
                disp_t, disp_seen = now, seen
        secs = time.time() - t0
        steady = (seen - seen_warm) * nw / (t0 + secs - t_warm) if t_warm and seen > seen_warm else None
        net = model.module if args.ddp else model   # rank 0 alone: no DDP collective in forward
        net.eval()
        test_correct = 0
        if rank == 0:
            t_eval = last = time.time()
            log('Epoch[%d] evaluating on %d test images' % (epoch, len(test_set)))
            with torch.no_grad():
                for i in range(0, len(test_set), 500):
                    end = min(i + 500, len(test_set))
                    x, y = test_set[np.arange(i, end)]
                    test_correct += int((net(x).argmax(1) == y).sum())
                    if time.time() - last >= 10 and end < len(test_set):   # a line every 10 s at most
                        last = time.time()
                        log('Epoch[%d] evaluated %d/%d test images, accuracy so far %.4f, %.0f s'
                            % (epoch, end, len(test_set), test_correct / end, last - t_eval))
            log('Epoch[%d] Validation-accuracy=%.4f (%d images, %.1f s)'
                % (epoch, test_correct / len(test_set), len(test_set), time.time() - t_eval))
        rec = {'epoch': epoch + 1, 'mode': mode, 'model': args.model, 'width': args.width, 'data': data_name,
               'workers': nw, 'batch_size': args.batch_size, 'batches': sampler.epoch_size,
               'samples_per_sec': seen * nw / secs, 'steady_samples_per_sec': steady, 'seconds': secs, 'first_loss': first_loss,
               'train_loss': loss_sum / seen, 'train_accuracy': correct / seen,
               'test_accuracy': test_correct / len(test_set), 'parameters': params}
        if args.json:
            log(json.dumps(rec))
        else:
            log('epoch %d: %.1f samples/s (%d workers), train loss %.4f (first batch %.4f), train accuracy %.4f, '
                'test accuracy %.4f, %.1f s' % (epoch + 1, rec['samples_per_sec'], nw, rec['train_loss'],
                                                first_loss, rec['train_accuracy'], rec['test_accuracy'], secs))
    if args.ddp:
        import torch.distributed as dist
        dist.barrier()
        dist.destroy_process_group()
    if kv is not None and kv.type.startswith('dist'):
        kv.barrier()
    return 0


if __name__ == '__main__':
    sys.exit(main())
