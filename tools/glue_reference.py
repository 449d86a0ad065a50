#!/usr/bin/env python3
"""The reference for llmpi's GLUE fine-tuning: the same fine-tune in PyTorch + transformers.

  glue_reference.py --model DIR --data DIR [--epochs 3] [--batch 64] [--lr 2e-5] [--warmup 0]
                    [--weight-decay 0.01] [--seed 42] [--world 2] [--threads 1]
                    [--iters N] [--max-steps N] [--autocast off|bf16] [--json OUT]

DIR of --model is a Hugging Face BERT folder (config.json, model.safetensors; e.g.
pretrained/all-MiniLM-L6-v2 from `make pretrained`). DIR of --data holds the train.h5 and dev.h5
that `llmpi-prep glue` wrote, so both programs read the very same token ids.

It runs transformers' BertForSequenceClassification on --world processes x --threads threads,
data-parallel with PyTorch DDP over gloo (the CPU backend), the way the course's script does:
DistributedSampler (shuffle, seed, no drop_last) with a DataLoader of batch/world examples per
rank, AdamW with weight decay on everything but biases and LayerNorm weights, a linear schedule
(optional warm-up), gradient clipping at 1.0, dropout as the model's config says. It prints the
loss of the first five minibatches, the dev accuracy after every epoch (rank 0 evaluates the
whole dev file), and the mean time per iteration (excluding the first). With --iters N it stops
after N iterations (timing only: no evaluation); with --max-steps N it trains min(N, --epochs'
iterations) iterations, the linear schedule spanning those, and then evaluates once (llmpi's
train.steps N). --autocast bf16 runs every forward (training and
evaluation) under torch.autocast("cpu", torch.bfloat16), the counterpart of llmpi's
runtime.precision bf16; the backward follows the forward's autocast casts. --json writes the same
figures.

Needs (pip): torch, transformers, safetensors, h5py, numpy. Python is only a tool here: neither
`make run` nor `make test` needs it.
"""

import argparse
import json
import os
import statistics
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=64, help="global batch (summed over processes)")
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--warmup", type=int, default=0, help="warm-up steps")
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--iters", type=int, default=0, help="timing: stop after this many iterations")
    p.add_argument("--max-steps", type=int, default=0,
                   help="a short fine-tune: stop after this many iterations, then evaluate")
    p.add_argument("--port", type=int, default=29517)
    p.add_argument("--autocast", choices=("off", "bf16"), default="off",
                   help="bf16: forwards under torch.autocast('cpu', torch.bfloat16)")
    p.add_argument("--json", default="")
    a = p.parse_args()
    if a.batch % a.world:
        sys.exit(f"glue_reference: --batch {a.batch} is not divisible by --world {a.world}")
    for split in ("train", "dev"):
        if not os.path.exists(split_file(a.data, split)):
            sys.exit(f"glue_reference: {a.data} has no {split} split: make it with `llmpi-prep glue ... --out {a.data}`")
    return a


def split_file(data, split):
    """The file of a split of llmpi-prep glue's data set: the one its manifest.json names (a remade
    data set's files are train.g2.h5, ...), else DIR/SPLIT.h5."""
    try:
        with open(os.path.join(data, "manifest.json")) as f:
            shards = json.load(f)["splits"][split]["shards"]
        return os.path.join(data, shards[0]["file"])
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return os.path.join(data, split + ".h5")


def load(path):
    import h5py
    import torch
    with h5py.File(path, "r") as f:
        ids = torch.from_numpy(f["input_ids"][...].astype("int64"))
        types = torch.from_numpy(f["token_type_ids"][...].astype("int64"))
        mask = torch.from_numpy(f["attention_mask"][...].astype("int64"))
        labels = torch.from_numpy(f["labels"][...].astype("int64"))
    return torch.utils.data.TensorDataset(ids, types, mask, labels)


