#!/usr/bin/python3
"""PyTorch DDP reference for llmpi's CPU throughput benchmark.

The same GPT-2-family model that llmpi trains, in plain PyTorch, fp32, data-parallel over
CPU processes with the gloo backend on loopback. It reports the step time and tokens/s that
a PyTorch user would get on this machine with the same configuration, so llmpi's numbers
have something honest to be compared against.

Model: token + learned position embeddings; n_layer pre-LayerNorm blocks (LN eps 1e-5) of
causal multi-head attention (qkv: one Linear C->3C with bias; proj: C->C with bias) and an
MLP C->4C, GELU (tanh approximation), 4C->C with biases; final LayerNorm; output head tied
to the token embedding (no bias); cross-entropy loss. AdamW (lr 3e-4, betas (0.9, 0.95),
eps 1e-8, weight decay 0.1 on 2-D weights, 0 on biases and LayerNorm), grad-norm clip 1.0.
Data: uniformly random token ids from a seeded generator (different per rank).

--autocast bf16 runs the forward (and so the backward) under torch.autocast("cpu", torch.bfloat16):
the Linear layers and the attention matmuls in bf16 with fp32 accumulation (oneDNN on CPUs with
bf16 instructions), the rest in fp32, master weights fp32, the usual mixed-precision recipe.
--compile wraps the DDP model in torch.compile (PyTorch 2.x; Inductor, which needs a C++
compiler): the first steps compile, so give it --warmup of a few steps.

Run with Debian's PyTorch (python3-torch, 1.13), or a PyTorch 2.x installed with pip into a
virtual environment (needed for --compile):
    OMP_NUM_THREADS=1 /usr/bin/python3 bench/pytorch_ddp_reference.py --json out.json
The script starts its own ranks (torchrun does not work with that build): --world-size N
spawns N processes that meet at 127.0.0.1 on a free port. Timing: --warmup steps are run
and discarded, then --steps steps are timed; a step is zero_grad + forward + backward
(including DDP's gradient all-reduce) + clip + optimizer step, and its time is the maximum
over ranks. Median and mean are reported; tokens/s uses the median.

FLOPs/token = 6 * params + 12 * n_layer * seq_len * d_model, params counted once each (the
tied embedding once, position embeddings included).
"""
import argparse
import json
import os
import socket
import statistics
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--steps", type=int, default=30, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps run first")
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-per-rank", type=int, default=8, help="sequences per rank per step")
    p.add_argument("--world-size", type=int, default=2, help="processes (DDP ranks) to start")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--foreach", choices=["auto", "on", "off"], default="on",
                   help="AdamW multi-tensor (foreach) implementation (on/off measured the same here; "
                        "the optimizer is a small part of the step)")
    p.add_argument("--autocast", choices=["off", "bf16"], default="off",
                   help="bf16: forward under torch.autocast('cpu', torch.bfloat16)")
    p.add_argument("--compile", action="store_true", help="torch.compile the DDP model (PyTorch 2.x)")
    p.add_argument("--json", metavar="OUT", help="write the results as JSON to OUT")
    a = p.parse_args(argv)
    for name in ("steps", "n_layer", "n_head", "d_model", "vocab", "seq_len", "batch_per_rank",
                 "world_size", "threads"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if a.warmup < 0:
        p.error("--warmup must be >= 0")
    if a.d_model % a.n_head:
        p.error(f"--d-model ({a.d_model}) must be divisible by --n-head ({a.n_head})")
    return a


ARGS = parse_args() if __name__ == "__main__" else None
if ARGS is not None:
    # Thread counts must be fixed before torch (and its OpenMP runtime) is loaded; spawned
    # ranks inherit the environment.
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(ARGS.threads)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model, n_head, seq_len):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        mask = torch.tril(torch.ones(seq_len, seq_len, dtype=torch.bool))
        # A plain attribute, not a buffer: constant, identical on every rank, and gloo cannot
        # broadcast bool tensors (DDP broadcasts registered buffers at start-up).
        self.mask = mask.view(1, 1, seq_len, seq_len)

    def forward(self, x):
        B, T, C = x.shape
        H = self.n_head
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, H, C // H).transpose(1, 2)  # (B, H, T, D)
        k = k.view(B, T, H, C // H).transpose(1, 2)
        v = v.view(B, T, H, C // H).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / (C // H) ** 0.5)
        att = att.masked_fill(~self.mask[:, :, :T, :T], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, d_model, n_head, seq_len):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model, eps=1e-5)
        self.attn = CausalSelfAttention(d_model, n_head, seq_len)
        self.ln2 = nn.LayerNorm(d_model, eps=1e-5)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.fc_proj = nn.Linear(4 * d_model, d_model)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        x = x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))
        return x


