"""A plain PyTorch DDP training loop, instrumented with ftkit's evidence API (lines marked ``# ftkit``).

    torchrun --nproc-per-node 2 examples/ddp_train.py --out runs/ddp
    ftkit analyze-events runs/ddp/events
    ftkit verify-checkpoint runs/ddp/checkpoints --events runs/ddp/events
    torchrun --nproc-per-node 2 --max-restarts 1 examples/ddp_train.py --out runs/ddp   # elastic

A small MLP regresses a fixed random data set (gloo on CPU, or NCCL with ``--device cuda``). Every
rank logs its step outcomes, state fingerprints and the ids of the samples it trained; rank 0 logs
the loss and publishes a guarded checkpoint every ``--checkpoint-every`` steps. A step whose
gradients are not finite is discarded and retried (its samples are trained exactly once). A
restarted job (torchrun's ``--max-restarts``, or the same command again) resumes the run from its
newest trusted checkpoint that ends an epoch, not from step 0.

The loop without ftkit is the same minus the lines marked ``# ftkit`` (the retry of a discarded
step is what a guard asks for: without ftkit, a NaN gradient would silently reach the weights).
The ``--plant-*`` flags plant one fault for ftkit to find (tests/examples use them): a rank's
weights perturbed once (FT101), a sample dropped (FT103) or trained twice (FT104), a NaN gradient
(the guard refuses the checkpoint of that interval); ``--plant-stall`` makes rank 1 of the job's
first attempt wait after a step, to be killed from outside (the elastic restart test);
``--plant-ulp`` moves one weight by one ulp on every rank (a run that ``ftkit compare-runs``
finds diverging from the clean one at that step).
"""

from __future__ import annotations

import argparse
import gc
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import ftkit  # ftkit


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="the run directory (events/, checkpoints/, dumps/)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--samples", type=int, default=32, help="data set size")
    p.add_argument("--batch", type=int, default=4, help="samples per rank and step")
    p.add_argument("--checkpoint-every", type=int, default=4)
    p.add_argument("--device", default="cpu")
    p.add_argument("--plant-divergence", type=int, metavar="STEP", help="perturb rank 1's weights after STEP")
    p.add_argument("--plant-drop", type=int, metavar="ID", help="never train sample ID")
    p.add_argument("--plant-duplicate", type=int, metavar="ID", help="train sample ID twice in its step")
    p.add_argument("--plant-nan", type=int, metavar="STEP", help="a NaN gradient in STEP's first attempt")
    p.add_argument("--plant-ulp", type=int, metavar="STEP", help="every rank moves one weight by 1 ulp after STEP")
    p.add_argument("--plant-stall", type=int, metavar="STEP", help="rank 1 waits after STEP (first attempt only)")
    args = p.parse_args()

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    # torchrun's store outlives a restart and still holds the killed attempt's addresses, which a
    # restarted rank may read before its peer replaces them (gloo: "connect ... refused"): each
    # restart uses keys of its own.
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=not agent and rank == 0)
    backend = "nccl" if args.device == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.PrefixStore(f"restart{restart}", store), rank=rank, world_size=world)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    data = torch.randn(args.samples, 16)
    target = data @ torch.randn(16, 1)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)).to(args.device))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    profile = ftkit.EvidenceProfile(checkpoint_every=args.checkpoint_every)  # ftkit
    run = ftkit.EvidenceRun(args.out, profile, config=vars(args), resume=True)  # ftkit: a restart resumes
    start = run.restore(model, opt)  # ftkit: the checkpoint's state; where to go on (0, 0: a new run)
    per_step = args.batch * world
    step = start.step
    for epoch in range(start.rollout, args.epochs):
        run.allocate(epoch, range(args.samples))  # ftkit: each sample once per epoch
        order = torch.randperm(args.samples, generator=torch.Generator().manual_seed(epoch)).tolist()
        for start in range(0, args.samples - per_step + 1, per_step):
            ids = order[start + rank * args.batch : start + (rank + 1) * args.batch]
            ids = [i for i in ids if i != args.plant_drop] + [i for i in ids if i == args.plant_duplicate]
            for attempt in range(2):
                opt.zero_grad()
                x, y = data[ids].to(args.device), target[ids].to(args.device)
                loss = torch.nn.functional.mse_loss(model(x), y)
                if args.plant_nan == step and attempt == 0 and rank == 0:
                    loss = loss * float("nan")
                loss.backward()
                if run.observe_grads(step, model, rollout=epoch):  # ftkit: the non-finite guard
                    break
                run.step_outcome(step, "discarded", rollout=epoch, attempt=attempt)  # ftkit
            opt.step()
            if args.plant_divergence == step and rank == 1:
                with torch.no_grad():
                    next(model.parameters()).add_(1e-3)
            if args.plant_ulp == step:  # on every rank: replicas stay identical, the run's numerics change
                with torch.no_grad():
                    w = next(model.parameters())
                    w[0, 0] = torch.nextafter(w[0, 0], torch.tensor(float("inf")))
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            evidence = {"model": model, "optimizer": opt, "samples": ids, "rollout": epoch}  # ftkit
            run.step(step, metrics={"loss": mean / world}, attempt=attempt, **evidence)  # ftkit
            if profile.due("checkpoint", step):  # ftkit
                run.publish_checkpoint(step, model, opt, rollout=epoch)  # ftkit
            while args.plant_stall == step and rank == 1 and restart == 0:
                time.sleep(1)  # until killed from outside
            step += 1
    run.close()  # ftkit: a collective (every rank), so destroying the group next is safe
    del model, opt  # DDP's reducer holds the process group: let it go now, not at interpreter exit,
    gc.collect()  # where gloo's threads are torn down without a GIL (SIGABRT "terminate called")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
