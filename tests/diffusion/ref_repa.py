"""References of REPA (tests/pyref_test.sh repa → the GoogleTest RepaReference.*).

Writes into DIR:
  repa.safetensors  random projections zs_e / targets tgt_e (fp64, one row of zeros) and REPA's projection loss on
                    them, written out from sihyun-yu/REPA loss.py (F.normalize over channels, −(z·z̃) summed over
                    channels, mean over tokens, summed over samples and encoders, divided by encoders × batch);
                    images in [−1, 1] and the targets of REPA's preprocess_raw_image + timm's DINOv2 on them;
                    timm's parameter count
  dinov2_timm.safetensors   timm's vit_base_patch14_dinov2 with random weights (LayerScale included)
  dinov2_official.pth       the same weights as facebookresearch/dinov2 saves them (plus its mask_token)
  images_98 / feats_98, images_224 / feats_224: ImageNet-normalised inputs and timm's final-norm patch tokens
    (forward_features()[:, 1:], positions resampled to the grid by timm's dynamic_img_size);
  official_98 / official_224: the same network with the positions resampled as facebookresearch/dinov2's
    interpolate_pos_encoding does for its torch.hub models (F.interpolate bicubic by scale factor (g + 0.1) / 37,
    no antialiasing), written out here and given to timm's model built for that image size: all tokens after the
    final norm (class token first);
  timm_params_large: timm's vit_large_patch14_dinov2 parameter count (FD-DINOv2's network);
  fd_images / fd_cls: uint8 grey images and the features EDM2's calculate_metrics.py DINOv2Detector (resize mode
    "torch") takes from them, written out: grey to RGB, F.interpolate bicubic antialiased to 224 on the 0-255 values,
    /255, ImageNet normalisation, the official model's output (the final-norm class token) — here of the official
    file's network.
"""
import os
import sys

import timm
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def repa_projection_loss(zs, zs_tilde):
    """REPA loss.py's proj_loss, in its own loop structure."""
    proj_loss = 0.0
    bsz = zs[0].shape[0]
    for z, z_tilde in zip(zs, zs_tilde):
        for z_j, z_tilde_j in zip(z, z_tilde):
            z_tilde_j = F.normalize(z_tilde_j, dim=-1)
            z_j = F.normalize(z_j, dim=-1)
            proj_loss = proj_loss + (-(z_j * z_tilde_j).sum(dim=-1)).mean()
    return proj_loss / (len(zs) * bsz)


def randomized_dinov2():
    torch.manual_seed(3)
    model = timm.create_model("vit_base_patch14_dinov2", pretrained=False, dynamic_img_size=True)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("gamma"):
                p.uniform_(0.2, 1.0)  # LayerScale's 1e-5 init would hide the blocks
            elif name.endswith("weight") and p.dim() == 1:
                p.normal_(1.0, 0.2)  # LayerNorm scales
            elif p.dim() == 1:
                p.normal_(0.0, 0.1)  # biases
            else:
                p.normal_(0.0, 0.05)
    return model.eval()


def official_positions(pos_embed, grid):
    """facebookresearch/dinov2 interpolate_pos_encoding (interpolate_offset 0.1, interpolate_antialias False)."""
    m = int(round((pos_embed.shape[1] - 1) ** 0.5))
    table = pos_embed[:, 1:].float().reshape(1, m, m, -1).permute(0, 3, 1, 2)
    scale = (grid + 0.1) / m
    table = F.interpolate(table, mode="bicubic", antialias=False, scale_factor=(scale, scale))
    assert table.shape[-2:] == (grid, grid)
    return torch.cat([pos_embed[:, :1], table.permute(0, 2, 3, 1).reshape(1, grid * grid, -1)], dim=1)


def official_tokens(sd, x):
    grid = x.shape[-1] // 14
    fixed = timm.create_model("vit_base_patch14_dinov2", pretrained=False, img_size=x.shape[-1])
    weights = dict(sd)
    weights["pos_embed"] = official_positions(sd["pos_embed"], grid)
    fixed.load_state_dict(weights)
    return fixed.eval().forward_features(x)


def main(out):
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    t = {}
    zs = [torch.randn(3, 5, 7, dtype=torch.float64), torch.randn(3, 5, 4, dtype=torch.float64)]
    tgt = [torch.randn(3, 5, 7, dtype=torch.float64), torch.randn(3, 5, 4, dtype=torch.float64)]
    zs[0][1, 2].zero_()  # F.normalize's eps: a zero row counts as cosine 0
    for e in range(2):
        t[f"zs_{e}"], t[f"tgt_{e}"] = zs[e], tgt[e]
    t["loss"] = repa_projection_loss(tgt, zs).reshape(1)
    t["loss_single"] = repa_projection_loss(tgt[:1], zs[:1]).reshape(1)

    model = randomized_dinov2()
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(sd, f"{out}/dinov2_timm.safetensors")
    official = dict(sd)
    official["mask_token"] = torch.randn(1, 768)
    torch.save(official, f"{out}/dinov2_official.pth")
    t["timm_params"] = torch.tensor([sum(p.numel() for p in model.parameters())], dtype=torch.int64)
    large = timm.create_model("vit_large_patch14_dinov2", pretrained=False)
    t["timm_params_large"] = torch.tensor([sum(p.numel() for p in large.parameters())], dtype=torch.int64)
    del large
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    with torch.no_grad():
        for side in (98, 224):
            x = (torch.rand(2, 3, side, side) - mean) / std
            t[f"images_{side}"] = x
            t[f"feats_{side}"] = model.forward_features(x)[:, 1:]
            t[f"official_{side}"] = official_tokens(sd, x)
        # REPA's preprocess_raw_image on grey DiT inputs in [−1, 1] (28 px, 7×7 tokens → 98 px).
        grey = torch.rand(2, 1, 28, 28) * 2 - 1
        x = ((grey + 1) / 2).expand(-1, 3, -1, -1)
        x = (x - mean) / std
        x = F.interpolate(x, 98, mode="bicubic")
        fd = torch.randint(0, 256, (2, 28, 28, 1), dtype=torch.uint8)
        fx = fd.permute(0, 3, 1, 2).expand(-1, 3, -1, -1).to(torch.float32)
        fx = F.interpolate(fx, size=(224, 224), mode="bicubic", antialias=True) / 255
        t["fd_images"] = fd
        t["fd_cls"] = official_tokens(sd, (fx - mean) / std)[:, 0]
        t["repa_images"] = grey
        t["repa_targets"] = model.forward_features(x)[:, 1:]
    save_file({k: v.contiguous() for k, v in t.items()}, f"{out}/repa.safetensors")
    print("REPA loss (2 encoders):", float(t["loss"]), "timm ViT-B/14 parameters:", int(t["timm_params"]))


if __name__ == "__main__":
    main(sys.argv[1])
