"""Drop-in attention modules over torch.ops.moh, with the official modules' constructors, attribute names and
state_dict keys, so that an official model's attention is swapped in place (`from_module`, `swap_attention`):

    MoHAttention         MoH-DiT's MoHAttention (SkyworkAI/MoH MoH-DiT/models.py) and timm's Attention (plain MHA)
    TransNeXtAttention   MoH-ViT's full attention of stage 4 (MoH-ViT/attention.py: cosine scores, query embedding,
                         length-scaled temperature, CPB bias)
    AggregatedAttention  MoH-ViT's aggregated attention of stages 1-3 (MoH-ViT/attention_native.py); its 3x3 window and
                         pooled keys stay PyTorch code, its router and head gates are the ops
    DiTBlock             DiT's adaLN-Zero block on the fused block ops (LayerNorm + modulate, gate + residual,
                         bias + GELU) around a MoHAttention

A swapped module holds the official module's own Parameter and buffer objects (no copies): an optimizer, an EMA copy or
a DDP wrapper built before the swap trains the swapped model, and requires_grad stays as it was. Routed layers append
their load-balance loss in training to the list the official training loop sums (`load_balancing_losses`): the
official module class's LOAD_BALANCING_LOSSES, or that of the one class of its Python module that has one (MoH-ViT's
AggregatedAttention appends to attention.Attention's), or the list given as `losses=`; they keep the last step's
head-load counts in `head_load`.
"""
import sys
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import _ops

ops = torch.ops.moh
PATHS = ("auto", "dense", "sparse")


def _check_path(path):
    if path not in PATHS:
        raise ValueError(f"moh_torch: path must be one of {PATHS}, got {path!r}")
    return path


class _Losses:
    """Where a routed layer appends its load-balance loss: a class's LOAD_BALANCING_LOSSES (looked up at each use, as
    the official modules do) or a given list. Copies of a model (deepcopy: DiT's EMA) append to the same list, as the
    official class-level list makes them."""

    def __init__(self, owner=None, items=None):
        self.owner, self.items = owner, items

    @property
    def list(self):
        return self.owner.LOAD_BALANCING_LOSSES if self.owner is not None else self.items

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):  # pickled by its class, not by the losses of the step it was saved in
        return (_Losses, (self.owner, None if self.owner is not None else []))


def _autocast_operands(q, k, v):
    """q, k, v as the official modules' scaled_dot_product_attention takes them under autocast: of one type, the
    autocast type (with qk_norm, the LayerNorms give fp32 q and k beside a bf16 v). Outside autocast, as given."""
    if q.dtype == k.dtype == v.dtype:
        return q, k, v
    device = q.device.type
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
        return q.to(dtype), k.to(dtype), v.to(dtype)
    return q, k, v


def _loss_owner(module):
    """The class whose LOAD_BALANCING_LOSSES the official training loop sums for `module`: its own class's (MoH-DiT's
    MoHAttention), else the one class of its Python module that has such a list (MoH-ViT's attention_native imports
    attention.Attention and appends to its list); None where there is none."""
    for klass in type(module).__mro__:
        if isinstance(vars(klass).get("LOAD_BALANCING_LOSSES"), list):
            return klass
    home = sys.modules.get(type(module).__module__)
    owners = {}
    for value in vars(home).values() if home is not None else ():
        if isinstance(value, type) and not issubclass(value, _Routed):
            found = getattr(value, "LOAD_BALANCING_LOSSES", None)
            if isinstance(found, list):
                owners.setdefault(id(found), value)
    if len(owners) > 1:
        names = sorted(o.__name__ for o in owners.values())
        raise TypeError(f"moh_torch: {type(module).__name__}'s module {home.__name__} has several "
                        f"LOAD_BALANCING_LOSSES lists ({', '.join(names)}); pass losses=<the list your training "
                        "loop sums>")
    return next(iter(owners.values()), None)


def _owner_of(root, name):
    """The submodule of `root` that holds the tensor `name` ("blocks.0.qkv.weight") and the tensor's own name."""
    path, _, leaf = name.rpartition(".")
    return (root.get_submodule(path) if path else root), leaf


