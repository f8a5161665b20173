"""What every rule script does around its entry point: log, seeds, threads, and a traceback in the log.

Torch-free, so that jobs which only read tables and draw figures never import it."""

from __future__ import annotations

import contextlib
import random
import sys
import traceback

import numpy as np


def seed_everything(seed: int, threads: int | None = None) -> None:
    """Seed Python's and NumPy's generators, and torch's (with its thread count) when the job imported it:
    every entry module that uses torch imports it at module level, before the job starts."""
    random.seed(seed)
    np.random.seed(seed)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(seed)
        if threads:
            torch.set_num_threads(threads)


@contextlib.contextmanager
def job(smk):
    """Set up a rule script: stderr/stdout (tqdm progress included) to the rule's log, seeds and threads
    from the rule; a failure's traceback goes to the log before Snakemake reports it."""
    log = open(smk.log[0], "w", buffering=1) if smk.log else None
    with contextlib.ExitStack() as stack:
        if log is not None:
            stack.enter_context(log)
            stack.enter_context(contextlib.redirect_stderr(log))
            stack.enter_context(contextlib.redirect_stdout(log))
        seed_everything(smk.params.get("seed", 0), smk.threads)
        try:
            yield
        except BaseException:
            traceback.print_exc(file=sys.stderr)
            raise
