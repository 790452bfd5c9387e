"""The shared-memory copy an async save writes: the same file as a save of the live state, untouched by later updates,
written by a long-lived writer process (forked at the rank's start, else spawned) that reports failures and does
not outlive its rank."""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from collections import OrderedDict

import pytest
import torch

from recipes.checkpoint import safe_load
from recipes.checkpoint.format import checksums
from recipes.checkpoint.shm_writer import Arena, BackgroundWriter, unpack
from recipes.checkpoint.writer import FileEngine, TagWrite, write_durably
from tests.support.runs import REPO, worker_env
from tests.support.tamper import damage



def _state():
    """Shaped like DeepSpeed's files: parameters as views of one flat buffer, a state dict with _metadata, an object
    (DeepSpeed's loss scaler) referenced twice, Adam moments, plain values."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler

    flat = torch.arange(12, dtype=torch.float32)
    weights = OrderedDict(w=flat[:8].view(2, 4), b=flat[8:])
    weights._metadata = OrderedDict({"": {"version": 1}})
    scaler = LossScaler(scale=1.0)
    param = torch.nn.Parameter(torch.ones(3))
    return {"module": weights, "optimizer": {"state": {0: {"exp_avg": torch.full((3,), 0.5), "step": 7}},
                                             "loss_scaler": scaler, "param_groups": [{"lr": 1e-3, "params": [0]}]},
            "scaler_again": scaler, "param": param, "shapes": {"w": torch.Size([2, 4])}, "dtype": torch.float32,
            "ds_version": "0.19.8", "flat": flat}


def _records(path) -> dict[str, bytes]:
    """The zip members of a torch.save file, minus the random id torch stamps on every save."""
    with zipfile.ZipFile(path) as z:
        return {n.split("/", 1)[1]: z.read(n) for n in z.namelist() if not n.endswith("serialization_id")}


def _snapshot(arena: Arena, state):
    """What the writer process sees: the state rebuilt from the arena."""
    return unpack(arena.pack(state), {i: m for i, (_, m) in enumerate(arena.segments)})


@pytest.mark.unit
def test_arena_copy_writes_the_same_file_as_the_live_state(tmp_path):
    state, arena = _state(), Arena()
    write_durably(state, tmp_path / "live.pt")
    write_durably(_snapshot(arena, state), tmp_path / "copy.pt")
    assert _records(tmp_path / "copy.pt") == _records(tmp_path / "live.pt")


@pytest.mark.unit
def test_arena_copy_keeps_sharing_and_reuses_the_arena_across_saves():
    state, arena = _state(), Arena()
    snap = _snapshot(arena, state)
    # views of one flat buffer still share one (new) storage; the object referenced twice is one object
    assert snap["module"]["w"].untyped_storage().data_ptr() == snap["flat"].untyped_storage().data_ptr()
    assert snap["flat"].untyped_storage().data_ptr() != state["flat"].untyped_storage().data_ptr()
    assert snap["optimizer"]["loss_scaler"] is snap["scaler_again"] is not state["scaler_again"]
    assert isinstance(snap["param"], torch.nn.Parameter) and snap["module"]._metadata == state["module"]._metadata
    first = snap["flat"].untyped_storage().data_ptr()
    arena.reset()  # the next save: same places, no new segment
    assert _snapshot(arena, state)["flat"].untyped_storage().data_ptr() == first and len(arena.segments) == 1


@pytest.mark.multiproc
def test_writer_process_writes_the_state_of_the_save_step(tmp_path):
    state = _state()
    before = tmp_path / "before.pt"
    write_durably(state, before)
    bw = BackgroundWriter()
    try:
        files = FileEngine()
        files.collect(bw.arena)
        files.save(state, str(tmp_path / "snap.pt"))
        bw_files, _ = files.take()
        write = TagWrite(bw_files, [], tmp_path, background=bw)
        # the next optimizer step, in place, while the writer process writes the copy
        state["flat"].add_(100.0)
        state["optimizer"]["state"][0]["exp_avg"].mul_(3.0)
        state["optimizer"]["loss_scaler"].cur_scale = 4.0
        write.wait()
        assert write.error is None and write.bytes == (tmp_path / "snap.pt").stat().st_size
        assert _records(tmp_path / "snap.pt") == _records(before)
        loaded = torch.load(tmp_path / "snap.pt", weights_only=False)
        assert torch.equal(loaded["module"]["b"], torch.tensor([8.0, 9.0, 10.0, 11.0]))
        pid = bw._proc.pid
        # a second save through the same process (and arena)
        files.collect(bw.arena)
        files.save(state, str(tmp_path / "snap2.pt"))
        write = TagWrite(files.take()[0], [], tmp_path, background=bw)
        write.wait()
        assert write.error is None and bw._proc.pid == pid
        assert torch.equal(torch.load(tmp_path / "snap2.pt", weights_only=False)["flat"][8:], state["flat"][8:])
    finally:
        bw.close()


@pytest.mark.multiproc
def test_a_failed_background_write_is_reported_to_the_rank(tmp_path):
    bw = BackgroundWriter()
    try:
        missing = tmp_path / "no_such_dir" / "x.pt"
        write = TagWrite([(str(missing), bw.arena.pack({"t": torch.zeros(2)}))], [], tmp_path, background=bw)
        write.wait()
        assert write.done() and isinstance(write.error, OSError) and write.error.errno == errno.ENOENT, write.error
        # a writer that dies is a failed save, and the next save gets a fresh writer
        bw._proc.kill()
        bw._proc.join()
        write = TagWrite([], [], tmp_path, background=bw)
        write.wait()
        assert write.error is None
    finally:
        bw.close()


@pytest.mark.multiproc
def test_a_writer_that_dies_mid_save_is_a_failed_save(tmp_path):
    bw = BackgroundWriter()
    try:
        bw.arena.reset()
        job = (str(tmp_path / "big.pt"), bw.arena.pack({"t": torch.zeros(64 << 20, dtype=torch.uint8)}))
        write = TagWrite([job], [], tmp_path, background=bw, max_bytes_per_s=4 << 20)  # ~16 s of writing
        time.sleep(1.0)
        assert not write.done()
        bw._proc.kill()
        write.wait()
        assert isinstance(write.error, RuntimeError) and "writer process ended" in str(write.error), write.error
    finally:
        bw.close()


@pytest.mark.multiproc
def test_a_preemption_signal_does_not_kill_the_writer_and_a_wait_lifts_the_cap(tmp_path):
    """stop.sh / scancel signal every process of the run, the writer too: the rank's stop save must still be written.
    And the stop waits for that write: from then on it goes uncapped."""
    bw = BackgroundWriter()
    try:
        TagWrite([], [], tmp_path, background=bw).wait()  # the writer is up (torch imported, signals set)
        state = {"t": torch.arange(64 << 20, dtype=torch.uint8)}  # 64 MiB
        write_durably(state, tmp_path / "live.pt")
        bw.arena.reset()
        job = (str(tmp_path / "big.pt"), bw.arena.pack(state))
        write = TagWrite([job], [], tmp_path, background=bw, max_bytes_per_s=1 << 20)  # ~64 s capped
        time.sleep(1.0)
        assert not write.done()
        for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
            os.kill(bw._proc.pid, sig)
        time.sleep(0.5)
        assert bw._proc.is_alive() and not write.done()
        waited = time.monotonic()
        write.wait()
        waited = time.monotonic() - waited
        assert write.error is None, write.error
        assert _records(tmp_path / "big.pt") == _records(tmp_path / "live.pt")
        # capped, the rest would take ~60 s more; uncapped it is a 64 MiB write (generous for a loaded machine)
        assert waited < 40, f"the wait took {waited:.1f} s: the write stayed capped at 1 MiB/s"
    finally:
        bw.close()


@pytest.mark.multiproc
def test_the_writer_process_dies_with_its_rank(tmp_path):
    # a no-op write first: the writer is up (torch imported), so the deadline below is only about dying
    rank = subprocess.Popen([sys.executable, "-c", "import sys, time\n"
                             "from recipes.checkpoint.shm_writer import BackgroundWriter\n"
                             "from recipes.checkpoint.writer import TagWrite\n"
                             "w = BackgroundWriter()\nTagWrite([], [], sys.argv[1], background=w).wait()\n"
                             "print('writer', w._proc.pid, flush=True)\ntime.sleep(600)", str(tmp_path)],
                            stdout=subprocess.PIPE, text=True, cwd=REPO, env=worker_env())
    try:
        writer = next(int(line.split()[1]) for line in rank.stdout if line.startswith("writer "))  # after DeepSpeed's
        os.kill(writer, 0)  # alive while its rank is
    finally:
        rank.kill()
        rank.wait()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            os.kill(writer, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(writer, signal.SIGKILL)
    pytest.fail(f"the writer process {writer} outlived its killed rank")


def _ended(pid: int) -> bool:
    """Exited: gone, or a zombie its (sleeping) parent has not reaped yet."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