def _take_tensors(new, old):
    """`new`'s parameters and buffers become `old`'s own tensor objects, name by name: nothing is copied, so whatever
    holds old's parameters (an optimizer, an EMA, DDP's reducer, a frozen flag) holds new's. Both must have the same
    state_dict keys and parameter shapes; a buffer of another shape or dtype than new computes is copied into new's."""
    want, have = list(old.state_dict()), list(new.state_dict())
    if sorted(want) != sorted(have):
        raise TypeError(f"moh_torch: {type(old).__name__} has other parameters than {type(new).__name__}: missing "
                        f"{sorted(set(have) - set(want))}, unexpected {sorted(set(want) - set(have))}")
    for name, param in old.named_parameters():
        owner, leaf = _owner_of(new, name)
        mine = owner._parameters.get(leaf)
        if mine is None or mine.shape != param.shape:
            raise TypeError(f"moh_torch: {type(old).__name__}.{name} has shape {list(param.shape)}, "
                            f"{type(new).__name__} needs {None if mine is None else list(mine.shape)}")
        owner._parameters[leaf] = param
    for name, buf in old.named_buffers():
        try:
            owner, leaf = _owner_of(new, name)
        except AttributeError:  # a submodule the replacement does not have (state_dict keys matched: not persistent)
            continue
        mine = owner._buffers.get(leaf)
        if mine is None:
            continue
        if mine.shape == buf.shape and mine.dtype == buf.dtype and mine.device == buf.device:
            owner._buffers[leaf] = buf
        elif name in want:
            with torch.no_grad():
                mine.copy_(buf)


class _Routed(nn.Module):
    """The MoH router layers as the official modules create them (wg: routed, wg_0: the two-stage α, wg_1: shared) and
    the attention op call every module here makes."""

    LOAD_BALANCING_LOSSES = []

    @property
    def load_balancing_losses(self):
        """The list this layer appends its load-balance loss to in training."""
        return self._losses.list

    def _init_routing(self, dim, num_heads, shared_head, routed_head, path):
        if not (0 <= shared_head <= num_heads and 0 <= routed_head <= num_heads - shared_head):
            raise ValueError(f"moh_torch: need 0 <= shared_head <= num_heads = {num_heads} and routed_head in "
                             f"[0, num_heads - shared_head] = [0, {num_heads - shared_head}], got "
                             f"shared_head={shared_head}, routed_head={routed_head}")
        self.shared_head, self.routed_head = shared_head, routed_head
        self.path = _check_path(path)
        self._losses = _Losses(owner=type(self))
        self.head_load = None
        if routed_head > 0:
            self.wg = nn.Linear(dim, num_heads - shared_head, bias=False)
            if shared_head > 0:
                self.wg_0 = nn.Linear(dim, 2, bias=False)
        if shared_head > 1:
            self.wg_1 = nn.Linear(dim, shared_head, bias=False)

    def router_logits(self, x):
        """x (T, C) → the router op's logits [routed | shared | α] (T, L); K = 0 layers wg_1's (T, h); MHA: None.
        Three products as the official code makes them, so that the top-K sees the same numbers."""
        if self.routed_head > 0:
            parts = [self.wg(x)]
            if self.shared_head > 1:
                parts.append(self.wg_1(x))
            if self.shared_head > 0:
                parts.append(self.wg_0(x))
            return torch.cat(parts, dim=-1)
        return self.wg_1(x) if hasattr(self, "wg_1") else None

    def _attend(self, q, k, v, x, scale, bias=None):
        """The gated heads (B, N, h·d) of q, k, v (B, h, N, d), routed by x (B, N, C)."""
        self._no_dropout_in_training()
        q, k, v = _autocast_operands(q, k, v)
        logits = self.router_logits(x.reshape(-1, x.shape[-1]))
        out, aux, picks, _ = ops.moh_attention(q, k, v, logits, self.shared_head, self.routed_head, scale, self.path,
                                               bias)
        self._record(aux, picks)
        return out

    def _no_dropout_in_training(self):
        p = getattr(self, "attn_drop_p", 0.0)
        if self.training and p > 0:
            raise ValueError(f"moh_torch: this {type(self).__name__} replaced an attention with dropout p={p}: the ops "
                             "have no attention dropout, so it runs in eval mode only (set attn_drop to 0 to train)")

    def _record(self, aux, picks):
        if self.routed_head > 0:
            self.head_load = picks
            if self.training:
                self.load_balancing_losses.append(aux)

    def _adopt(self, module, parts=(), losses=None):
        """Become `module`'s replacement: its submodules `parts` (q/k norms, dropout: whatever their kind), its very
        parameters and buffers, its training mode, and the loss list its training loop sums (`losses` names one)."""
        self.to(device=module.proj.weight.device, dtype=module.proj.weight.dtype)  # only what this module computes
        for name in parts:
            part = getattr(module, name, None)
            if isinstance(part, nn.Module):
                setattr(self, name, part)
        _take_tensors(self, module)
        self.attn_drop_p = _attention_dropout(module)
        if losses is not None:
            if not isinstance(losses, list):
                raise TypeError(f"moh_torch: losses must be a list, got {type(losses).__name__}")
            self._losses = _Losses(items=losses)
        elif self.routed_head > 0:
            owner = _loss_owner(module)
            if owner is None:
                warnings.warn(f"moh_torch: {type(module).__name__} has no LOAD_BALANCING_LOSSES list; the swapped "
                              f"layer appends to moh_torch.nn.{type(self).__name__}.LOAD_BALANCING_LOSSES (pass "
                              "losses= to name the list your training loop sums)", stacklevel=4)
            else:
                self._losses = _Losses(owner=owner)
        self.train(module.training)
        return self


