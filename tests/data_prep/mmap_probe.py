"""Run by test_dp_gigatoken in a fresh interpreter (a tokenize worker's heap, not a long-lived pytest worker's, whose
free heap chunks could serve any probe): frees a 16 MB block (raising glibc's dynamic mmap threshold, as the
tokenizer.json conversion does), builds the gigatoken encoder for the model in argv[1], frees another 16 MB block,
then prints as JSON whether blocks of a grown cache table's size and of a batch array's size are mmapped."""
import ctypes
import json
import sys

from data_prep.steps.gigatoken_bpe import MMAP_THRESHOLD, GigatokenBPE
from data_prep.steps.tokenizers import load_tokenizer


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]


libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes, libc.mallinfo2.restype = [ctypes.c_void_p], _MallInfo2


def is_mmapped(size: int) -> bool:
    """Whether glibc serves a block of ``size`` bytes as its own mapping (its count of mmapped blocks goes up)."""
    before = libc.mallinfo2().hblks
    p = libc.malloc(size)
    try:
        return libc.mallinfo2().hblks == before + 1
    finally:
        libc.free(p)


libc.free(libc.malloc(16 << 20))
g, why = GigatokenBPE.build(load_tokenizer(sys.argv[1]))
libc.free(libc.malloc(16 << 20))
print(json.dumps({"why": why, "pinned": bool(g and g.pinned), "table": is_mmapped(2 * MMAP_THRESHOLD),
                  "small": is_mmapped(MMAP_THRESHOLD // 4)}))
