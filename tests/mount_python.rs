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