def _attention_dropout(module):
    """The official module's attention dropout probability (0 without one)."""
    drop = getattr(module, "attn_drop", None)
    return drop.p if isinstance(drop, nn.Dropout) else 0.0


class MoHAttention(_Routed):
    """MoH-DiT's MoHAttention (and timm's Attention when shared_head = routed_head = 0): the same constructor and
    state_dict keys (qkv, q_norm, k_norm, proj, wg, wg_0, wg_1). `path`: the MoH attention path (auto, dense,
    sparse); auto is the toolkit's attention_path rule."""

    def __init__(self, dim, num_heads=8, qkv_bias=False, qk_norm=False, attn_drop=0., proj_drop=0.,
                 norm_layer=nn.LayerNorm, shared_head=0, routed_head=0, head_dim=None, path="auto"):
        super().__init__()
        if attn_drop > 0:
            raise ValueError(f"moh_torch.nn.MoHAttention: attn_drop must be 0 (the ops have no attention dropout), "
                             f"got {attn_drop}")
        self.num_heads = num_heads
        self.head_dim = head_dim if head_dim is not None else dim // num_heads
        self.scale = self.head_dim ** -0.5
        inner = self.num_heads * self.head_dim
        self.qkv = nn.Linear(dim, 3 * inner, bias=qkv_bias)
        self.q_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()
        self.proj = nn.Linear(inner, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self._init_routing(dim, num_heads, shared_head, routed_head, path)

    def forward(self, x, attn_mask=None):
        if attn_mask is not None:
            raise ValueError("moh_torch.nn.MoHAttention: attn_mask is not supported")
        B, N, _ = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # (B, h, N, d) each
        out = self._attend(self.q_norm(q), self.k_norm(k), v, x, self.scale)
        return self.proj_drop(self.proj(out))

    @classmethod
    def from_module(cls, module, path="auto", losses=None):
        for extra in ("gate", "norm"):
            part = getattr(module, extra, None)
            if part is not None and not isinstance(part, nn.Identity):
                raise TypeError(f"moh_torch: {type(module).__name__}.{extra} is not supported")
        new = cls(module.qkv.in_features, module.num_heads, qkv_bias=module.qkv.bias is not None,
                  shared_head=getattr(module, "shared_head", 0), routed_head=getattr(module, "routed_head", 0),
                  head_dim=module.head_dim, path=path)
        return new._adopt(module, ("q_norm", "k_norm", "proj_drop"), losses)


class _CosineHeads(_Routed):
    """What both MoH-ViT attentions share: temperature, query embedding, the CPB bias MLP and the routers."""

    def _init_heads(self, dim, num_heads, shared_head, routed_head, path):
        self.dim, self.num_heads, self.head_dim = dim, num_heads, dim // num_heads
        self.temperature = nn.Parameter(torch.log((torch.ones(num_heads, 1, 1) / 0.24).exp() - 1))
        self.query_embedding = nn.Parameter(nn.init.trunc_normal_(torch.empty(num_heads, 1, self.head_dim), std=0.02))
        self.cpb_fc1 = nn.Linear(2, 512)
        self.cpb_act = nn.ReLU(inplace=True)
        self.cpb_fc2 = nn.Linear(512, num_heads)
        self._init_routing(dim, num_heads, shared_head, routed_head, path)

    def position_bias(self, table, index, queries, keys):
        """The continuous position bias (h, queries, keys) from the coordinates table."""
        return self.cpb_fc2(self.cpb_act(self.cpb_fc1(table))).transpose(0, 1)[:, index.view(-1)].view(-1, queries,
                                                                                                        keys)

    def scaled_queries(self, q):
        """Cosine queries with the query embedding, times softplus(temperature) · log-length (B, h, N, d)."""
        return (F.normalize(q, dim=-1) + self.query_embedding) * F.softplus(self.temperature) * self.seq_length_scale


class TransNeXtAttention(_CosineHeads):
    """MoH-ViT's full attention (stage 4): the official constructor and keys; the scores' softmax, the values, the
    router and the head gates in the attention op (the CPB bias as its score bias, the cosine scaling before it)."""

    def __init__(self, dim, input_resolution, num_heads=8, qkv_bias=True, attn_drop=0., proj_drop=0., shared_head=0,
                 routed_head=0, path="auto"):
        super().__init__()
        if attn_drop > 0:
            raise ValueError(f"moh_torch.nn.TransNeXtAttention: attn_drop must be 0, got {attn_drop}")
        self._init_heads(dim, num_heads, shared_head, routed_head, path)
        length = torch.as_tensor(float(input_resolution[0] * input_resolution[1]), dtype=torch.float64)
        self.register_buffer("seq_length_scale", torch.log(length), persistent=False)
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x, H, W, relative_pos_index, relative_coords_table):
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3 * self.num_heads, self.head_dim).transpose(1, 2).chunk(3, dim=1)
        bias = self.position_bias(relative_coords_table, relative_pos_index, N, N)  # (h, N, N)
        out = self._attend(self.scaled_queries(q), F.normalize(k, dim=-1), v, x, 1.0, bias)
        return self.proj_drop(self.proj(out))

    @classmethod
    def from_module(cls, module, path="auto", losses=None):
        n = int(round(float(torch.exp(module.seq_length_scale.double()))))
        new = cls(module.qkv.in_features, (n, 1), module.num_heads, qkv_bias=module.qkv.bias is not None,
                  shared_head=getattr(module, "shared_head", 0), routed_head=getattr(module, "routed_head", 0),
                  path=path)
        return new._adopt(module, ("proj_drop",), losses)


