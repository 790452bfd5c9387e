"""Before a cluster run is submitted (a Slurm array, a hostfile run over ssh): probe the inputs and the output once,
from the submitting machine, so that thousands of tasks are never started for a bucket the run cannot read or write,
or for a text field the inputs do not have.

``preflight`` lists the inputs (as every task will), probes the first input of each kind (a few KB of reads: the
credentials, the permissions, the text field: read/probe.py) and proves the output writable: on object storage by
writing and deleting a probe object; locally by a probe file in the directory, or, when it does not exist yet, by
its nearest existing parent being writable (a dry run creates nothing). Each task probes again when it starts (the
nodes may differ from this machine), at the same small cost.
"""

from __future__ import annotations

import os
from typing import Dict, List, Optional

from data_prep import io, objstore
from data_prep.read.probe import probe_inputs
from data_prep.read.units import list_inputs
from data_prep.settings import DEFAULT_MAX_RECORD


def preflight(inputs: List[str], output_dir: str, text_field: str = "text",
              storage_options: Optional[Dict[str, object]] = None, upload_part_size: int = objstore.UPLOAD_PART,
              max_record: int = DEFAULT_MAX_RECORD) -> List[str]:
    """Probe; returns one line per check for the report, or raises (ProbeError, PlanError, PermissionError /
    StorageAccessError), each a one-line message the CLI prints before exiting 2."""
    io.configure(storage_options or {}, upload_part_size)
    pieces = list_inputs(inputs, output=output_dir)
    lines = [f"inputs: {len(pieces):,} file(s) or object(s) listed"]
    lines += probe_inputs(pieces, text_field, max_record)
    lines.append(probe_output(output_dir))
    return lines


def probe_output(output_dir: str) -> str:
    out = io.abspath(output_dir)
    if io.is_url(out):
        io.check_writable(out)  # a probe object written and deleted
        return f"output {objstore.redact(out)}: writable (a probe object was written and deleted)"
    if os.path.isdir(out):
        io.check_writable(out)  # a probe file written and deleted
        return f"output {out}: writable"
    parent = out
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(f"output directory {out} cannot be created: {parent} is not a writable directory; "
                              "choose another --output")
    return f"output {out}: can be created (under {parent})"
