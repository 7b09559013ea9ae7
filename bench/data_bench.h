#pragma once
// Throughput of the ImageNet input pipeline (datasets/stream_loader.h): JPEG decode + the training transform of the
// MoH-ViT recipe (RandomResizedCrop 224, flip, RandAugment rand-m9-mstd0.5-inc1, normalise, random erasing 0.25) and
// the evaluation transform (resize 256, centre crop 224, normalise), in images/s on one core (one loader thread,
// one intra-op thread) and on every core (one loader thread per core), on an ImageFolder tree: a given one
// (--root) or a generated ImageNet-like tree of JPEGs (sizes and file sizes of ImageNet's training images).
// With --python PY it runs bench/torchvision_data.py (torchvision ImageFolder + DataLoader with the equivalent
// transforms) on the same tree between its own measurements and prints the ratios.
namespace moh::bench {

/// `moh bench data [--root DIR] [--images N] [--workers W] [--batch B] [--python PY] [--keep DIR] [--json]`.
int data_bench_main(int argc, char** argv);

}  // namespace moh::bench