class AggregatedAttention(_CosineHeads):
    """MoH-ViT's aggregated attention (stages 1-3): a 3x3 window and pooled keys under one softmax, as the official
    native module computes them; the router and the head gates are the ops (route, gate_heads)."""

    def __init__(self, dim, input_resolution, num_heads=8, window_size=3, qkv_bias=True, attn_drop=0., proj_drop=0.,
                 sr_ratio=1, fixed_pool_size=None, shared_head=0, routed_head=0, path="auto"):
        super().__init__()
        if attn_drop > 0 or window_size % 2 != 1:
            raise ValueError(f"moh_torch.nn.AggregatedAttention: need attn_drop 0 and an odd window_size, got "
                             f"{attn_drop} and {window_size}")
        self._init_heads(dim, num_heads, shared_head, routed_head, path)
        H, W = input_resolution
        self.window_size, self.local_len = window_size, window_size ** 2
        if fixed_pool_size is None:
            self.pool_H, self.pool_W = H // sr_ratio, W // sr_ratio
        else:  # the official option: a pool of this side whatever the resolution
            if not 0 < fixed_pool_size < min(H, W):
                raise ValueError(f"moh_torch.nn.AggregatedAttention: fixed_pool_size must be in (0, {min(H, W)}), got "
                                 f"{fixed_pool_size}")
            self.pool_H = self.pool_W = fixed_pool_size
        self.pool_len = self.pool_H * self.pool_W
        self.unfold = nn.Unfold(kernel_size=window_size, padding=window_size // 2, stride=1)
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, dim * 2, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self.pool = nn.AdaptiveAvgPool2d((self.pool_H, self.pool_W))
        self.sr = nn.Conv2d(dim, dim, kernel_size=1)
        self.norm = nn.LayerNorm(dim)
        self.act = nn.GELU()
        self.relative_pos_bias_local = nn.Parameter(
            nn.init.trunc_normal_(torch.empty(num_heads, self.local_len), std=0.0004))
        inside = self.unfold(torch.ones(1, 1, H, W)).reshape(self.local_len, H * W).transpose(0, 1)  # (N, L)
        self.register_buffer("seq_length_scale", torch.log(inside.sum(-1, keepdim=True) + self.pool_len),
                             persistent=False)
        self.register_buffer("padding_mask", inside == 0, persistent=False)
        self.learnable_tokens = nn.Parameter(
            nn.init.trunc_normal_(torch.empty(num_heads, self.head_dim, self.local_len), std=0.02))
        self.learnable_bias = nn.Parameter(torch.zeros(num_heads, 1, self.local_len))

    def _local_keys_values(self, x, H, W):
        """Each token's window of L keys (cosine-normalised) and values: (B, h, N, d, L) each."""
        B, N, C = x.shape
        k, v = self.kv(x).chunk(2, dim=-1)
        k = F.normalize(k.reshape(B, N, self.num_heads, self.head_dim), dim=-1).reshape(B, N, C)
        windows = self.unfold(torch.cat([k, v], dim=-1).transpose(1, 2).reshape(B, 2 * C, H, W))
        kl, vl = windows.reshape(B, 2 * self.num_heads, self.head_dim, self.local_len, N).permute(0, 1, 4, 2, 3) \
            .chunk(2, dim=1)
        return kl, vl

    def _pooled_keys_values(self, x, H, W):
        """Keys and values of the pooled map: (B, h, P, d) each."""
        B, N, C = x.shape
        pooled = self.pool(self.act(self.sr(x.transpose(1, 2).reshape(B, C, H, W).contiguous())))
        pooled = self.norm(pooled.reshape(B, C, -1).transpose(1, 2))
        kv = self.kv(pooled).reshape(B, self.pool_len, 2 * self.num_heads, self.head_dim).transpose(1, 2)
        return kv.chunk(2, dim=1)

    def forward(self, x, H, W, relative_pos_index, relative_coords_table):
        B, N, C = x.shape
        qn = F.normalize(self.q(x).reshape(B, N, self.num_heads, self.head_dim).transpose(1, 2), dim=-1)
        qs = (qn + self.query_embedding) * F.softplus(self.temperature) * self.seq_length_scale
        kl, vl = self._local_keys_values(x, H, W)
        local = (qs.unsqueeze(-2) @ kl).squeeze(-2) + self.relative_pos_bias_local.unsqueeze(1)
        local = local.masked_fill(self.padding_mask, float("-inf"))  # (B, h, N, L)
        kp, vp = self._pooled_keys_values(x, H, W)
        pool_bias = self.position_bias(relative_coords_table, relative_pos_index, N, self.pool_len)
        pooled = qs @ F.normalize(kp, dim=-1).transpose(-2, -1) + pool_bias  # (B, h, N, P)
        a_local, a_pool = torch.cat([local, pooled], dim=-1).softmax(dim=-1).split([self.local_len, self.pool_len], -1)
        a_local = qn @ self.learnable_tokens + self.learnable_bias + a_local
        heads = (a_local.unsqueeze(-2) @ vl.transpose(-2, -1)).squeeze(-2) + a_pool @ vp  # (B, h, N, d)
        return self.proj_drop(self.proj(self._gate_heads(heads, x)))

    def _gate_heads(self, heads, x):
        self._no_dropout_in_training()
        B, h, N, d = heads.shape
        logits = self.router_logits(x.reshape(B * N, -1))
        if logits is None:
            return heads.transpose(1, 2).reshape(B, N, h * d)
        if self.routed_head > 0:
            gates, _, picks, aux = ops.route(logits, h, self.shared_head, self.routed_head, True)
            self._record(aux, picks)
        else:
            gates = torch.softmax(logits.float(), dim=-1) * h
        return ops.gate_heads(heads, gates)

    @classmethod
    def from_module(cls, module, path="auto", losses=None):
        H, W = _unfolded_grid(module)
        sr = getattr(module, "sr_ratio", H // module.pool_H)
        fixed = None if (H // sr, W // sr) == (module.pool_H, module.pool_W) else module.pool_H
        new = cls(module.q.in_features, (H, W), module.num_heads, window_size=module.window_size,
                  qkv_bias=module.q.bias is not None, sr_ratio=sr, fixed_pool_size=fixed,
                  shared_head=getattr(module, "shared_head", 0), routed_head=getattr(module, "routed_head", 0),
                  path=path)
        return new._adopt(module, ("proj_drop",), losses)


def _unfolded_grid(module):
    """(H, W) of an aggregated attention from its padding mask (N = H·W tokens, a window of k x k): the window's
    top-centre key lies outside the map for the tokens of the first k // 2 rows, W of them each."""
    mask = module.padding_mask
    half = module.window_size // 2
    W = int(mask[:, half].sum().item()) // half
    return mask.shape[0] // W, W


class DiTBlock(nn.Module):
    """DiT's adaLN-Zero block (DiT models.py DiTBlock: norm1, attn, norm2, mlp.fc1/fc2, adaLN_modulation.1) with its
    element-wise work in the fused block ops and its attention a MoHAttention."""

    def __init__(self, hidden_size, num_heads, mlp_ratio=4.0, shared_head=0, routed_head=0, head_dim=None,
                 path="auto"):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.attn = MoHAttention(hidden_size, num_heads, qkv_bias=True, shared_head=shared_head,
                                 routed_head=routed_head, head_dim=head_dim, path=path)
        self.norm2 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        hidden = int(hidden_size * mlp_ratio)
        self.mlp = nn.Module()
        self.mlp.fc1 = nn.Linear(hidden_size, hidden)
        self.mlp.fc2 = nn.Linear(hidden, hidden_size)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 6 * hidden_size))

    def forward(self, x, c):
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.adaLN_modulation(c).chunk(6, dim=1)
        eps = self.norm1.eps
        x = ops.gate_residual(x, gate_msa, self.attn(ops.ln_modulate(x, shift_msa, scale_msa, eps)[0]))
        h = ops.bias_gelu(F.linear(ops.ln_modulate(x, shift_mlp, scale_mlp, eps)[0], self.mlp.fc1.weight),
                          self.mlp.fc1.bias)
        return ops.gate_residual(x, gate_mlp, self.mlp.fc2(h))

    @classmethod
    def from_module(cls, block, path="auto", losses=None):
        """The block for an official DiTBlock (its attention a timm Attention or a MoHAttention), holding its very
        parameters (as from_module does)."""
        attn = block.attn
        new = cls(block.adaLN_modulation[1].in_features, attn.num_heads, block.mlp.fc1.out_features /
                  block.mlp.fc1.in_features, getattr(attn, "shared_head", 0), getattr(attn, "routed_head", 0),
                  attn.head_dim, path)
        new.to(device=block.mlp.fc1.weight.device, dtype=block.mlp.fc1.weight.dtype)
        new.attn = MoHAttention.from_module(attn, path, losses)
        _take_tensors(new, block)
        new.train(block.training)
        return new


def from_module(module, path="auto", losses=None):
    """The moh_torch module for an official attention module, holding its parameter and buffer objects: MoH-DiT
    MoHAttention or timm Attention → MoHAttention; MoH-ViT Attention → TransNeXtAttention; MoH-ViT
    AggregatedAttention → AggregatedAttention. TypeError for anything else. `losses`: the list the routed layer
    appends its load-balance loss to (default: the official class-level list, found as the official code uses it)."""
    _check_path(path)
    has = lambda *names: all(hasattr(module, n) for n in names)  # noqa: E731
    if has("qkv", "cpb_fc1", "query_embedding"):
        return TransNeXtAttention.from_module(module, path, losses)
    if has("q", "kv", "sr", "learnable_tokens"):
        return AggregatedAttention.from_module(module, path, losses)
    if has("qkv", "proj", "num_heads", "head_dim"):
        return MoHAttention.from_module(module, path, losses)
    raise TypeError(f"moh_torch.nn.from_module: {type(module).__name__} is not an attention module it knows "
                    "(MoH-DiT MoHAttention, timm Attention, MoH-ViT Attention or AggregatedAttention)")


_OURS = (MoHAttention, TransNeXtAttention, AggregatedAttention)


def swap_attention(model, path="auto", losses=None):
    """Replaces, in place, every attention module of `model` that from_module knows (an attribute named `attn`, as in
    DiT and TransNeXt blocks); returns how many. The model keeps its parameter objects: build the optimizer, EMA and
    DDP wrapper before or after, either works."""
    swapped = 0
    for parent in list(model.modules()):
        child = getattr(parent, "attn", None)
        if isinstance(child, nn.Module) and not isinstance(child, _OURS):
            parent.attn = from_module(child, path, losses)
            swapped += 1
    return swapped
