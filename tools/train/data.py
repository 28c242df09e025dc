"""Token streams and the evaluation protocol shared by training, export and golden files.

Evaluation protocol (any engine that reports perplexity on the shipped split follows it):
each document (one line of the text file) is encoded without BOS/EOS, EOS is appended, the
result is cut into consecutive chunks of at most 511 tokens, and each chunk c is scored as
input [BOS] + c with targets c: every token of every document, and its EOS, is predicted
exactly once, each window starting with BOS as the tokenizer config's add_bos_token says.
"""
import torch

BOS, EOS = 1, 2
EVAL_CHUNK = 511


def encode_docs(sp, path):
    with open(path, encoding="utf-8") as f:
        return [sp.encode(line.rstrip("\n")) + [EOS] for line in f if line.strip()]


def eval_windows(docs):
    for ids in docs:
        for s in range(0, len(ids), EVAL_CHUNK):
            chunk = ids[s:s + EVAL_CHUNK]
            yield [BOS] + chunk, chunk


@torch.no_grad()
def evaluate(model, docs, autocast=True):
    """Returns (mean negative log-likelihood per token, token count)."""
    model.eval()
    total, count = 0.0, 0
    for inp, tgt in eval_windows(docs):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits, _ = model(torch.tensor([inp]))
        logp = torch.log_softmax(logits[0, :len(tgt)].float(), dim=-1)
        total -= logp[torch.arange(len(tgt)), torch.tensor(tgt)].sum().item()
        count += len(tgt)
    model.train()
    return total / count, count