class GPT(nn.Module):
    def __init__(self, vocab, seq_len, n_layer, n_head, d_model):
        super().__init__()
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList([Block(d_model, n_head, seq_len) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(d_model, eps=1e-5)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        # GPT-2 initialisation: N(0, 0.02), zero biases, residual projections scaled.
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        for b in self.blocks:
            nn.init.normal_(b.attn.proj.weight, mean=0.0, std=0.02 / (2 * n_layer) ** 0.5)
            nn.init.normal_(b.fc_proj.weight, mean=0.0, std=0.02 / (2 * n_layer) ** 0.5)

    def forward(self, idx, targets):
        B, T = idx.shape
        pos = torch.arange(T, dtype=torch.long)
        x = self.wte(idx) + self.wpe(pos)
        for b in self.blocks:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def flops_per_token(params, a):
    return 6 * params + 12 * a.n_layer * a.seq_len * a.d_model


def worker(rank, a, port):
    import datetime
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=a.world_size,
                            timeout=datetime.timedelta(seconds=300))

    torch.manual_seed(a.seed)  # same initial weights on every rank (DDP broadcasts anyway)
    model = GPT(a.vocab, a.seq_len, a.n_layer, a.n_head, a.d_model)
    params = sum(p.numel() for p in model.parameters())  # parameters() yields the tied one once
    ddp = DDP(model)
    if a.compile:
        ddp = torch.compile(ddp)

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    foreach = {"auto": None, "on": True, "off": False}[a.foreach]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8, foreach=foreach)

    gen = torch.Generator().manual_seed(a.seed * 1000003 + rank)
    total = a.warmup + a.steps
    data = torch.randint(0, a.vocab, (total, a.batch_per_rank, a.seq_len + 1), generator=gen)
    inputs = data[:, :, :-1].contiguous()
    targets = data[:, :, 1:].contiguous()

    times, losses = [], []
    dist.barrier()
    for step in range(total):
        x, y = inputs[step], targets[step]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast == "bf16"):
            loss = ddp(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        t1 = time.perf_counter()
        losses.append(loss.item())
        if step >= a.warmup:
            times.append((t1 - t0) * 1e3)

    # A data-parallel step is as slow as its slowest rank.
    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    times = t.tolist()
    dist.barrier()
    dist.destroy_process_group()
    if rank != 0:
        return

    med = statistics.median(times)
    mean = statistics.fmean(times)
    tokens_per_step = a.world_size * a.batch_per_rank * a.seq_len
    fpt = flops_per_token(params, a)
    tps = tokens_per_step / (med / 1e3)
    config = {"n_layer": a.n_layer, "n_head": a.n_head, "d_model": a.d_model, "vocab": a.vocab,
              "seq_len": a.seq_len, "batch_per_rank": a.batch_per_rank,
              "dtype": "bf16 autocast" if a.autocast == "bf16" else "fp32", "compile": a.compile,
              "optimizer": "adamw", "adamw_foreach": a.foreach, "seed": a.seed}
    result = {
        "tool": "pytorch-ddp",
        "torch_version": torch.__version__,
        "config": config,
        "params": params,
        "flops_per_token": fpt,
        "step_ms_median": med,
        "step_ms_mean": mean,
        "step_ms_min": min(times),
        "step_ms_max": max(times),
        "step_ms_all": times,
        "tokens_per_s_median": tps,
        "gflops_per_s_total": tps * fpt / 1e9,
        "steps": a.steps,
        "warmup": a.warmup,
        "world_size": a.world_size,
        "threads": a.threads,
        "loss_first": losses[0],
        "loss_last": losses[-1],
    }
    rows = [
        ("torch", torch.__version__),
        ("config", f"L={a.n_layer} H={a.n_head} C={a.d_model} V={a.vocab} T={a.seq_len} "
                   f"B={a.batch_per_rank}/rank"),
        ("ranks x threads", f"{a.world_size} x {a.threads} (gloo, loopback)"),
        ("precision", config["dtype"] + (", torch.compile" if a.compile else ", eager")),
        ("params", f"{params:,}"),
        ("FLOPs/token", f"{fpt:,}"),
        ("steps timed", f"{a.steps} (after {a.warmup} warm-up)"),
        ("step ms median", f"{med:.1f}"),
        ("step ms mean", f"{mean:.1f}  (min {min(times):.1f}, max {max(times):.1f})"),
        ("tokens/s total", f"{tps:,.0f}  ({tps / a.world_size:,.0f} per rank)"),
        ("GFLOP/s total", f"{tps * fpt / 1e9:.1f}"),
        ("loss first/last", f"{losses[0]:.3f} / {losses[-1]:.3f}  (ln V = "
                            f"{torch.log(torch.tensor(float(a.vocab))).item():.3f})"),
    ]
    w = max(len(k) for k, _ in rows)
    print("pytorch-ddp reference")
    for k, v in rows:
        print(f"  {k:<{w}}  {v}")
    if a.json:
        tmp = a.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
        os.replace(tmp, a.json)
        print(f"  wrote {a.json}")


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    a = ARGS
    if not dist.is_available() or not dist.is_gloo_available():
        sys.exit("pytorch_ddp_reference: error: this torch build has no gloo backend")
    if a.compile and not hasattr(torch, "compile"):
        sys.exit(f"pytorch_ddp_reference: error: --compile needs PyTorch 2.x, this is {torch.__version__}")
    if a.json:
        d = os.path.dirname(os.path.abspath(a.json))
        if not os.path.isdir(d) or not os.access(d, os.W_OK):
            sys.exit(f"pytorch_ddp_reference: error: cannot write --json {a.json}: "
                     f"directory {d} does not exist or is not writable")
    try:
        mp.spawn(worker, args=(a, free_port()), nprocs=a.world_size, join=True)
    except Exception as e:  # a rank failed; its traceback was printed by that process
        sys.exit(f"pytorch_ddp_reference: error: a rank failed: {e}")


if __name__ == "__main__":
    main()