def worker(rank, a, out):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from transformers import BertForSequenceClassification, get_linear_schedule_with_warmup
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(a.threads)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(a.port)
    dist.init_process_group("gloo", rank=rank, world_size=a.world)
    torch.manual_seed(a.seed)
    train = load(split_file(a.data, "train"))
    sampler = torch.utils.data.DistributedSampler(train, num_replicas=a.world, rank=rank, shuffle=True,
                                                  seed=a.seed, drop_last=False)
    loader = torch.utils.data.DataLoader(train, batch_size=a.batch // a.world, sampler=sampler, drop_last=False)
    model = BertForSequenceClassification.from_pretrained(a.model, num_labels=2)
    ddp = DDP(model)
    no_decay = ("bias", "LayerNorm.weight")
    groups = [
        {"params": [p for n, p in model.named_parameters() if not any(k in n for k in no_decay)],
         "weight_decay": a.weight_decay},
        {"params": [p for n, p in model.named_parameters() if any(k in n for k in no_decay)], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, 0.999), eps=1e-8)
    total = len(loader) * a.epochs
    if a.max_steps:
        total = min(total, a.max_steps)
    sched = get_linear_schedule_with_warmup(opt, a.warmup, total)
    losses, iter_s, accuracy = [], [], []
    dev = load(split_file(a.data, "dev")) if rank == 0 and not a.iters else None

    def autocast():
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast == "bf16")

    it = 0
    for epoch in range(a.epochs):
        sampler.set_epoch(epoch)
        ddp.train()
        t_prev = time.perf_counter()
        for ids, types, mask, labels in loader:
            with autocast():
                out_ = ddp(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=labels)
            opt.zero_grad(set_to_none=True)
            out_.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            loss = out_.loss.detach().clone()
            dist.all_reduce(loss)
            loss = loss.item() / a.world
            now = time.perf_counter()
            iter_s.append(now - t_prev)
            t_prev = now
            losses.append(loss)
            if rank == 0 and it < 5:
                print(f"reference: minibatch {it}: loss {loss:.4f}", flush=True)
            it += 1
            if (a.iters and it >= a.iters) or (a.max_steps and it >= a.max_steps):
                break
        if a.iters and it >= a.iters:
            break
        if rank == 0:
            model.eval()
            correct = 0
            with torch.no_grad(), autocast():
                for ids, types, mask, labels in torch.utils.data.DataLoader(dev, batch_size=64):
                    logits = model(input_ids=ids, token_type_ids=types, attention_mask=mask).logits
                    correct += int((logits.argmax(-1) == labels).sum())
            accuracy.append(correct / len(dev))
            print(f"reference: epoch {epoch + 1}: dev accuracy {accuracy[-1]:.4f} ({correct}/{len(dev)})", flush=True)
        dist.barrier()
        if a.max_steps and it >= a.max_steps:
            break
    if rank == 0:
        timed = iter_s[1:] if len(iter_s) > 1 else iter_s
        res = {"program": "pytorch-ddp-gloo", "torch": torch.__version__, "world": a.world, "threads": a.threads,
               "autocast": a.autocast, "global_batch": a.batch, "lr": a.lr, "epochs": a.epochs,
               "iterations": len(iter_s),
               "first_losses": losses[:5], "accuracy_per_epoch": accuracy,
               "mean_iter_s": statistics.mean(timed), "median_iter_s": statistics.median(timed)}
        print(f"reference: {len(iter_s)} iterations, mean {res['mean_iter_s']:.3f} s/iter "
              f"(median {res['median_iter_s']:.3f}, first excluded)", flush=True)
        out.update(res)
        if a.json:
            with open(a.json + ".tmp", "w") as f:
                json.dump(res, f, indent=1)
            os.replace(a.json + ".tmp", a.json)
    dist.destroy_process_group()


def main():
    a = parse_args()
    import torch.multiprocessing as mp
    mp.spawn(worker, args=(a, {}), nprocs=a.world, join=True)


if __name__ == "__main__":
    main()
