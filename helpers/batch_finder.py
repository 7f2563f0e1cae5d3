"""Find the largest batch size that fits: double until it does not, then bisect back.

    def try_batch(bs):             # run one training step at this batch size,
        X = torch.randn(bs, 3, 32, 32, device=device)   # return the bytes it needed
        return memory.step_memory(net, X, y[:bs])["peak_bytes"]
    found = largest_batch(try_batch, budget_bytes=2 * 2**30, max_batch=4096)
    found.batch_size, found.tried

A batch "does not fit" when the step raises an out-of-memory error (`torch.OutOfMemoryError`
on a GPU, the CPU allocator's "not enough memory" `RuntimeError`), or when the bytes it
reports exceed `budget_bytes` (how a CPU run, which would rather swap than fail, stays within a
budget). After a failure the memory is freed (`gc.collect`, `torch.cuda.empty_cache`) before
the next try, so the search never leaves the device full.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from . import devices
from .checks import check_int, check_number

_OOM_WORDS = ("out of memory", "not enough memory", "can't allocate memory", "failed to allocate")


def is_oom(err: BaseException) -> bool:
    """True for the errors a too-large allocation raises on a GPU or a CPU."""
    if isinstance(err, torch.OutOfMemoryError):
        return True
    return isinstance(err, RuntimeError) and any(w in str(err).lower() for w in _OOM_WORDS)


def free_memory() -> None:
    """Drop what a failed try left behind, so the next try starts clean."""
    gc.collect()
    devices.empty_cache()


@dataclass
class BatchSearch:
    batch_size: int  # the largest that fitted (0: not even `start` fitted)
    tried: list[tuple[int, bool, int | None, str]] = field(default_factory=list)
    # (batch size, fitted?, bytes reported or None, reason it failed or "")

    def describe(self) -> str:
        rows = [f"  batch {bs:>6}: " + ("fits" if ok else f"does not fit ({why})")
                + (f", {b / 2**20:.1f} MiB" if b is not None else "")
                for bs, ok, b, why in self.tried]
        text = f"largest batch that fits: {self.batch_size}\n" + "\n".join(rows)
        print(text)
        return text


def largest_batch(try_batch: Callable[[int], int | None], *, start: int = 1,
                  max_batch: int = 65536, budget_bytes: int | None = None,
                  multiple_of: int = 1, progress: bool = False) -> BatchSearch:
    """Largest batch size `b` in [start, max_batch] for which `try_batch(b)` fits.

    `try_batch(b)` runs one step at batch size `b` and returns the bytes it needed (or None);
    it fits unless it raises an out-of-memory error or returns more than `budget_bytes`. Other
    errors propagate. Search: double from `start`, then bisect between the last batch that fit
    and the first that did not, down to `multiple_of`. Assumes memory grows with the batch.
    `progress=True` shows a `tqdm.auto` bar, one tick per try (a search can take many seconds).
    """
    for name, v in (("start", start), ("max_batch", max_batch), ("multiple_of", multiple_of)):
        check_int(name, v, 1, where="largest_batch")
    if max_batch < start:
        raise ValueError(f"largest_batch: max_batch ({max_batch}) must be >= start ({start})")
    check_number("budget_bytes", budget_bytes, where="largest_batch", allow_none=True)
    if not callable(try_batch):
        raise TypeError("largest_batch: try_batch must be a callable batch_size -> bytes")
    if not isinstance(progress, bool):
        raise ValueError(f"largest_batch: progress must be True or False, got {progress!r}")
    bar = tqdm(desc="batch search", unit="try", disable=not progress, leave=False)
    try:
        return _search(try_batch, start, max_batch, budget_bytes, multiple_of, bar)
    finally:
        bar.close()


def _search(try_batch: Callable[[int], int | None], start: int, max_batch: int,
            budget_bytes: int | None, multiple_of: int, bar: tqdm) -> BatchSearch:
    result = BatchSearch(batch_size=0)

    def fits(bs: int) -> bool:
        bar.set_postfix(batch=bs)
        bar.update()
        oom = False
        try:
            used = try_batch(bs)
        except (torch.OutOfMemoryError, RuntimeError) as e:
            if not is_oom(e):
                raise
            oom = True
        if oom:
            # Freed only here: inside the except block the exception's traceback still holds the
            # failed try's frame, and with it the tensors that filled the device.
            free_memory()
            result.tried.append((bs, False, None, "out of memory"))
            return False
        if budget_bytes is not None and used is not None and used > budget_bytes:
            free_memory()
            result.tried.append((bs, False, int(used), f"over the {budget_bytes / 2**20:.0f} MiB budget"))
            return False
        result.tried.append((bs, True, None if used is None else int(used), ""))
        return True

    if not fits(start):
        return result
    good, bad = start, None
    while bad is None and good < max_batch:
        nxt = min(good * 2, max_batch)
        if fits(nxt):
            good = nxt
        else:
            bad = nxt
    if bad is not None:
        while bad - good > multiple_of:
            mid = (good + bad) // 2
            mid -= mid % multiple_of
            if mid <= good:
                break
            if fits(mid):
                good = mid
            else:
                bad = mid
    result.batch_size = good
    return result
