"""Driven by tests/mount_prefetch.rs: the sampler helper with torch's DataLoader over a rapidfs
mount ($MNT, dataset under $MNT/ds, expected "name sha256" lines on stdin).

Checks that with 0, 2 and 4 workers every index is yielded once per epoch and every sample's
bytes are right, prints the mount's prefetch stats after a run without the helper and after
the runs with it, and that a missing socket costs exactly one warning while indices still flow.
"""

import hashlib
import json
import os
import socket
import sys
import warnings

import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler

from rapidfs_sampler import RapidfsSampler, socket_path

root = os.environ["MNT"]
want = dict(line.split() for line in sys.stdin)


class Files(Dataset):
    def __init__(self, top):
        self.paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(top) for f in fs)

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        with open(self.paths[i], "rb") as f:
            data = f.read()
        return i, os.path.relpath(self.paths[i], root), hashlib.sha256(data).hexdigest()


def stats():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(socket_path(root))
    s.sendall(b'{"op":"stats"}\n')
    reply = json.loads(s.makefile("rb").readline())
    s.close()
    return reply


def epoch(loader, n):
    seen = []
    for batch in loader:
        for i, name, digest in batch:
            assert want[name] == digest, (name, digest)
            seen.append(i)
    assert sorted(seen) == list(range(n)), (len(seen), n)


collate = lambda batch: batch  # noqa: E731

# Each run reads its own files: what one run loaded must not make the next one look good.
plain_ds = Files(os.path.join(root, "ds", "plain"))
plain = DataLoader(plain_ds, batch_size=8, sampler=RandomSampler(plain_ds), num_workers=2,
                   collate_fn=collate)
epoch(plain, len(plain_ds))
print(json.dumps({"phase": "plain", **stats()}))

for workers in (0, 2, 4):
    ds = Files(os.path.join(root, "ds", "w%d" % workers))
    sampler = RapidfsSampler(RandomSampler(ds), ds.paths, root)
    loader = DataLoader(ds, batch_size=8, sampler=sampler, num_workers=workers, collate_fn=collate)
    for _ in range(2):
        epoch(loader, len(ds))
print(json.dumps({"phase": "hinted", **stats()}))

os.environ["RAPIDFS_CONTROL_SOCKET"] = "/nonexistent/rapidfs.sock"
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    sampler = RapidfsSampler(RandomSampler(ds), ds.paths, root)
    loader = DataLoader(ds, batch_size=8, sampler=sampler, num_workers=2, collate_fn=collate)
    epoch(loader, len(ds))
    epoch(loader, len(ds))
ours = [w for w in caught if "rapidfs_sampler" in str(w.message)]
assert len(ours) == 1, [str(w.message) for w in caught]
print("ok")
