"""The claims ledger: every claim the source articles make, and the notebook that tests it.

Our paraphrases; the report lists each with the verdict a notebook recorded on this machine.
"""

from __future__ import annotations

CLAIMS: dict[str, tuple[str, str]] = {
    "L1": ("More DataLoader workers make loading faster ('use 10 workers').", "02"),
    "L2": ("Each worker holds whole batches, so N workers need about N x the batch RAM.", "02"),
    "L3": ("Keeping images uint8 and normalising on the device cuts batch memory ~5x and speeds host-to-device copies.", "01"),
    "L4": ("Holding the data set in RAM removes the slowest retrieval step; a RAM disk alone may not help when the CPU is the bottleneck.", "01, 03"),
    "L5": ("Preprocess offline (resize, grayscale, ...) once instead of every epoch.", "01"),
    "L6": ("Moving decoding and augmentation to the GPU (DALI-style) can cut epoch time by an order of magnitude.", "03"),
    "L7": ("Decoding CIFAR from lossy JPEG copies instead of the original binary costs accuracy.", "03"),
    "L8": ("Gradient accumulation over k steps gives the same update as a k x larger batch.", "04"),
    "L9": ("Appending the loss tensor (not loss.item()) to a list keeps every step's graph alive and grows memory.", "05"),
    "L10": ("Moving tensors back and forth between CPU and GPU is expensive.", "06"),
    "L11": ("torch.cuda.empty_cache() in a training loop is a bad idea (it stalls).", "06"),
    "L12": ("16-bit mixed precision trains faster and uses less memory; a loss scaler keeps small gradients alive.", "07"),
    "L13": ("On a 506-row data set a GPU is no faster than a CPU and may be slower.", "06"),
    "L14": ("nn.DataParallel gathers outputs on GPU 0 (more memory there); loss inside forward reduces the imbalance.", "08"),
    "L15": ("DistributedDataParallel is much faster than DataParallel on one machine.", "10"),
    "L16": ("DataParallel checkpoints carry a 'module.' prefix; loading elsewhere needs map_location.", "06"),
    "L17": ("Splitting a model across devices works, but sequential stages idle and the hand-off costs.", "09"),
    "L18": ("Data parallelism needs the batch (and often the learning rate) scaled; batch-norm statistics become per device.", "04, 10"),
    "L19": ("Use an even number of GPUs; an odd number may crash training.", "10"),
    "L20": ("A Python loop over elements in a custom loss is slow; the vectorised version can be ~100x faster.", "11"),
    "L21": ("Profile first: find whether training is CPU-, I/O- or GPU-bound before optimising.", "11"),
    "L22": ("Faster hardware can be worth more than further code optimisation (time vs money).", "12"),
    "L23": ("d2l ResNet-18 on Fashion-MNIST: 1 GPU 0.93 acc at 12.2 s/epoch; 2 GPUs batch 512 lr 0.2 faster but accuracy dropped.", "12"),
}

# Verdicts start with one of these; "holds only when" is followed by the condition.
VERDICT_KINDS = (
    "holds",
    "holds only when",
    "does not hold here",
    "needs a GPU",
    "needs >=2 GPUs",
    "needs the real data set",
)
