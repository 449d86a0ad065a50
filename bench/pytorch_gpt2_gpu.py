#!/usr/bin/env python3
"""PyTorch peer of bench-gpu_gpt2: GPT-2 124M (or a LLaMA-shaped model of the same width) training
throughput on one GPU, the way most would write it first (nanoGPT's recipe): bf16 autocast,
torch.compile, F.scaled_dot_product_attention (flash attention), fused AdamW, a global-norm clip
at 1.0 - the step bench-gpu_gpt2 times, on the same B and T, in the same call of the GPU machine.

    python3 bench/pytorch_gpt2_gpu.py [--batch 64] [--seq-len 1024] [--steps 20] [--warmup 5]
                                      [--model gpt2|llama] [--no-compile] [--json OUT]

FLOPs per token, the same formula for bench-gpu_gpt2, llm.c and this script (tools/gpu_verify.sh
records all three with it): 6 N + 12 L T C, N the parameters of the model with its real
vocabulary (the LM head's padding rows not counted), L layers, T the sequence length, C the width
(PaLM's count: the dense layers' 6 N plus attention's QK^T and PV, forward and backward, over the
whole T x T square). llm.c's own MFU counts 6 N + 6 L T C; tools/gpu_verify.sh converts.
The vocabulary is padded to a multiple of 64 (50257 -> 50304, nanoGPT's padding, which its authors
measured ~25% faster) unless --no-pad-vocab; the padding is compute only, the FLOPs count
excludes it. Data are random tokens (throughput only). MFU is against the card's published dense
bf16 peak (989.4 TFLOP/s for an H100 SXM or H200, the figure llm.c and bench-gpu_gpt2 use).
Exit status 0 measured, 2 no torch or no GPU (the reason printed).
"""
import argparse
import json
import math
import statistics
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--steps", type=int, default=20, help="timed steps (default 20)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first; torch.compile compiles in the first")
    p.add_argument("--model", choices=["gpt2", "llama"], default="gpt2",
                   help="gpt2: GPT-2 124M; llama: the same width and depth with RMSNorm, RoPE, SwiGLU and "
                        "grouped K/V heads (--kv-heads), untied head, no biases")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--kv-heads", type=int, default=4, help="llama: K/V heads (default 4)")
    p.add_argument("--d-model", type=int, default=768)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--no-pad-vocab", action="store_true", help="keep the vocabulary at --vocab rows")
    p.add_argument("--no-compile", action="store_true", help="eager mode (no torch.compile)")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--json", help="write the figures here too")
    return p.parse_args()


