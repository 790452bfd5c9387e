"""Step time of the recipe's model (megatron-core layers, TP=1) vs a plain PyTorch model of the same shape.

Both get the same treatment so that only the model code differs: parameters in the training dtype (bf16 on GPU),
torch AdamW (fused on CUDA), the same synthetic micro-batches, gradient accumulation to the recipe's global batch,
torch SDPA attention. No DeepSpeed here (`recipes.tools.bench_train` measures the whole engine); a ratio well above 1 means
megatron-core's layers (or our wiring of them) cost time a hand-written model does not.

  python -m recipes bench plain --config configs/runs/bench-gpt-1.3b-1gpu.yaml --steps 6 --json out.json
"""
from __future__ import annotations

import json
import os
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from recipes.config.cli_help import command_parser


class PlainBlock(nn.Module):
    """Pre-norm decoder block: the recipe's shape (GQA, RoPE or learned positions, RMSNorm/LayerNorm, SwiGLU/GeLU,
    optional biases), written with torch modules only."""

    def __init__(self, m):
        super().__init__()
        h, a, g = m.hidden_size, m.num_attention_heads, m.query_groups
        self.a, self.g, self.d = a, g, h // a
        norm = nn.RMSNorm if m.normalization == "rmsnorm" else nn.LayerNorm
        self.norm1, self.norm2 = norm(h, eps=m.norm_epsilon), norm(h, eps=m.norm_epsilon)
        self.qkv = nn.Linear(h, (a + 2 * g) * self.d, bias=m.qkv_bias)
        self.proj = nn.Linear(a * self.d, h, bias=m.add_bias_linear)
        self.swiglu = m.activation == "swiglu"
        self.fc1 = nn.Linear(h, (2 if self.swiglu else 1) * m.ffn_size, bias=m.add_bias_linear)
        self.fc2 = nn.Linear(m.ffn_size, h, bias=m.add_bias_linear)

    def forward(self, x, rope):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).split([self.a * self.d, self.g * self.d, self.g * self.d], dim=-1)
        q, k, v = (t.view(b, s, -1, self.d).transpose(1, 2) for t in (q, k, v))  # [b, heads, s, d]
        if rope is not None:
            q, k = _rotate(q, rope), _rotate(k, rope)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.a != self.g)
        x = x + self.proj(y.transpose(1, 2).reshape(b, s, -1))
        u = self.fc1(self.norm2(x))
        if self.swiglu:
            gate, up = u.chunk(2, dim=-1)
            u = F.silu(gate) * up
        else:
            u = F.gelu(u, approximate="tanh")
        return x + self.fc2(u)


def _rotate(t, angles):
    """RoPE, halves rotated (the convention recipes.model.layers uses); angles [s, d] in fp32."""
    cos, sin = angles.cos().to(t.dtype), angles.sin().to(t.dtype)
    t1, t2 = t.chunk(2, dim=-1)
    return t * cos + torch.cat([-t2, t1], dim=-1) * sin


class PlainGPT(nn.Module):
    def __init__(self, m):
        super().__init__()
        from recipes.model.layers import rope_table

        self.m = m
        v = m.padded_vocab_size(1)
        self.embed = nn.Embedding(v, m.hidden_size)
        self.pos = nn.Embedding(m.seq_length, m.hidden_size) if m.position_embedding == "learned" else None
        self.blocks = nn.ModuleList(PlainBlock(m) for _ in range(m.num_layers))
        norm = nn.RMSNorm if m.normalization == "rmsnorm" else nn.LayerNorm
        self.norm = norm(m.hidden_size, eps=m.norm_epsilon)
        self.head = None if m.tied_embeddings else nn.Linear(m.hidden_size, v, bias=False)
        head_dim = m.hidden_size // m.num_attention_heads
        self.rope = None
        if self.pos is None:
            self.rope = rope_table(m.seq_length, head_dim, m.rotary_base, m.rope_scaling)[:, 0, 0, :]

    def forward(self, tokens, labels, mask):
        x = self.embed(tokens)
        if self.pos is not None:
            x = x + self.pos.weight[: tokens.shape[1]]
        rope = None
        if self.rope is not None:
            self.rope = self.rope.to(x.device)
            rope = self.rope[: tokens.shape[1]]
        for blk in self.blocks:
            x = blk(x, rope)
        x = self.norm(x)
        logits = F.linear(x, self.embed.weight) if self.head is None else self.head(x)
        losses = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), reduction="none")
        mask = mask.flatten().float()
        return (losses * mask).sum() / mask.sum().clamp(min=1.0)


def time_model(model, recipe, batches, device, warmup: int) -> dict:
    """Median step time and peak memory of forward + backward over the micro-batches + fused AdamW step."""
    o = recipe.training.optimizer
    opt = torch.optim.AdamW(model.parameters(), lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps,
                            weight_decay=o.weight_decay, fused=device.type == "cuda")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for i, mbs in enumerate(batches):
        t0 = time.perf_counter()
        for tokens, (labels, mask) in mbs:
            (model(tokens, labels, mask) / len(mbs)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    out = {"step_time_s": statistics.median(times),
           "parameters": sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())}
    if device.type == "cuda":
        out["max_memory_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
    return out


def main(argv=None) -> int:
    ap = command_parser("python -m recipes bench plain", __doc__)
    ap.add_argument("--config", default="configs/runs/tiny-cpu.yaml")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("overrides", nargs="*")
    ns = ap.parse_args(argv)
    for k, v in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29518"), ("RANK", "0"), ("WORLD_SIZE", "1"),
                 ("LOCAL_RANK", "0")):
        os.environ.setdefault(k, v)
    from recipes.tools.bench_train import synthetic_steps
    from recipes.train import groups
    from recipes.train.engine import init_distributed
    from recipes.parallel.layout import Layout
    from recipes.config.loading import load_recipe
    from recipes.model.layers import PlainDecoder
    from recipes.planner.cost import model_flops_per_step

    recipe = load_recipe(ns.config, list(ns.overrides) + ["parallel.tp=1", "parallel.pp=1", "parallel.dp=1",
                                                         "parallel.sequence_parallel=false"])
    device = init_distributed(recipe)
    layout = Layout.from_recipe(recipe, 1)
    groups.build(layout)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(recipe.training.precision, torch.float32)
    batches = synthetic_steps(recipe, layout, device, ns.steps + ns.warmup)
    result = {"recipe": recipe.name, "device": str(device), "dtype": str(dtype), "micro_batch": layout.micro_batch,
              "global_batch": recipe.training.global_batch}
    flops = model_flops_per_step(recipe.model, recipe.training.global_batch)
    for name, build in (("megatron_core", lambda: PlainDecoder(recipe, layout)),
                        ("plain_pytorch", lambda: PlainGPT(recipe.model))):
        torch.manual_seed(recipe.training.seed)
        model = build().to(device=device, dtype=dtype)
        r = time_model(model, recipe, batches, device, ns.warmup)
        r["tflops"] = flops / r["step_time_s"] / 1e12
        result[name] = r
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    result["megatron_vs_plain_step_time"] = (result["megatron_core"]["step_time_s"]
                                             / result["plain_pytorch"]["step_time_s"])
    print(json.dumps(result, indent=1))
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(result, f, indent=1)
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
