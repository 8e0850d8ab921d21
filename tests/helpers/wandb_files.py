"""Reads an offline W&B run back from its `run-<id>.wandb` file, as `wandb sync` would upload it.

The file is a LevelDB-style log (wandb's own format): a 7-byte header (":W&B", magic 0xBEE1, version 0), then
32 KiB blocks of chunks, each with a 7-byte header (CRC32, length, type: full, first, middle, last), holding
`wandb_internal_pb2.Record` protobufs. Test-only: the layout is wandb's, not a public API.
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

from wandb.proto import wandb_internal_pb2

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[wandb_internal_pb2.Record]:
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    out, pending, pos = [], b"", HEADER
    while pos < len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        if pos + HEADER > len(data):
            break  # a file still being written
        _, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if kind == 0:  # zero padding to the end of the block
            pos += left
            continue
        if pos + HEADER + length > len(data):
            break
        chunk = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind in (FULL, FIRST):
            pending = chunk
        else:
            pending += chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
    return out


def complete_records(path: Path, timeout: float = 60.0) -> list[wandb_internal_pb2.Record]:
    """The run's records once its file ends with the `exit` record. wandb.finish() returns when the SDK is done,
    but wandb-core's writer may still be flushing the file: on a loaded machine (CI, 1 read in ~40) the file read
    right after holds only its header."""
    deadline = time.monotonic() + timeout
    while True:
        found = records(path)
        if any(r.WhichOneof("record_type") == "exit" for r in found) or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def _key(item) -> str:
    return item.key or "/".join(item.nested_key)


def offline_run(run_dir: Path) -> dict:
    """{"name", "group", "tags", "entity", "project", "notes", "config": {key: value}, "history": [{metric: value}],
    "summary": {metric: value}}."""
    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    run = {"config": {}, "history": [], "summary": {}}
    for record in complete_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.update(name=record.run.display_name, group=record.run.run_group, tags=list(record.run.tags))
            run.update(entity=record.run.entity, project=record.run.project, notes=record.run.notes)
        elif kind == "config":
            run["config"].update({_key(i): json.loads(i.value_json) for i in record.config.update})
        elif kind == "history":
            run["history"].append({_key(i): json.loads(i.value_json) for i in record.history.item})
        elif kind == "summary":
            run["summary"].update({_key(i): json.loads(i.value_json) for i in record.summary.update})
    return run
