#!/usr/bin/env python3
# The torchvision side of `moh bench data --python .venv/bin/python`: torchvision ImageFolder (PIL decode, RGB) and
# DataLoader with the transforms equivalent to the MoH-ViT / TransNeXt recipe, on the same tree and image count.
#   train: RandomResizedCrop(224, bicubic) -> RandomHorizontalFlip -> RandAugment(2 ops, magnitude 9) -> ToTensor ->
#          Normalize(ImageNet) -> RandomErasing(0.25, per-pixel normal values)
#   eval:  Resize(256, bicubic) -> CenterCrop(224) -> ToTensor -> Normalize
# (timm's rand-m9-mstd0.5-inc1 applies each of its 2 ops with p 0.5; torchvision's RandAugment always applies both, so
# the torchvision side does somewhat more augmentation work.) workers 0 = everything in this process on one thread.
# The second of two epochs is timed whole, with persistent workers (so starting the worker processes is not counted).
# Prints {"img_per_s": ...}.
import argparse, json, time
import torch
from torch.utils.data import DataLoader, Subset
from torchvision import datasets, transforms as T

p = argparse.ArgumentParser()
p.add_argument("--root", required=True)
p.add_argument("--mode", choices=["train", "eval"], default="train")
p.add_argument("--workers", type=int, default=0)
p.add_argument("--images", type=int, default=512)
p.add_argument("--batch", type=int, default=32)
a = p.parse_args()
torch.set_num_threads(1)
mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
bicubic = T.InterpolationMode.BICUBIC
if a.mode == "train":
    tf = T.Compose([T.RandomResizedCrop(224, interpolation=bicubic), T.RandomHorizontalFlip(),
                    T.RandAugment(num_ops=2, magnitude=9), T.ToTensor(), T.Normalize(mean, std),
                    T.RandomErasing(p=0.25, value="random")])
else:
    tf = T.Compose([T.Resize(256, interpolation=bicubic), T.CenterCrop(224), T.ToTensor(), T.Normalize(mean, std)])
ds = datasets.ImageFolder(a.root + "/train", transform=tf)
ds = Subset(ds, range(min(a.images, len(ds))))
loader = DataLoader(ds, batch_size=a.batch, shuffle=a.mode == "train", num_workers=a.workers, drop_last=True,
                    persistent_workers=a.workers > 0)
for x, y in loader:  # epoch 1: starts the workers
    pass
start, n = time.perf_counter(), 0
for x, y in loader:
    n += x.shape[0]
print(json.dumps({"img_per_s": n / (time.perf_counter() - start), "torch": torch.__version__}))
