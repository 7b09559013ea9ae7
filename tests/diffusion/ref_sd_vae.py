"""Reference for `moh forward --model sd-vae`: the real `diffusers.AutoencoderKL` in the sd-vae-ft-ema configuration
(stabilityai/sd-vae-ft-ema config.json: kl-f8, 4 latent channels, block_out_channels 128/256/512/512, 2 layers per
block, 32 groups, SiLU), random weights (seeded; GroupNorm affines perturbed so that they matter), saved with the
`safetensors` package under diffusers' own state_dict names.

    python tests/diffusion/ref_sd_vae.py OUT_DIR
      -> OUT_DIR/vae.safetensors (weights), OUT_DIR/io.safetensors (x, latent_mean, latent_logvar, recon),
         OUT_DIR/fp32_noise_floor.json (max rel error of diffusers' own fp32 outputs against fp64)

`recon` is the decode of the posterior mean, as `moh forward` computes it. Run by tests/pyref_test.sh (ctest pyref_vae).
"""
import json
import os
import sys

import torch
from diffusers import AutoencoderKL
from safetensors.torch import save_file

SD_VAE_FT_EMA = dict(
    in_channels=3, out_channels=3, latent_channels=4, sample_size=256, act_fn="silu", layers_per_block=2,
    norm_num_groups=32, block_out_channels=(128, 256, 512, 512),
    down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4)


def main(out):
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)  # threads: OMP_NUM_THREADS, as `moh forward` (tests/pyref_test.sh sets 1)
    vae = AutoencoderKL(**SD_VAE_FT_EMA).eval()
    with torch.no_grad():
        for m in vae.modules():
            if isinstance(m, torch.nn.GroupNorm):
                m.weight.normal_(1.0, 0.2)
                m.bias.normal_(0.0, 0.2)
    assert sum(p.numel() for p in vae.parameters()) == 83_653_863
    save_file({k: v.contiguous() for k, v in vae.state_dict().items()}, os.path.join(out, "vae.safetensors"))
    x = torch.rand(2, 3, 48, 64, generator=torch.Generator().manual_seed(1)) * 2 - 1
    with torch.no_grad():
        post = vae.encode(x).latent_dist
        recon = vae.decode(post.mean).sample
    io = {"x": x, "latent_mean": post.mean, "latent_logvar": post.logvar, "recon": recon}
    save_file({k: v.contiguous() for k, v in io.items()}, os.path.join(out, "io.safetensors"))
    # The fp32 noise floor of this network at this input: diffusers in fp32 vs fp64 (max rel error, as the check).
    # Another LibTorch version (Debian's 1.13 against this torch) rounds its kernels differently, so its distance
    # to the fp32 reference can only be expected within a small multiple of this floor.
    vae.double()
    with torch.no_grad():
        post64 = vae.encode(x.double()).latent_dist
        ref64 = {"latent_mean": post64.mean, "latent_logvar": post64.logvar, "recon": vae.decode(post64.mean).sample}
    floor = {k: float((io[k].double() - v).abs().max() / v.abs().max()) for k, v in ref64.items()}
    with open(os.path.join(out, "fp32_noise_floor.json"), "w") as f:
        json.dump(floor, f)
    import diffusers
    print(f"diffusers {diffusers.__version__}, torch {torch.__version__}: latent {tuple(post.mean.shape)}, "
          f"|recon| max {recon.abs().max():.3g}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1])
