//! Everyday tools through a real mount, then a SIGKILL of the daemon, then a new daemon on a
//! new mountpoint that must find everything the tool was told was written. Tools that exit
//! before the kill rely on close: git (lock files renamed into place, loose objects, refs
//! rewritten) and a tar archive extracted (directories, symlinks, empty and odd-sized files).
//! Tools still running at the kill, their files open, rely on fsync alone: SQLite in its
//! rollback-journal and WAL modes (writes inside a file, a journal created and deleted, a
//! shared mapping of the WAL index), and files written through a shared writable mapping and
//! msync. Needs git and the interpreter tests/setup.sh prepares (RAPIDFS_PYTHON); fails
//! loudly without them.

mod daemon_support;
mod mount_support;

use daemon_support::{daemon, kill};
use mount_support::Env;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

const BUCKET: &str = "tools";

/// Runs `script` with the mount in `$MNT` and `vars` in the environment; its last line
/// printed must be "ok".
fn python(script: &str, mnt: &Path, vars: &[(&str, &str)]) {
    let out = python_command(script, mnt, vars)
        .output()
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.lines().last() == Some("ok"),
        "python failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Starts `script` as `python` does and returns once it has printed the line "ok", with
/// what it printed before and the process, still running (it should then wait, holding its
/// files open, until killed).
fn python_left_running(script: &str, mnt: &Path, vars: &[(&str, &str)]) -> (Child, String) {
    let mut child = python_command(script, mnt, vars)
        .stdout(Stdio::piped())
        .stdin(Stdio::piped())
        .spawn()
        .expect("python runs");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut printed = Vec::new();
    loop {
        match lines.next() {
            Some(Ok(line)) if line == "ok" => return (child, printed.join("\n")),
            Some(Ok(line)) => printed.push(line),
            ended => {
                // Its stdin closed and the process killed, so that a script that failed
                // some other way than by exiting cannot hold the test for ever.
                drop(child.stdin.take());
                let _ = child.kill();
                let status = child.wait().expect("wait");
                panic!("python ended ({status}, {ended:?}) before printing ok: {printed:?}");
            }
        }
    }
}

/// The interpreter running `script`. Isolated (`-I`) from the caller's environment: a
/// `PYTHONOPTIMIZE` there would strip every `assert` the scripts check with.
fn python_command(script: &str, mnt: &Path, vars: &[(&str, &str)]) -> Command {
    let python = std::env::var("RAPIDFS_PYTHON").unwrap_or_else(|_| {
        panic!("RAPIDFS_PYTHON is not set: run `source tests/setup.sh` (tests/run.sh does)")
    });
    let mut cmd = Command::new(python);
    cmd.args(["-I", "-c", script])
        .env("MNT", mnt)
        .envs(vars.iter().copied());
    cmd
}

/// `git ARGS` in `dir` with no user or system configuration; must succeed. Returns stdout.
/// The identity, the branch name and `safe.directory` are set here because a clean machine
/// has none of them configured, and the mount's files are not owned by whoever runs tests.
fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args([
            "-c",
            "user.name=rapidfs",
            "-c",
            "user.email=tests@rapidfs.invalid",
            "-c",
            "safe.directory=*",
            "-c",
            "init.defaultBranch=main",
        ])
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .unwrap_or_else(|e| panic!("git cannot run ({e}): tests/setup.sh installs it"));
    assert!(
        out.status.success(),
        "git {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// What a tool left behind: what it printed, and its process if it still runs (holding its
/// files open), to be killed with the daemon as a crash of the machine would. Its stdin is a
/// pipe of this test's: should the test fail before the kill, the pipe's end at the drop
/// ends the process too.
struct Left {
    printed: String,
    running: Option<Child>,
}

impl Left {
    fn exited(printed: String) -> Left {
        Left {
            printed,
            running: None,
        }
    }

    fn running((process, printed): (Child, String)) -> Left {
        Left {
            printed,
            running: Some(process),
        }
    }
}

/// `write` through one daemon, SIGKILL it (and what `write` left running) once `write`
/// returned, then `check` through a new daemon on a new mountpoint, given what `write`
/// printed.
fn write_kill_check(write: impl FnOnce(&Path) -> Left, check: impl FnOnce(&Path, &str)) {
    let env = Env::new(BUCKET);
    let endpoint = env.emu().endpoint();
    let first = tempfile::tempdir().expect("tempdir");
    let writer = daemon(&endpoint, BUCKET, first.path(), &[]);
    let left = write(first.path());
    kill(writer);
    if let Some(mut process) = left.running {
        let _ = process.kill();
        let _ = process.wait();
    }
    let second = tempfile::tempdir().expect("tempdir");
    let reader = daemon(&endpoint, BUCKET, second.path(), &[]);
    check(second.path(), &left.printed);
    kill(reader);
}

#[test]
fn a_git_repository_committed_twice_is_whole_after_a_daemon_kill() {
    write_kill_check(
        |mnt| {
            let repo = mnt.join("repo");
            std::fs::create_dir(&repo).expect("mkdir");
            git(&repo, &["init", "-q", "."]);
            std::fs::write(repo.join("a.txt"), "first\n").expect("write");
            std::fs::create_dir(repo.join("sub")).expect("mkdir");
            std::fs::write(repo.join("sub/b.bin"), mount_support::data(3, 300_001)).expect("write");
            git(&repo, &["add", "-A"]);
            git(&repo, &["commit", "-q", "-m", "one"]);
            std::fs::write(repo.join("a.txt"), "first\nsecond\n").expect("write");
            git(&repo, &["mv", "sub/b.bin", "c.bin"]);
            git(&repo, &["commit", "-q", "-a", "-m", "two"]);
            Left::exited(git(&repo, &["rev-parse", "HEAD"]))
        },
        |mnt, head| {
            let repo = mnt.join("repo");
            git(&repo, &["fsck", "--full", "--strict", "--no-dangling"]);
            assert_eq!(git(&repo, &["rev-parse", "HEAD"]), head);
            assert_eq!(git(&repo, &["log", "--format=%s"]), "two\none");
            assert_eq!(git(&repo, &["status", "--porcelain"]), "");
            assert_eq!(
                std::fs::read_to_string(repo.join("a.txt")).expect("read"),
                "first\nsecond\n"
            );
            assert_eq!(
                std::fs::read(repo.join("c.bin")).expect("read"),
                mount_support::data(3, 300_001)
            );
            assert!(!repo.join("sub/b.bin").exists());
        },
    );
}

/// Commits to a database in `$MODE` (delete = the rollback journal, or wal), prints the
/// SHA-256 of the committed rows, and waits with the database open and a last transaction
/// begun and never committed. Each commit is durable by its fsyncs alone, and in rollback
/// mode by the unlink of its journal too (the commit point, which SQLite does not sync).
const SQLITE_WRITE: &str = r#"
import hashlib, os, random, sqlite3, sys
db = sqlite3.connect(os.path.join(os.environ["MNT"], "app.db"), isolation_level=None)
mode = db.execute("pragma journal_mode=" + os.environ["MODE"]).fetchone()[0]
assert mode == os.environ["MODE"], mode
db.execute("pragma synchronous=full")
db.execute("create table t (k integer primary key, v blob)")
rng = random.Random(11)
rows = {}
for batch in range(20):
    db.execute("begin")
    for _ in range(50):
        k = rng.randrange(600)
        if k in rows and rng.random() < 0.2:
            db.execute("delete from t where k = ?", (k,))
            del rows[k]
        else:
            v = rng.randbytes(rng.randrange(1, 6000))
            db.execute("insert or replace into t values (?, ?)", (k, v))
            rows[k] = v
    db.execute("commit")
db.execute("begin")
db.execute("delete from t")
db.execute("insert into t values (100000, x'00')")
h = hashlib.sha256(repr(sorted(rows.items())).encode()).hexdigest()
print(h, flush=True)
print("ok", flush=True)
sys.stdin.read()
"#;

/// Opens the database left by SQLITE_WRITE and checks it against the SHA-256 in `$WANT`. In
/// WAL mode it first shows that the database file alone (copied without its WAL) lacks
/// commits, so that the WAL, and its recovery, are part of what survived.
const SQLITE_CHECK: &str = r#"
import hashlib, os, shutil, sqlite3, tempfile
path = os.path.join(os.environ["MNT"], "app.db")
def digest(p):
    db = sqlite3.connect(p)
    assert db.execute("pragma integrity_check").fetchone()[0] == "ok"
    rows = sorted(db.execute("select k, v from t"))
    db.close()
    return len(rows), hashlib.sha256(repr(rows).encode()).hexdigest()
if os.environ["MODE"] == "wal":
    with tempfile.TemporaryDirectory() as alone:
        shutil.copy(path, alone)
        assert digest(os.path.join(alone, "app.db"))[1] != os.environ["WANT"]
n, got = digest(path)
assert got == os.environ["WANT"], (n, got)
print("ok")
"#;

/// SQLITE_WRITE in `mode`, killed with the daemon, then SQLITE_CHECK through a new daemon.
fn sqlite_survives(mode: &'static str) {
    write_kill_check(
        |mnt| Left::running(python_left_running(SQLITE_WRITE, mnt, &[("MODE", mode)])),
        |mnt, want| {
            python(SQLITE_CHECK, mnt, &[("MODE", mode), ("WANT", want)]);
        },
    );
}

#[test]
fn sqlite_commits_in_rollback_journal_mode_survive_a_daemon_kill_with_the_database_open() {
    sqlite_survives("delete");
}

#[test]
fn sqlite_commits_in_wal_mode_survive_a_daemon_kill_with_the_database_open() {
    sqlite_survives("wal");
}

/// The archive both phases build (the same bytes from the same seed): directories, files
/// of awkward sizes, relative and dangling symlinks.
const TAR_ARCHIVE: &str = r#"
import io, os, random, tarfile
rng = random.Random(5)
members = []
for d in ["data", "data/deep", "data/deep/er", "empty-dir"]:
    members.append((d, "dir", None))
for name, size in [("data/zero", 0), ("data/one", 1), ("data/page", 4095),
                   ("data/deep/mib", (1 << 20) + 3), ("data/deep/er/odd", 123457),
                   ("top.txt", 17)]:
    members.append((name, "file", rng.randbytes(size)))
for name, target in [("data/link", "deep/mib"), ("dangling", "no/such/file"),
                     ("data/deep/up", "../one")]:
    members.append((name, "link", target))
def archive():
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, kind, body in members:
            info = tarfile.TarInfo(name)
            if kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif kind == "file":
                info.size = len(body)
                tar.addfile(info, io.BytesIO(body))
            else:
                info.type, info.linkname = tarfile.SYMTYPE, body
                tar.addfile(info)
    buf.seek(0)
    return buf
root = os.path.join(os.environ["MNT"], "x")
"#;

/// Extracts the archive into the mount.
const TAR_EXTRACT: &str = r#"
with tarfile.open(fileobj=archive()) as tar:
    tar.extractall(root, filter="tar")
print("ok")
"#;

/// Every member as archived, and nothing else.
const TAR_CHECK: &str = r#"
for name, kind, body in members:
    p = os.path.join(root, name)
    if kind == "dir":
        assert os.path.isdir(p) and not os.path.islink(p), name
    elif kind == "file":
        assert not os.path.islink(p), name
        with open(p, "rb") as f:
            assert f.read() == body, name
    else:
        assert os.readlink(p) == body, name
found = sorted(os.path.relpath(os.path.join(d, n), root)
               for d, ds, fs in os.walk(root) for n in ds + fs)
assert found == sorted(name for name, _, _ in members), found
print("ok")
"#;

#[test]
fn a_tar_archive_extracted_is_whole_after_a_daemon_kill() {
    write_kill_check(
        |mnt| {
            python(&format!("{TAR_ARCHIVE}\n{TAR_EXTRACT}"), mnt, &[]);
            Left::exited(String::new())
        },
        |mnt, _| {
            python(&format!("{TAR_ARCHIVE}\n{TAR_CHECK}"), mnt, &[]);
        },
    );
}

/// The bytes both phases expect: a file of 1 MiB and a bit whose touches include one across
/// a page boundary and one in the partial page at its end, and a file grown by ftruncate
/// whose tail past the mapped bytes is never written (its size must survive as well).
const MMAP_EXPECTED: &str = r#"
import mmap, os, sys
root = os.environ["MNT"]
base = bytes(range(256)) * 4097
touches = sorted(set(range(0, len(base) - 7, 65521)) | {4093, len(base) - 7})
mapped = bytearray(base)
for off in touches:
    mapped[off:off + 7] = b"touched"
filled = bytes(i % 251 for i in range(3 << 20))
grown_size = (3 << 20) + 5000
"#;

/// Writes both files through shared mappings, each made durable by msync alone, then waits
/// with both still mapped and open.
const MMAP_WRITE: &str = r#"
with open(os.path.join(root, "mapped.bin"), "wb") as f:
    f.write(base)
f = open(os.path.join(root, "mapped.bin"), "r+b")
m = mmap.mmap(f.fileno(), 0)
for off in touches:
    m[off:off + 7] = b"touched"
m.flush()
g = open(os.path.join(root, "grown.bin"), "w+b")
g.truncate(grown_size)
n = mmap.mmap(g.fileno(), 0)
n[:len(filled)] = filled
n.flush()
print("ok", flush=True)
sys.stdin.read()
"#;

/// Both files as MMAP_EXPECTED has them.
const MMAP_CHECK: &str = r#"
with open(os.path.join(root, "mapped.bin"), "rb") as f:
    got = f.read()
assert got == mapped, [o for o in touches if got[o:o + 7] != b"touched"]
with open(os.path.join(root, "grown.bin"), "rb") as f:
    got = f.read()
assert len(got) == grown_size, len(got)
assert got[:len(filled)] == filled and got[len(filled):] == bytes(5000)
print("ok")
"#;

#[test]
fn files_written_through_a_shared_mapping_and_msync_are_whole_after_a_daemon_kill() {
    write_kill_check(
        |mnt| {
            let write = format!("{MMAP_EXPECTED}\n{MMAP_WRITE}");
            Left::running(python_left_running(&write, mnt, &[]))
        },
        |mnt, _| {
            python(&format!("{MMAP_EXPECTED}\n{MMAP_CHECK}"), mnt, &[]);
        },
    );
}
