"""An EAGLE-3 draft head in PyTorch, in the published checkpoint layout (the EAGLE repository's
`cnets.py`, SpecForge's `LlamaForCausalLMEagle3`, read by vLLM's `llama_eagle3.py` and sglang's
`llama_eagle3.py`):

    fc.weight                                  [hidden, 3 * target_hidden]  fuses the target's low/mid/high hidden states
    midlayer.hidden_norm.weight                [hidden]                     norms the fused (or the head's own) hidden state
    midlayer.input_layernorm.weight            [hidden]                     norms the token embedding
    midlayer.self_attn.{q,k,v}_proj.weight     [heads * head_dim, 2 * hidden]  over concat(embedding, hidden)
    midlayer.self_attn.o_proj.weight           [hidden, heads * head_dim]
    midlayer.post_attention_layernorm.weight   [hidden]
    midlayer.mlp.{gate,up,down}_proj.weight    SwiGLU
    norm.weight                                [hidden]
    lm_head.weight                             [draft_vocab, hidden]
    d2t                                        int64 [draft_vocab]  target id = draft id + d2t[draft id]
    t2d                                        bool [vocab]         whether a target id is in the draft vocabulary

The token embedding is the target's (a checkpoint may carry its own `embed_tokens.weight`).

One draft step at position p: the residual stream starts at the hidden state h (the fused target
states for the context, the head's own pre-norm output for a chained draft), attention reads
concat(input_layernorm(embed(token)), hidden_norm(h)) with rope at p over the head's own KV,
then the MLP; the output o is the next step's hidden state and lm_head(norm(o)) the draft logits.
The pair at position p is (target hidden state at p, token at p + 1): it predicts token p + 2.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dt)


def rope(x, pos, theta):
    """rotate_half rope (llama's default) of x [B, H, L, hd] at integer positions pos [B, L]."""
    hd = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    ang = pos[:, None, :, None].float() * inv
    cos = torch.cat([ang.cos(), ang.cos()], -1)
    sin = torch.cat([ang.sin(), ang.sin()], -1)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    rot = torch.cat([-x2, x1], -1)
    return (x.float() * cos + rot.float() * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, h, kvh, hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        self.h, self.kvh, self.hd, self.theta = h, kvh, hd, cfg["rope_theta"]
        self.q_proj = nn.Linear(2 * d, h * hd, bias=False)
        self.k_proj = nn.Linear(2 * d, kvh * hd, bias=False)
        self.v_proj = nn.Linear(2 * d, kvh * hd, bias=False)
        self.o_proj = nn.Linear(h * hd, d, bias=False)

    def qkv(self, x, pos):
        B, L, _ = x.shape
        q = self.q_proj(x).view(B, L, self.h, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, L, self.kvh, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, L, self.kvh, self.hd).transpose(1, 2)
        return rope(q, pos, self.theta), rope(k, pos, self.theta), v

    def expand(self, t):
        return t.repeat_interleave(self.h // self.kvh, dim=1)

    def out(self, o):
        B, H, L, hd = o.shape
        return self.o_proj(o.transpose(1, 2).reshape(B, L, H * hd))


class MidLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, eps, i = cfg["hidden_size"], cfg["rms_norm_eps"], cfg["intermediate_size"]
        self.hidden_norm = RMSNorm(d, eps)
        self.input_layernorm = RMSNorm(d, eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(d, eps)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(d, i, bias=False)
        self.mlp.up_proj = nn.Linear(d, i, bias=False)
        self.mlp.down_proj = nn.Linear(i, d, bias=False)
        self.norm_before_residual = bool(cfg.get("norm_before_residual", False))

    def attn_input(self, emb, hid):
        hn = self.hidden_norm(hid)
        residual = hn if self.norm_before_residual else hid
        return torch.cat([self.input_layernorm(emb), hn], -1), residual

    def finish(self, residual, attn_out):
        h = residual + attn_out
        m, n = self.mlp, self.post_attention_layernorm(h)
        return h + m.down_proj(F.silu(m.gate_proj(n)) * m.up_proj(n))


class Eagle3Head(nn.Module):
    def __init__(self, cfg, target_embed):
        super().__init__()
        d = cfg["hidden_size"]
        self.cfg = cfg
        self.fc = nn.Linear(3 * cfg.get("target_hidden_size", d), d, bias=False)
        self.midlayer = MidLayer(cfg)
        self.norm = RMSNorm(d, cfg["rms_norm_eps"])
        self.lm_head = nn.Linear(d, cfg["draft_vocab_size"], bias=False)
        self.register_buffer("d2t", torch.zeros(cfg["draft_vocab_size"], dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(cfg["vocab_size"], dtype=torch.bool))
        self.embed = target_embed  # frozen, not part of the checkpoint

    def fuse(self, low, mid, high):
        return self.fc(torch.cat([low, mid, high], -1))

    def logits(self, o):
        return self.lm_head(self.norm(o))

    def to_target(self, draft_ids):
        return draft_ids + self.d2t[draft_ids]

    # ---- inference: causal attention over the head's own KV ---------------------------------
    def chunk(self, tokens, hid, pos, past=None):
        """Positions pos [B, L] with tokens [B, L] (target ids) and hidden states hid [B, L, D],
        over the KV in past (k, v [B, KVH, P, hd]); returns (output [B, L, D], (k, v))."""
        ml = self.midlayer
        x, residual = ml.attn_input(self.embed(tokens), hid)
        q, k, v = ml.self_attn.qkv(x, pos)
        if past is not None:
            k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
        L, P = q.shape[2], k.shape[2] - q.shape[2]
        mask = torch.ones(L, P + L, dtype=torch.bool).tril(P)
        a = ml.self_attn
        s = (q.float() @ a.expand(k).float().transpose(-1, -2)) / math.sqrt(a.hd)
        s = s.masked_fill(~mask, float("-inf"))
        o = torch.softmax(s, -1) @ a.expand(v).float()
        return ml.finish(residual, a.out(o.to(x.dtype))), (k, v)

    # ---- training-time test: `steps` chained drafts from every position at once --------------
    def ttt(self, tokens, hid0, steps):
        """tokens [B, L + steps] (target ids: tokens[:, i + 1 + k] is step k's input at index i),
        hid0 [B, L, D] (fused target states at positions 0..L-1); returns the logits of each step
        [B, L, draft_vocab]. Step k at index i sits at position i + k and attends to step 0's KV at
        positions <= i and to steps 1..k's own KV at index i (the chain that started at i)."""
        ml, a = self.midlayer, self.midlayer.self_attn
        B, L, _ = hid0.shape
        pos0 = torch.arange(L)[None].expand(B, L)
        causal = torch.ones(L, L, dtype=torch.bool).tril()
        hid, ks, vs, out = hid0, [], [], []
        for k in range(steps):
            x, residual = ml.attn_input(self.embed(tokens[:, 1 + k:1 + k + L]), hid)
            q, kk, vv = a.qkv(x, pos0 + k)
            ks.append(a.expand(kk))
            vs.append(a.expand(vv))
            scale = 1 / math.sqrt(a.hd)
            s0 = (q @ ks[0].transpose(-1, -2)) * scale
            s0 = s0.masked_fill(~causal, float("-inf"))
            diag = [((q * kj).sum(-1) * scale)[..., None] for kj in ks[1:]]
            p = torch.softmax(torch.cat([s0] + diag, -1).float(), -1).to(q.dtype)
            o = p[..., :L] @ vs[0]
            for j, vj in enumerate(vs[1:]):
                o = o + p[..., L + j:L + j + 1] * vj
            hid = ml.finish(residual, a.out(o))
            out.append(self.logits(hid))
        return out

    def checkpoint_tensors(self):
        """The checkpoint's tensors (the shared embedding left out), weights in bf16."""
        out = {}
        for k, v in self.state_dict().items():
            if k.startswith("embed."):
                continue
            out[k] = v.contiguous() if k in ("d2t", "t2d") else v.to(torch.bfloat16).contiguous()
        return out
