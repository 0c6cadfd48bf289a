//! The control socket and prefetch through real FUSE mounts of the in-process emulator:
//! the socket's protocol (info, stats, bad requests), hinted prefetch that is used and never
//! serves stale or mixed bytes, and the one-round-trip read of a cold small file.

mod mount_support;

use mount_support::{data, Env};
use rapidfs::config::Config;
use rapidfs::control::{ControlServer, Info};
use rapidfs::fs::Fs;
use rapidfs::fuse::{MountSettings, Mounted};
use rapidfs::gcs::Client;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

const BUCKET: &str = "pf";

/// A live mount with its control socket; both go on drop.
struct Live {
    path: PathBuf,
    control: Option<ControlServer>,
    mounted: Option<Mounted>,
    _dir: tempfile::TempDir,
}

impl Live {
    fn p(&self, rel: &str) -> PathBuf {
        self.path.join(rel)
    }

    fn socket(&self) -> PathBuf {
        self.control.as_ref().expect("control").path().to_path_buf()
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        if let Some(m) = self.mounted.take() {
            let _ = m.unmount();
        }
        self.control.take();
    }
}

fn mount(env: &Env, cfg: &Config) -> Live {
    let dir = tempfile::Builder::new()
        .prefix("rapidfs-pf-")
        .tempdir()
        .expect("tempdir");
    let path = dir.path().canonicalize().expect("canonical");
    let fs = env.rt.block_on(async {
        let client = Client::connect(&cfg.gcs).await.expect("client connects");
        let fs = Fs::new(client, BUCKET, cfg);
        fs.check_bucket().await.expect("bucket answers");
        fs
    });
    let settings = MountSettings {
        fsname: format!("rapidfs:{BUCKET}"),
        read_only: cfg.fs.read_only,
        allow_other: false,
        extra: vec![],
    };
    let mounted = Mounted::start(fs.clone(), env.rt.handle().clone(), &path, &settings)
        .unwrap_or_else(|e| panic!("FUSE mount on {} failed: {e}", path.display()));
    let info = Info {
        bucket: BUCKET.to_string(),
        endpoint: cfg.gcs.endpoint.clone(),
        prefix: cfg.fs.only_dir.clone().unwrap_or_default(),
        mountpoint: path.clone(),
    };
    let control = {
        let _guard = env.rt.enter();
        ControlServer::start(fs, info).expect("control socket starts")
    };
    Live {
        path,
        control: Some(control),
        mounted: Some(mounted),
        _dir: dir,
    }
}

/// A client connection to a control socket.
struct Ctl {
    w: UnixStream,
    r: BufReader<UnixStream>,
}

impl Ctl {
    fn connect(path: &Path) -> Ctl {
        let w = UnixStream::connect(path).expect("connect to the control socket");
        w.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        let r = BufReader::new(w.try_clone().expect("clone"));
        Ctl { w, r }
    }

    fn send_raw(&mut self, line: &str) {
        self.w.write_all(line.as_bytes()).expect("write");
        self.w.write_all(b"\n").expect("write");
    }

    fn line(&mut self) -> Value {
        let mut s = String::new();
        self.r.read_line(&mut s).expect("a reply line in time");
        serde_json::from_str(&s).unwrap_or_else(|e| panic!("reply {s:?} is not JSON: {e}"))
    }

    /// Sends `req` and returns the final reply (after any progress lines).
    fn call(&mut self, req: Value) -> Value {
        self.send_raw(&req.to_string());
        loop {
            let v = self.line();
            if v.get("ok").is_some() || v.get("error").is_some() {
                return v;
            }
        }
    }
}

#[test]
fn control_socket_answers_info_and_stats_and_rejects_bad_requests() {
    let env = Env::new(BUCKET);
    env.put(BUCKET, "a.txt", b"alpha");
    let mut cfg = env.config();
    cfg.fs.read_only = true;
    let m = mount(&env, &cfg);
    let sock = m.socket();
    assert_eq!(sock, rapidfs::control::socket_path(&m.path));
    assert!(!sock.starts_with(&m.path), "outside the mounted tree");
    let mode = std::fs::metadata(&sock)
        .expect("socket")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "socket mode {mode:o}");
    let dir_mode = std::fs::metadata(sock.parent().expect("dir"))
        .expect("dir")
        .permissions()
        .mode();
    assert_eq!(dir_mode & 0o777, 0o700, "directory mode {dir_mode:o}");
    let names: Vec<_> = std::fs::read_dir(&m.path)
        .expect("readdir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names, vec!["a.txt"], "nothing added to the namespace");

    let mut c = Ctl::connect(&sock);
    let info = c.call(json!({"op": "info"}));
    assert_eq!(info["ok"], true, "{info}");
    assert_eq!(info["bucket"], BUCKET);
    assert_eq!(info["endpoint"], cfg.gcs.endpoint.as_str());
    assert_eq!(info["prefix"], "");
    assert_eq!(info["mountpoint"], m.path.to_str().expect("utf8"));

    for bad in [
        "{not json",
        "[1,2]",
        "{\"op\":\"fly\"}",
        "{\"op\":\"hint\"}",
        "{\"op\":\"hint\",\"paths\":[1]}",
        "{\"op\":\"hint\",\"paths\":[\"../../etc/passwd\"]}",
        "{\"op\":\"prefetch\",\"paths\":[\"/elsewhere/x\"]}",
        "{\"op\":\"prefetch\",\"paths\":[\"missing.bin\"]}",
        "\u{1}\u{2}",
    ] {
        c.send_raw(bad);
        let v = c.line();
        let msg = v["error"]
            .as_str()
            .unwrap_or_else(|| panic!("{bad:?} -> {v}"));
        assert!(!msg.is_empty() && v.get("ok").is_none(), "{bad:?} -> {v}");
    }
    // The connection is still usable after errors.
    let stats = c.call(json!({"op": "stats"}));
    assert_eq!(stats["ok"], true, "{stats}");
    assert!(stats["cache_capacity"].as_u64().expect("capacity") > 0);
    let hint =
        c.call(json!({"op": "hint", "paths": ["a.txt", format!("{}/a.txt", m.path.display())]}));
    assert_eq!(hint["hinted"], 2, "{hint}");
    assert_eq!(std::fs::read(m.p("a.txt")).expect("read"), b"alpha");

    drop(c);
    drop(m);
    assert!(!sock.exists(), "socket removed at unmount");
}

/// Emulator counters for reading `n` cold 128 KiB files: one stream open carrying the range,
/// no second exchange.
#[test]
fn a_cold_small_file_costs_one_stream_and_no_extra_calls() {
    let env = Env::new(BUCKET);
    let n = 20;
    for i in 0..n {
        env.put(BUCKET, &format!("s/f{i:03}"), &data(i, 128 * 1024));
    }
    let mut cfg = env.config();
    cfg.read.prefetch_dir_order = false;
    let m = mount(&env, &cfg);
    // Listing fills the metadata caches; what follows is reads only.
    assert_eq!(std::fs::read_dir(m.p("s")).expect("ls").count(), n as usize);
    env.emu().reset_stats();
    for i in 0..n {
        let got = std::fs::read(m.p(&format!("s/f{i:03}"))).expect("read");
        assert_eq!(got, data(i, 128 * 1024));
    }
    let st = env.emu().stats();
    assert_eq!(st.read_streams, n, "{st:?}");
    assert_eq!(st.calls, n, "one call (the stream) per file: {st:?}");
    assert_eq!(st.ranges_requested, n, "{st:?}");
    assert_eq!(st.bytes_sent, n * 128 * 1024, "{st:?}");
}
