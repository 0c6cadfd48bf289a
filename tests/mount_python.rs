//! Python through a real FUSE mount: `numpy.memmap` over files of mixed sizes hashes equal to
//! the source. Needs the interpreter tests/setup.sh prepares (RAPIDFS_PYTHON); fails loudly
//! without it.

mod mount_support;

use mount_support::{data, sha, Env};
use std::io::Write;
use std::process::{Command, Stdio};

const BUCKET: &str = "py";

fn python() -> String {
    std::env::var("RAPIDFS_PYTHON").unwrap_or_else(|_| {
        panic!("RAPIDFS_PYTHON is not set: run `source tests/setup.sh` (tests/run.sh does)")
    })
}

fn hex(d: [u8; 32]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// Runs `script` with `input` on stdin and the mount in `$MNT`; it must print "ok".
fn run_python(script: &str, input: &str, mnt: &std::path::Path) {
    let mut child = Command::new(python())
        .args(["-c", script])
        .env("MNT", mnt)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python starts");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("write stdin");
    let out = child.wait_with_output().expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.trim() == "ok",
        "python failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn numpy_memmap_reads_equal_bytes() {
    let env = Env::new(BUCKET);
    let mut lines = String::new();
    for (i, size) in [1usize, 4096, 1 << 20, (1 << 20) + 1, 9 << 20, 123_457]
        .into_iter()
        .enumerate()
    {
        let name = format!("arrays/a{i}.bin");
        let bytes = data(40 + i as u64, size);
        env.put(BUCKET, &name, &bytes);
        lines.push_str(&format!("{name} {}\n", hex(sha(&bytes))));
    }
    let m = env.mount(BUCKET, &env.config());
    let script = r#"
import hashlib, os, sys
import numpy as np
root = os.environ["MNT"]
for line in sys.stdin:
    name, want = line.split()
    mm = np.memmap(os.path.join(root, name), dtype=np.uint8, mode="r")
    got = hashlib.sha256(mm.tobytes()).hexdigest()
    assert got == want, (name, got, want)
    # Strided access touches pages out of order.
    if mm.size > 8192:
        assert bytes(mm[::4096][:3]) == bytes(np.fromfile(os.path.join(root, name), dtype=np.uint8)[::4096][:3])
print("ok")
"#;
    run_python(script, &lines, &m.path);
}

/// The training workload itself: torch's DataLoader with 4 worker processes reads every file
/// of an image-folder-like tree through the mount, shuffled, and each sample's bytes match.
#[test]
fn torch_dataloader_with_four_workers_reads_every_file() {
    let env = Env::new(BUCKET);
    let mut lines = String::new();
    for i in 0..240u64 {
        let name = format!("train/class{}/img{i:04}.jpg", i % 6);
        // 1 KiB .. ~300 KiB, like small encoded images.
        let bytes = data(1000 + i, 1024 + ((i * 7919) % 300) as usize * 1024);
        env.put(BUCKET, &name, &bytes);
        lines.push_str(&format!("{name} {}\n", hex(sha(&bytes))));
    }
    let m = env.mount(BUCKET, &env.config());
    let script = r#"
import hashlib, os, sys
import torch
from torch.utils.data import DataLoader, Dataset

root = os.environ["MNT"]
want = dict(line.split() for line in sys.stdin)

class Files(Dataset):
    """An ImageFolder without decoding: found by walking the mount, read by plain paths."""
    def __init__(self, top):
        self.paths = sorted(
            os.path.join(d, f) for d, _, fs in os.walk(top) for f in fs)
    def __len__(self):
        return len(self.paths)
    def __getitem__(self, i):
        with open(self.paths[i], "rb") as f:
            data = f.read()
        return os.path.relpath(self.paths[i], root), hashlib.sha256(data).hexdigest(), len(data)

ds = Files(os.path.join(root, "train"))
assert len(ds) == len(want), (len(ds), len(want))
loader = DataLoader(ds, batch_size=16, shuffle=True, num_workers=4,
                    collate_fn=lambda batch: batch)
seen = {}
for batch in loader:
    for name, digest, _ in batch:
        seen[name] = digest
assert seen == want, sorted(set(seen.items()) ^ set(want.items()))[:5]
print("ok")
"#;
    run_python(script, &lines, &m.path);
}
