"""Fixed-shape tensor collectives for the few small values the training loop exchanges besides the model's own
(a host name per rank, a float per rank): no pickled Python object crosses the network (torch's *_object
collectives unpickle whatever arrives on an unauthenticated rendezvous, which could run code)."""
from __future__ import annotations

import torch

TEXT_BYTES = 256  # a host name is at most 253 bytes (RFC 1035); longer text is cut


def encode_text(text: str, size: int = TEXT_BYTES) -> torch.Tensor:
    """`text` as `size` bytes of UTF-8, cut to fit and padded with zeros."""
    data = text.encode("utf-8")[:size]
    out = torch.zeros(size, dtype=torch.uint8)
    out[:len(data)] = torch.tensor(list(data), dtype=torch.uint8)
    return out


def decode_text(t: torch.Tensor) -> str:
    return bytes(t.cpu().tolist()).rstrip(b"\0").decode("utf-8", errors="replace")


def all_gather_strings(text: str, world: int, device: torch.device) -> list[str]:
    """Collective: every rank's `text`, in rank order."""
    mine = encode_text(text).to(device)
    out = [torch.empty_like(mine) for _ in range(world)]
    torch.distributed.all_gather(out, mine)
    return [decode_text(t) for t in out]


def all_gather_floats(value: float, world: int, device: torch.device) -> list[float]:
    """Collective: every rank's `value`, in rank order (all_gather of one float64 each: gloo and NCCL alike)."""
    mine = torch.tensor([value], dtype=torch.float64, device=device)
    out = [torch.empty_like(mine) for _ in range(world)]
    torch.distributed.all_gather(out, mine)
    return [float(t) for t in out]
