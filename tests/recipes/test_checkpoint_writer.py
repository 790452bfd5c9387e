"""The host copy an async save writes: the same file as a save of the live state, and untouched by later updates."""
from __future__ import annotations

import errno
import zipfile
from collections import OrderedDict

import pytest
import torch

from recipes.checkpoint.writer import TagWrite, host_copy, write_durably

pytestmark = pytest.mark.unit


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


def test_host_copy_writes_the_same_file_as_the_live_state(tmp_path):
    state = _state()
    write_durably(state, tmp_path / "live.pt")
    write_durably(host_copy(state), tmp_path / "copy.pt")
    assert _records(tmp_path / "copy.pt") == _records(tmp_path / "live.pt")


def test_host_copy_keeps_sharing_and_is_independent_of_later_updates(tmp_path):
    state = _state()
    snap = host_copy(state)
    # views of one flat buffer still share one (new) storage; the object referenced twice is copied once
    assert snap["module"]["w"].untyped_storage().data_ptr() == snap["flat"].untyped_storage().data_ptr()
    assert snap["flat"].untyped_storage().data_ptr() != state["flat"].untyped_storage().data_ptr()
    assert snap["optimizer"]["loss_scaler"] is snap["scaler_again"] is not state["scaler_again"]
    assert isinstance(snap["param"], torch.nn.Parameter) and snap["module"]._metadata == state["module"]._metadata

    before = tmp_path / "before.pt"
    write_durably(state, before)
    # the next optimizer step, in place, while the copy waits for the background writer
    state["flat"].add_(100.0)
    state["optimizer"]["state"][0]["exp_avg"].mul_(3.0)
    state["optimizer"]["loss_scaler"].cur_scale = 4.0
    TagWrite([(str(tmp_path / "snap.pt"), snap)], [], tmp_path, background=True).wait()
    assert _records(tmp_path / "snap.pt") == _records(before)
    loaded = torch.load(tmp_path / "snap.pt", weights_only=False)
    assert torch.equal(loaded["module"]["b"], torch.tensor([8.0, 9.0, 10.0, 11.0]))


def test_a_failed_background_write_is_reported_to_the_parent(tmp_path):
    missing = tmp_path / "no_such_dir" / "x.pt"
    write = TagWrite([(str(missing), {"t": torch.zeros(2)})], [], tmp_path, background=True)
    write.wait()
    assert write.done() and isinstance(write.error, OSError) and write.error.errno == errno.ENOENT, write.error