def build_model(a, torch, nn, F):
    V = a.vocab if a.no_pad_vocab else (a.vocab + 63) // 64 * 64
    C, H, T = a.d_model, a.heads, a.seq_len
    hs = C // H

    class Gpt2Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.c_fc, self.c_fc_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def forward(self, x):
            B = x.shape[0]
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, H, hs).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.c_proj(y.transpose(1, 2).reshape(B, T, C))
            return x + self.c_fc_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    KV, F_ = a.kv_heads, (int(8 * C / 3) + 255) // 256 * 256

    def rope_tables():
        inv = 1.0 / (10000.0 ** (torch.arange(0, hs, 2, dtype=torch.float32) / hs))
        ang = torch.outer(torch.arange(T, dtype=torch.float32), inv)
        return torch.cat([ang, ang], dim=-1).cos(), torch.cat([ang, ang], dim=-1).sin()

    def rope(x, cos, sin):  # Hugging Face's rotate-half, as the project's rope op
        x1, x2 = x[..., : hs // 2], x[..., hs // 2:]
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    class LlamaBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.n_1, self.n_2 = nn.RMSNorm(C, eps=1e-5), nn.RMSNorm(C, eps=1e-5)
            self.wqkv = nn.Linear(C, (H + 2 * KV) * hs, bias=False)
            self.wo = nn.Linear(C, C, bias=False)
            self.w_gate_up = nn.Linear(C, 2 * F_, bias=False)
            self.w_down = nn.Linear(F_, C, bias=False)

        def forward(self, x, cos, sin):
            B = x.shape[0]
            q, k, v = self.wqkv(self.n_1(x)).split([H * hs, KV * hs, KV * hs], dim=2)
            q = rope(q.view(B, T, H, hs).transpose(1, 2), cos, sin)
            k = rope(k.view(B, T, KV, hs).transpose(1, 2), cos, sin)
            v = v.view(B, T, KV, hs).transpose(1, 2)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            x = x + self.wo(y.transpose(1, 2).reshape(B, T, C))
            gate, up = self.w_gate_up(self.n_2(x)).chunk(2, dim=-1)
            return x + self.w_down(F.silu(gate) * up)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(V, C)
            self.llama = a.model == "llama"
            if self.llama:
                self.blocks = nn.ModuleList(LlamaBlock() for _ in range(a.layers))
                self.norm_f = nn.RMSNorm(C, eps=1e-5)
                self.lm_head = nn.Linear(C, V, bias=False)
                cos, sin = rope_tables()
                self.register_buffer("cos", cos, persistent=False)
                self.register_buffer("sin", sin, persistent=False)
            else:
                self.wpe = nn.Embedding(T, C)
                self.blocks = nn.ModuleList(Gpt2Block() for _ in range(a.layers))
                self.norm_f = nn.LayerNorm(C)
                self.lm_head = nn.Linear(C, V, bias=False)
                self.lm_head.weight = self.wte.weight  # tied, as GPT-2
            for m in self.modules():
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(m.weight, std=0.02)
                if isinstance(m, nn.Linear) and m.bias is not None:
                    nn.init.zeros_(m.bias)

        def forward(self, idx, targets):
            x = self.wte(idx)
            if self.llama:
                for b in self.blocks:
                    x = b(x, self.cos, self.sin)
            else:
                x = x + self.wpe.weight
                for b in self.blocks:
                    x = b(x)
            logits = self.lm_head(self.norm_f(x))
            return F.cross_entropy(logits.float().view(-1, V), targets.view(-1))

    return Model(), V


def main():
    a = parse_args()
    try:
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
    except ImportError as e:
        print(f"pytorch_gpt2_gpu: no torch here ({e}); install PyTorch with CUDA", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("pytorch_gpt2_gpu: torch sees no GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    if a.d_model % a.heads or (a.model == "llama" and a.heads % a.kv_heads):
        print("pytorch_gpt2_gpu: --d-model must be a multiple of --heads, --heads of --kv-heads", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    torch.manual_seed(1234)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    model, V = build_model(a, torch, nn, F)
    model = model.to(dev)
    n_all = sum(p.numel() for p in model.parameters())
    pad_rows = (V - a.vocab) * a.d_model * (2 if a.model == "llama" else 1)  # untied llama pads two matrices
    n_params = n_all - pad_rows
    L, T, C = a.layers, a.seq_len, a.d_model
    flops_per_token = 6 * n_params + 12 * L * T * C
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    step_model = model if a.no_compile else torch.compile(model)
    g = torch.Generator(device=dev).manual_seed(1)
    x = torch.randint(0, a.vocab, (a.batch, T), device=dev, generator=g)
    y = torch.randint(0, a.vocab, (a.batch, T), device=dev, generator=g)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = step_model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    t0 = time.perf_counter()
    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    warmup_s = time.perf_counter() - t0
    torch.cuda.reset_peak_memory_stats()
    times, loss = [], None
    for _ in range(a.steps):
        t = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    ms = statistics.median(times) * 1e3
    tok_s = a.batch * T / (ms / 1e3)
    name = torch.cuda.get_device_name()
    peak = 989.4 if ("H100" in name or "H200" in name) else None
    achieved = tok_s * flops_per_token / 1e12
    res = {
        "peer": "pytorch", "model": a.model, "device": name, "torch": torch.__version__,
        "compiled": not a.no_compile, "batch": a.batch, "seq_len": T, "vocab": a.vocab, "vocab_padded": V,
        "params": n_params, "flops_per_token": flops_per_token, "flops_formula": "6 N + 12 L T C",
        "steps": a.steps, "warmup_seconds": round(warmup_s, 2), "ms_per_step": round(ms, 3),
        "tokens_per_s": round(tok_s, 1), "achieved_tflops": round(achieved, 2),
        "mfu_vs_published_bf16_peak": round(achieved / peak, 4) if peak else None,
        "peak_memory_bytes": torch.cuda.max_memory_allocated(), "last_loss": float(loss),
    }
    print(f"pytorch {a.model} on {name}: B={a.batch} T={T} {ms:.2f} ms/step {tok_s:.0f} tokens/s "
          f"{achieved:.1f} TFLOP/s (6N + 12LTC, N = {n_params})"
          + (f" MFU {100 * achieved / peak:.1f}% of {peak}" if peak else "") + f" loss {float(loss):.4f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0 if math.isfinite(float(loss)) else 1


if __name__ == "__main__":
    sys.exit(main())