PREFORK = r'''
import os, sys, threading, time, torch
from recipes.checkpoint import shm_writer
from recipes.checkpoint.writer import FileEngine, TagWrite, write_durably
out = sys.argv[1]
if sys.argv[2] == "thread":  # a thread running: forking now would be unsafe, the writer is spawned later
    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
print("preforked", shm_writer.prefork(), flush=True)
state = {"w": torch.arange(6.0)}  # made after the fork: the writer gets it through the arena only
bw = shm_writer.BackgroundWriter()
print("start", bw._proc._start_method, flush=True)
files = FileEngine()
files.collect(bw.arena)
files.save(state, os.path.join(out, "w.pt"))
write = TagWrite(files.take()[0], [], out, background=bw)
state["w"].add_(100.0)  # the next step, while the copy is written
write.wait()
print("error", write.error, flush=True)
print("writer", bw._proc.pid, flush=True)
bw._conn.close()  # the rank's end of the pipe gone (as when the rank dies), no "stop" message
time.sleep(600)
'''


@pytest.mark.multiproc
@pytest.mark.parametrize("when", ["single-threaded", "thread"])
def test_a_writer_forked_at_the_ranks_start_writes_and_leaves_with_the_pipe(tmp_path, when):
    """prefork() at a single-threaded start forks the writer (torch already imported: no second import); with a
    thread running it declines and the writer is spawned. Either writes the step's copy, and leaves once its rank's
    end of the pipe is closed (a forked writer must not hold the rank's end open itself)."""
    rank = subprocess.Popen([sys.executable, "-c", PREFORK, str(tmp_path), when], stdout=subprocess.PIPE, text=True,
                            cwd=REPO, env=worker_env())
    said = {}
    try:
        for line in rank.stdout:
            key, value = line.split(" ", 1)
            said[key] = value.strip()
            if key == "writer":
                break
        assert said.get("preforked") == str(when == "single-threaded"), said
        assert said.get("start") == ("fork" if when == "single-threaded" else "spawn"), said
        assert said.get("error") == "None", said
        assert torch.equal(torch.load(tmp_path / "w.pt")["w"], torch.arange(6.0))
        writer, deadline = int(said["writer"]), time.monotonic() + 60
        while time.monotonic() < deadline:  # the rank still lives (asleep): only the closed pipe can end the writer
            if _ended(writer):
                break
            time.sleep(0.1)
        else:
            os.kill(writer, signal.SIGKILL)
            pytest.fail(f"the writer {writer} kept running after its rank closed the pipe")
        assert rank.poll() is None
    finally:
        rank.kill()
        rank.wait()


