"""A Hugging Face-style loop: text tokenized in the collate function (a character tokenizer
padding each batch), a small embedding model, AdamW and a linear warm-up schedule.
expect: input-bound
"""

import random

import torch
from torch import nn
from torch.utils.data import DataLoader

torch.manual_seed(0)
torch.set_num_threads(1)
random.seed(0)
WORDS = ["fast", "slow", "gpu", "cpu", "data", "loader", "batch", "tensor", "kernel", "graph"]
texts = [" ".join(random.choices(WORDS, k=random.randint(20, 60))) for _ in range(2048)]
labels = [len(t) % 2 for t in texts]


def tokenize(text, max_len=256):
    ids = [min(ord(c), 255) for c in text][:max_len]
    for _ in range(40):  # a tokenizer's per-text work: normalisation passes, merges
        ids = [(i * 31 + 7) % 256 for i in ids]
    return ids


def collate(batch):
    ids = [tokenize(t) for t, _ in batch]
    width = max(map(len, ids))
    x = torch.tensor([i + [0] * (width - len(i)) for i in ids])
    return {"input_ids": x, "labels": torch.tensor([label for _, label in batch])}


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.EmbeddingBag(256, 32)
        self.head = nn.Linear(32, 2)

    def forward(self, input_ids, labels):
        logits = self.head(self.emb(input_ids))
        return nn.functional.cross_entropy(logits, labels)


model = Classifier()
loader = DataLoader(list(zip(texts, labels)), batch_size=16, shuffle=True, collate_fn=collate)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10))
for epoch in range(100):
    for batch in loader:
        loss = model(**batch)
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
