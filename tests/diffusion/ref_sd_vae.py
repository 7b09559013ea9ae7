"""Reference for `moh forward --model sd-vae` / `vavae-f16d32`: the real `diffusers.AutoencoderKL` in the
sd-vae-ft-ema configuration (stabilityai/sd-vae-ft-ema config.json: kl-f8, 4 latent channels, block_out_channels
128/256/512/512, 2 layers per block, 32 groups, SiLU) or in VA-VAE's (hustvl/LightningDiT
tokenizer/configs/vavae_f16d32.yaml, an LDM AutoencoderKL: ch 128, ch_mult 1/1/2/2/4, 32 latent channels, attention
at the lowest resolution, which diffusers writes as AttnDownEncoderBlock2D / AttnUpDecoderBlock2D), random weights
(seeded; GroupNorm affines perturbed so that they matter), saved with the `safetensors` package under diffusers' own
state_dict names. VA-VAE is published under LDM names (encoder.down.4.attn.0.q.weight, a 1x1 conv): the same
weights are also written that way, as a torch.save checkpoint {"state_dict": ...} with a training-loss tensor beside
them, and the renaming is checked by diffusers' own LDM converter (convert_ldm_vae_checkpoint), which must give the
diffusers state_dict back exactly.

    python tests/diffusion/ref_sd_vae.py OUT_DIR [--vavae] [--widths 32,64,64,64]
      -> OUT_DIR/vae.safetensors (weights), OUT_DIR/io.safetensors (x, latent_mean, latent_logvar, recon),
         OUT_DIR/fp32_noise_floor.json (max rel error of diffusers' own fp32 outputs against fp64);
         with --vavae also OUT_DIR/vae_ldm.pt (the LDM-named checkpoint)

`--widths` gives the levels other widths (block_out_channels; the toolkit reads them from the file): a small VAE of
the same layout for tests that need the pipeline's shape, not the SD VAE's cost (tests/scale_check.sh).
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
VA_VAE_F16D32 = dict(
    in_channels=3, out_channels=3, latent_channels=32, sample_size=256, act_fn="silu", layers_per_block=2,
    norm_num_groups=32, block_out_channels=(128, 128, 256, 256, 512),
    down_block_types=("DownEncoderBlock2D",) * 4 + ("AttnDownEncoderBlock2D",),
    up_block_types=("AttnUpDecoderBlock2D",) + ("UpDecoderBlock2D",) * 4)


def ldm_name(name, levels):
    """diffusers name -> LDM name (written out here; checked against diffusers' converter below)."""
    side, rest = name.split(".", 1)
    if side not in ("encoder", "decoder"):
        return name
    parts = rest.split(".")
    leaf_resnet = {"conv_shortcut": "nin_shortcut"}
    leaf_attention = {"group_norm": "norm", "to_q": "q", "to_k": "k", "to_v": "v", "to_out": "proj_out"}

    def leaf(kind, tail):
        if kind == "attentions":
            head = leaf_attention[tail[0]]
            tail = tail[2:] if tail[0] == "to_out" else tail[1:]
            return ".".join([head] + tail)
        return ".".join([leaf_resnet.get(tail[0], tail[0])] + tail[1:])

    if parts[0] == "conv_norm_out":
        return f"{side}.norm_out.{'.'.join(parts[1:])}"
    if parts[0] == "mid_block":
        kind, i = parts[1], int(parts[2])
        block = {("resnets", 0): "block_1", ("resnets", 1): "block_2", ("attentions", 0): "attn_1"}[(kind, i)]
        return f"{side}.mid.{block}.{leaf(kind, parts[3:])}"
    if parts[0] in ("down_blocks", "up_blocks"):
        up = parts[0] == "up_blocks"
        level = levels - 1 - int(parts[1]) if up else int(parts[1])
        head = f"{side}.{'up' if up else 'down'}.{level}"
        if parts[2] in ("downsamplers", "upsamplers"):
            return f"{head}.{'upsample' if up else 'downsample'}.{'.'.join(parts[4:])}"
        kind = {"resnets": "block", "attentions": "attn"}[parts[2]]
        return f"{head}.{kind}.{parts[3]}.{leaf(parts[2], parts[4:])}"
    return name


def write_ldm_checkpoint(vae, config, path):
    """The weights under LDM names (attention projections as 1x1 convs), as VA-VAE's release stores them."""
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint
    levels = len(config["block_out_channels"])
    state = vae.state_dict()
    ldm = {}
    for k, v in state.items():
        is_attention = ".attentions." in k and k.endswith(".weight") and v.dim() == 2
        ldm[ldm_name(k, levels)] = v.reshape(*v.shape, 1, 1) if is_attention else v
    back = convert_ldm_vae_checkpoint({f"first_stage_model.{k}": v for k, v in ldm.items()}, dict(config))
    # diffusers' converter knows the SD layout: it renames every tensor but the attentions inside the levels
    # (down.4.attn.*, up.4.attn.*), which it passes through under their LDM names. Those use the mid-block
    # attention's leaf names and the levels' numbering, both of which it does check.
    level_attention = {k for k in state if ".attentions." in k and "mid_block" not in k}
    assert set(back) == (set(state) - level_attention) | {ldm_name(k, levels) for k in level_attention}, \
        f"diffusers' converter: {sorted(set(back) ^ set(state))[:6]}"
    for k in set(state) - level_attention:
        assert torch.equal(back[k].reshape(state[k].shape), state[k]), f"diffusers' converter: {k} differs"
    ldm["loss.logvar"] = torch.zeros(())  # a training-only tensor, as in VA-VAE's checkpoint
    torch.save({"state_dict": ldm, "global_step": 5}, path)


def main(out, vavae=False, widths=None):
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)  # threads: OMP_NUM_THREADS, as `moh forward` (tests/pyref_test.sh sets 1)
    config = dict(VA_VAE_F16D32 if vavae else SD_VAE_FT_EMA)
    if widths:
        assert len(widths) == len(config["block_out_channels"]), "one width per level"
        config["block_out_channels"] = tuple(widths)
    vae = AutoencoderKL(**config).eval()
    with torch.no_grad():
        for m in vae.modules():
            if isinstance(m, torch.nn.GroupNorm):
                m.weight.normal_(1.0, 0.2)
                m.bias.normal_(0.0, 0.2)
    if not widths:
        assert sum(p.numel() for p in vae.parameters()) == (69_836_067 if vavae else 83_653_863)
    save_file({k: v.contiguous() for k, v in vae.state_dict().items()}, os.path.join(out, "vae.safetensors"))
    if vavae:
        write_ldm_checkpoint(vae, config, os.path.join(out, "vae_ldm.pt"))
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
    args = sys.argv[2:]
    main(sys.argv[1], "--vavae" in args,
         [int(w) for w in args[args.index("--widths") + 1].split(",")] if "--widths" in args else None)