@pytest.mark.multiproc
def test_a_rank_that_exits_during_start_up_is_not_held_by_its_preforked_writer(tmp_path):
    """A writer forked at the rank's start and not yet adopted ends on the SIGTERM multiprocessing sends its daemon
    children at exit: the rank (a normal interpreter exit, e.g. Ctrl-C during the rendezvous) leaves at once."""
    script = ("import sys\nfrom recipes.checkpoint import shm_writer\nassert shm_writer.prefork()\n"
              "print('writer', shm_writer._preforked[0].pid, flush=True)\nsys.exit(3)\n")
    r = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=worker_env(), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 3, r.stderr[-3000:]
    writer = int(r.stdout.split()[1])
    assert _ended(writer)


@pytest.mark.unit
def test_a_sync_save_records_each_files_checksum_and_a_damaged_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    files = FileEngine()
    files.save(_state(), str(tmp_path / "a.pt"))  # sync: written now
    _, written = files.take()
    write = TagWrite([(str(tmp_path / "b.pt"), _state())], written, tmp_path, digests=files.take_digests())
    assert write.error is None
    recorded = json.loads((tmp_path / "checksums_rank3.json").read_text())
    assert recorded == {n: checksums.digest(tmp_path / n) for n in ("a.pt", "b.pt")}
    torch.save({"t": torch.ones(3)}, tmp_path / "unrecorded.pt")  # a file no save of ours wrote: read as before
    assert torch.equal(safe_load.load(tmp_path / "unrecorded.pt")["t"], torch.ones(3))
    b_size = (tmp_path / "b.pt").stat().st_size
    damage(tmp_path / "b.pt", offset=b_size // 2, length=1)  # one byte, in a tensor's data
    with pytest.raises(checksums.ChecksumError, match="b.pt: its content is not what was written"):
        safe_load.load(tmp_path / "b.pt")
    assert safe_load.load(tmp_path / "a.pt")["flat"].numel() > 0
