"""How visible a patch grid is in generated images: the mean absolute step between neighbouring pixels across a
p-pixel grid line (between column/row j and j + 1 with j mod p = p - 1), divided by the mean step everywhere else.
About 1 for real images (Fashion-MNIST's test set: 1.04 at p = 4, 0.97 at p = 2); above 1 when the patches of a
pixel-space DiT meet at visible seams. Samples: `moh sample`'s samples.npz (N, H, W, C uint8); --fashion-mnist
measures the embedded test set instead.

    python studies/patch_seams.py --patch 4 runs/demo/samples/samples.npz
"""
import argparse
import gzip

import numpy as np

FASHION_MNIST_TEST = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"


def seam_ratio(images, patch):
    """images (N, H, W) float; returns (mean step across grid lines, mean step elsewhere, their ratio)"""
    dx = np.abs(np.diff(images, axis=2))  # (N, H, W - 1): step between column j and j + 1
    dy = np.abs(np.diff(images, axis=1))  # (N, H - 1, W)
    on_x = np.arange(images.shape[2] - 1) % patch == patch - 1
    on_y = np.arange(images.shape[1] - 1) % patch == patch - 1
    border = (dx[:, :, on_x].mean() + dy[:, on_y, :].mean()) / 2
    inside = (dx[:, :, ~on_x].mean() + dy[:, ~on_y, :].mean()) / 2
    return border, inside, border / inside


def load(path):
    """(N, H, W) float64 grey values of a samples.npz (first array; channels averaged)"""
    with np.load(path) as z:
        a = z[z.files[0]].astype(np.float64)
    return a.mean(-1) if a.ndim == 4 else a


def fashion_mnist_test():
    with gzip.open(FASHION_MNIST_TEST) as f:
        raw = f.read()
    return np.frombuffer(raw[16:], np.uint8).reshape(-1, 28, 28).astype(np.float64)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--patch", type=int, default=4, help="grid spacing in pixels (the model's patch size)")
    ap.add_argument("--fashion-mnist", action="store_true", help="also measure the embedded test set")
    ap.add_argument("samples", nargs="*", help="samples.npz files")
    args = ap.parse_args()
    sets = [("fashion-mnist test", fashion_mnist_test())] if args.fashion_mnist else []
    sets += [(p, load(p)) for p in args.samples]
    for name, images in sets:
        border, inside, ratio = seam_ratio(images, args.patch)
        print(f"{name}: p {args.patch}, N {len(images)}, step across grid lines {border:.2f}, "
              f"elsewhere {inside:.2f}, ratio {ratio:.3f}")


if __name__ == "__main__":
    main()
