"""exit_ranks(): how every multi-rank helper script in tests/ ends (imported from the script's own folder).

Why: a rank that ends through normal interpreter shutdown can abort with SIGABRT, stderr "terminate called
without an active exception". Gloo runs each collective on its own C++ worker threads (ProcessGroupGloo::runLoop);
a worker that finishes a collective wakes the Python caller first and drops its references to the work's tensors
afterwards. Releasing a tensor that Python created needs the GIL; if by then the main thread is finalizing the
interpreter, CPython (3.11) ends the worker with pthread_exit, whose forced unwind through a noexcept C++ frame
calls std::terminate (pytorch/pytorch#38228; the reason for the abandoned atexit proposal pytorch/pytorch#179291).
On an idle machine the worker wins that race; with the other core busy it loses it now and then. A
destroy_process_group() does not close it: it does not join gloo's worker threads (torch 2.13 CPU: a rank's
thread count is 4 after init_process_group and still 4 after destroy_process_group, with or without a live DDP
module), so they are alive when the interpreter finalizes.

The fix: barrier (every rank's collectives are complete, so no peer still reads this rank's socket), destroy the
process group, flush, and leave with os._exit, skipping the interpreter finalization the race needs. A helper
writes its outputs (torch.save, json.dump in with-blocks) before it calls this."""
import os
import sys

import torch.distributed as torch_dist


def exit_ranks(code=0):
    """End this rank (under torchrun; a plain process returns and ends as usual)."""
    if not torch_dist.is_initialized():
        return
    torch_dist.barrier()
    torch_dist.destroy_process_group()
    sys.stdout.flush(), sys.stderr.flush()
    os._exit(code)
