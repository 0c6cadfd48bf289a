//! `rapidfs mount BUCKET MOUNTPOINT`: mount a bucket and serve it until unmounted.
//!
//! Order matters: flags and the config file are checked first (bad input fails before
//! anything happens), then, unless `--foreground`, the process forks BEFORE any thread or
//! runtime exists; the child connects, checks the bucket, mounts, and reports readiness (or
//! one line of failure) to the waiting parent through a pipe. SIGINT and SIGTERM refuse new
//! writes, make every written byte durable, then unmount (lazily when files are still open).
//!
//! The mountpoint may also be `/dev/fd/N`, or `--fuse-fd-socket PATH` may hand over a
//! descriptor: a `/dev/fuse` that someone privileged already mounted (the GKE CSI driver's
//! conventions, libfuse's `/dev/fd/N`). Then rapidfs only serves it: no mount, no unmount,
//! no kernel tuning.

use crate::config::{Config, LogFormat};
use crate::emulator::{Emulator, EmulatorOptions, Faults};
use crate::fs::Fs;
use crate::fuse::{Driver, MountSettings, Mounted};
use crate::gcs::{self, Client};
use crate::machine::Serving;
use anyhow::{anyhow, bail, Context};
use clap::Args;
use std::io::{BufRead, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Flags of `rapidfs mount`.
#[derive(Debug, Args)]
pub struct MountArgs {
    /// The bucket to mount (its name, not `gs://`).
    pub bucket: String,
    /// The empty directory to mount it on, or `/dev/fd/N`: an already mounted /dev/fuse descriptor to serve.
    #[arg(required_unless_present = "fuse_fd_socket")]
    pub mountpoint: Option<PathBuf>,
    /// Instead of a mountpoint: receive an already mounted /dev/fuse descriptor (SCM_RIGHTS) from the unix socket at PATH and serve it.
    #[arg(long, value_name = "PATH", conflicts_with = "mountpoint")]
    pub fuse_fd_socket: Option<PathBuf>,
    /// TOML configuration file; flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Workload profile: its keys lie under the config file's and the flags' (see the README).
    #[arg(long, value_enum)]
    pub profile: Option<crate::profiles::Profile>,
    /// List the whole mounted tree into the metadata cache in the background at mount.
    #[arg(long)]
    pub prefetch_metadata: bool,
    /// Storage API endpoint (default https://storage.googleapis.com; http://HOST:PORT for an emulator).
    #[arg(long)]
    pub endpoint: Option<String>,
    /// Serve directory DIR with the built-in emulator (the bucket is its subdirectory BUCKET) and mount that.
    #[arg(long, value_name = "DIR")]
    pub emulator: Option<PathBuf>,
    /// Stay in the foreground (logs on stderr) instead of returning once mounted.
    #[arg(long, short = 'f')]
    pub foreground: bool,
    /// Mount with the kernel's read-only flag.
    #[arg(long)]
    pub read_only: bool,
    /// Mount only this prefix (directory) of the bucket.
    #[arg(long, value_name = "PREFIX")]
    pub only_dir: Option<String>,
    /// Mount options, comma-separated (allow_other, ro, auto_unmount, ...); may be repeated.
    #[arg(short = 'o', value_name = "OPTIONS")]
    pub options: Vec<String>,
    /// Let other users see the files (needs user_allow_other in /etc/fuse.conf when not root).
    #[arg(long)]
    pub allow_other: bool,
    /// Owner of every file and directory (default: the mounting user).
    #[arg(long)]
    pub uid: Option<u32>,
    /// Group of every file and directory (default: the mounting user's group).
    #[arg(long)]
    pub gid: Option<u32>,
    /// Permission bits of files, octal (default 644).
    #[arg(long, value_parser = parse_mode)]
    pub file_mode: Option<u32>,
    /// Permission bits of directories, octal (default 755).
    #[arg(long, value_parser = parse_mode)]
    pub dir_mode: Option<u32>,
    /// Memory budget in MiB for cache and read-ahead together.
    #[arg(long)]
    pub memory_mb: Option<u64>,
    /// Trust metadata (stat, listings, kernel entry and attribute caches) this long, in ms.
    #[arg(long)]
    pub metadata_ttl_ms: Option<u64>,
    /// Kernel read-ahead of the mount in KiB (0 keeps the kernel default).
    #[arg(long)]
    pub read_ahead_kb: Option<u64>,
    /// Where the background daemon writes its log (default: nowhere).
    #[arg(long)]
    pub log_file: Option<PathBuf>,
    /// Serve Prometheus metrics at http://HOST:PORT/metrics.
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_addr: Option<String>,
    /// When the mount fails, say why on stderr but exit 0 (fstab's `nofail`).
    #[arg(long)]
    pub nofail: bool,
    /// Accepted for gcsfuse habits; implicit directories are always on in rapidfs.
    #[arg(long)]
    pub implicit_dirs: bool,
    /// Credentials, TLS and zonal-check flags.
    #[command(flatten)]
    pub access: super::access::AccessArgs,
}

fn parse_mode(s: &str) -> Result<u32, String> {
    let digits = s.strip_prefix("0o").unwrap_or(s);
    match u32::from_str_radix(digits, 8) {
        Ok(m) if m <= 0o7777 => Ok(m),
        _ => Err(format!("'{s}' is not an octal mode like 644")),
    }
}

/// What the daemon serves.
enum Target {
    /// A directory it mounts itself.
    Dir(PathBuf),
    /// A /dev/fuse descriptor someone else mounted.
    Fd(OwnedFd),
}

/// Mounts and serves until unmounted or signalled; with `--nofail` a failure is only told.
pub fn run(
    args: MountArgs,
    log_level: Option<String>,
    log_format: Option<LogFormat>,
) -> anyhow::Result<()> {
    let nofail = args.nofail;
    let what = format!("{} on {}", args.bucket, target_name(&args));
    match run_mount(args, log_level, log_format) {
        Err(e) if nofail => {
            eprintln!(
                "rapidfs: warning: {what} not mounted (nofail): {}",
                super::one_line(&e)
            );
            Ok(())
        }
        r => r,
    }
}

fn target_name(args: &MountArgs) -> String {
    match (&args.mountpoint, &args.fuse_fd_socket) {
        (Some(p), _) => p.display().to_string(),
        (None, Some(s)) => format!("the descriptor from {}", s.display()),
        (None, None) => "nothing".to_string(),
    }
}

fn run_mount(
    args: MountArgs,
    log_level: Option<String>,
    log_format: Option<LogFormat>,
) -> anyhow::Result<()> {
    let cfg = config(&args)?;
    let target = target(&args)?;
    if let Some(dir) = &args.emulator {
        let bucket_dir = dir.join(&args.bucket);
        if !bucket_dir.is_dir() {
            bail!(
                "bucket '{}' not found: {} is not a directory",
                args.bucket,
                bucket_dir.display()
            );
        }
    }
    let level = log_level.unwrap_or_else(|| cfg.log.level.clone());
    let format = log_format.unwrap_or(cfg.log.format);
    if args.foreground {
        super::init_logging(&level, format);
        return serve(&args, cfg, target, &mut Ready::Foreground);
    }
    daemonize(&args, cfg, target, &level, format)
}

/// The mountpoint checked, or the descriptor taken over (`/dev/fd/N`) or received.
fn target(args: &MountArgs) -> anyhow::Result<Target> {
    if let Some(sock) = &args.fuse_fd_socket {
        // The whole message is read so the sender sees it taken; its words (the GKE node
        // server's JSON of bucket and options) do not override this command line.
        let (_message, fd) = crate::fuse::receive_message(sock)
            .map_err(|e| anyhow!("--fuse-fd-socket {}: {e}", sock.display()))?;
        check_fuse_fd(fd.as_raw_fd(), &sock.display().to_string())?;
        return Ok(Target::Fd(fd));
    }
    let Some(path) = &args.mountpoint else {
        bail!("a mountpoint or --fuse-fd-socket is needed");
    };
    if let Some(n) = path.to_str().and_then(|p| p.strip_prefix("/dev/fd/")) {
        let n: RawFd = n
            .parse()
            .map_err(|_| anyhow!("{}: not a descriptor number", path.display()))?;
        check_fuse_fd(n, &path.display().to_string())?;
        // SAFETY: the descriptor is open (fstat succeeded) and was handed to us to own.
        return Ok(Target::Fd(unsafe { OwnedFd::from_raw_fd(n) }));
    }
    check_mountpoint(path).map(Target::Dir)
}

/// `fd` must be an open /dev/fuse (character device 10:229).
pub(super) fn check_fuse_fd(fd: RawFd, what: &str) -> anyhow::Result<()> {
    // SAFETY: stat is plain data filled by fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat only writes into `st`; a closed descriptor is an error, not UB.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        bail!("{what}: {}", std::io::Error::last_os_error());
    }
    let is_fuse = st.st_mode & libc::S_IFMT == libc::S_IFCHR
        && libc::major(st.st_rdev) == 10
        && libc::minor(st.st_rdev) == 229;
    if !is_fuse {
        bail!("{what}: not a /dev/fuse descriptor");
    }
    Ok(())
}

/// The config file, overridden by the flags.
fn config(args: &MountArgs) -> anyhow::Result<Config> {
    let mut cfg = Config::load_with_profile(args.config.as_deref(), args.profile)?;
    if let Some(e) = &args.endpoint {
        cfg.gcs.endpoint = e.clone();
    }
    let fs = &mut cfg.fs;
    // `-o ro` (an fstab line) mounts the kernel read-only, so the filesystem is too: its
    // files are then read without opens (see `Fs::skips_open`). A later `rw` undoes it.
    let last_ro_rw = super::kernel_mount_options(&args.options)
        .into_iter()
        .rfind(|o| o == "ro" || o == "rw");
    fs.read_only |= args.read_only || last_ro_rw.as_deref() == Some("ro");
    fs.prefetch_metadata |= args.prefetch_metadata;
    fs.allow_other |= args.allow_other;
    if args.only_dir.is_some() {
        fs.only_dir = args.only_dir.clone();
    }
    fs.uid = args.uid.or(fs.uid);
    fs.gid = args.gid.or(fs.gid);
    fs.file_mode = args.file_mode.unwrap_or(fs.file_mode);
    fs.dir_mode = args.dir_mode.unwrap_or(fs.dir_mode);
    if let Some(ttl) = args.metadata_ttl_ms {
        fs.stat_ttl_ms = ttl;
        fs.list_ttl_ms = ttl;
        fs.kernel_entry_ttl_ms = ttl;
        fs.kernel_attr_ttl_ms = ttl;
        fs.negative_ttl_ms = fs.negative_ttl_ms.min(ttl);
    }
    if let Some(mb) = args.memory_mb {
        cfg.cache.memory_mb = mb;
    }
    cfg.cache.memory_mb = cfg.cache.budget_mb();
    if let Some(kb) = args.read_ahead_kb {
        cfg.read.kernel_read_ahead_kb = kb;
    }
    if args.metrics_addr.is_some() {
        cfg.metrics.addr = args.metrics_addr.clone();
    }
    if let Some(addr) = &cfg.metrics.addr {
        metrics_addr(addr)?;
    }
    args.access.apply(&mut cfg);
    cfg.validate().map_err(|e| anyhow!("configuration: {e}"))?;
    Ok(cfg)
}

/// `HOST:PORT` resolved to the address the metrics listener binds.
fn metrics_addr(addr: &str) -> anyhow::Result<std::net::SocketAddr> {
    use std::net::ToSocketAddrs;
    addr.to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| anyhow!("metrics address '{addr}' is not HOST:PORT"))
}

/// The mountpoint must be an existing, empty directory.
fn check_mountpoint(path: &Path) -> anyhow::Result<PathBuf> {
    let abs = path
        .canonicalize()
        .map_err(|e| anyhow!("mountpoint {}: {e}", path.display()))?;
    if !abs.is_dir() {
        bail!("mountpoint {} is not a directory", path.display());
    }
    let mut entries =
        std::fs::read_dir(&abs).map_err(|e| anyhow!("mountpoint {}: {e}", path.display()))?;
    if entries.next().is_some() {
        bail!("mountpoint {} is not empty", path.display());
    }
    Ok(abs)
}

/// How the serving process tells whoever started it that the mount is live or failed.
enum Ready {
    /// Nobody waits: errors are returned.
    Foreground,
    /// The parent waits on this pipe for one line: `ok` or `error: ...`.
    Pipe(std::fs::File),
    /// The verdict was sent.
    Sent,
}

impl Ready {
    /// A line for whoever started the mount (in the foreground the log already shows it).
    fn note(&mut self, line: &str) {
        if let Ready::Pipe(f) = self {
            let _ = f.write_all(format!("note: {line}\n").as_bytes());
        }
    }

    /// Sends the one line of verdict (once) and closes the pipe.
    fn send(&mut self, line: &str) {
        if let Ready::Pipe(mut f) = std::mem::replace(self, Ready::Sent) {
            let _ = f.write_all(format!("{line}\n").as_bytes());
        }
    }
}

/// Forks: the parent waits for the child's verdict and exits with it; the child serves.
fn daemonize(
    args: &MountArgs,
    cfg: Config,
    target: Target,
    log_level: &str,
    log_format: LogFormat,
) -> anyhow::Result<()> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array we own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        bail!("cannot create a pipe: {}", std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned by nothing else.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: no thread has been started yet (no runtime exists), so the child is a faithful
    // single-threaded copy.
    match unsafe { libc::fork() } {
        -1 => bail!("cannot fork: {}", std::io::Error::last_os_error()),
        0 => {
            drop(rd);
            // SAFETY: setsid has no memory effects; it detaches us from the terminal.
            unsafe { libc::setsid() };
            // The parent prints the one line of verdict; the daemon's log goes elsewhere.
            detach_stdio(args.log_file.as_deref());
            super::init_logging(log_level, log_format);
            let mut ready = Ready::Pipe(std::fs::File::from(wr));
            let code = match serve(args, cfg, target, &mut ready) {
                Ok(()) => 0,
                Err(e) => {
                    ready.send(&format!("error: {}", super::one_line(&e)));
                    1
                }
            };
            std::process::exit(code);
        }
        _child => {
            drop(wr);
            drop(target);
            let mut pipe = std::io::BufReader::new(std::fs::File::from(rd));
            let mut verdict = String::new();
            loop {
                verdict.clear();
                pipe.read_line(&mut verdict)
                    .context("reading the daemon's verdict")?;
                match verdict.trim_end().strip_prefix("note: ") {
                    Some(note) => eprintln!("rapidfs: {note}"),
                    None => break,
                }
            }
            match verdict.trim_end() {
                "ok" => Ok(()),
                "" => bail!("the daemon exited before the mount was ready"),
                line => bail!("{}", line.strip_prefix("error: ").unwrap_or(line)),
            }
        }
    }
}

/// Connects, checks the bucket, mounts, reports readiness, then serves until unmounted
/// (externally, or by SIGINT/SIGTERM).
fn serve(
    args: &MountArgs,
    mut cfg: Config,
    target: Target,
    ready: &mut Ready,
) -> anyhow::Result<()> {
    let rt = Arc::new(daemon_runtime(Serving::Mount)?);
    if let Some(addr) = &cfg.metrics.addr {
        let _guard = rt.enter();
        crate::metrics::serve(metrics_addr(addr)?)?;
        crate::metrics::sample_memory(cfg.cache.memory_mb * 1024 * 1024);
        tracing::info!(addr = %addr, "serving metrics at /metrics");
    }
    let emulator = match &args.emulator {
        Some(dir) => Some(rt.block_on(start_emulator(dir))?),
        None => None,
    };
    if let Some(emu) = &emulator {
        cfg.gcs.endpoint = emu.endpoint();
    }
    let (fs, zonal) = rt.block_on(connect(&args.bucket, &cfg))?;
    zonal.log();
    if zonal.refuses(cfg.zonal.require_same_zone) {
        bail!("{} (--require-same-zone: not mounting)", zonal.message());
    }
    if zonal.worth_saying() {
        ready.note(&format!("{}: {}", zonal.severity(), zonal.message()));
    }
    let (mut sigint, mut sigterm) = stop_signals(&rt)?;
    // The source as mount(8) knows it, so `mount -a` sees the fstab line is already mounted.
    let settings = MountSettings {
        fsname: args.bucket.clone(),
        read_only: cfg.fs.read_only,
        allow_other: cfg.fs.allow_other,
        extra: super::kernel_mount_options(&args.options),
    };
    // A served descriptor has no mountpoint of ours to derive the control socket's path from.
    let control_fs = fs.clone();
    let warm_fs = cfg.fs.prefetch_metadata.then(|| fs.clone());
    let (mut mounted, control) = match target {
        Target::Dir(mountpoint) => {
            // Listening before the mount shows: a tool that finds the mount (`rapidfs
            // finalize`, `rapidfs check`) right away finds its socket too.
            let control = start_control(&rt, control_fs.clone(), args, &cfg, &mountpoint, ready);
            let mounted = Mounted::start(fs, Driver::of(&rt), &mountpoint, &settings)
                .map_err(|e| anyhow!("cannot mount on {}: {e}", mountpoint.display()))?;
            if let Some(kb) = kernel_read_ahead(&mountpoint, cfg.read.kernel_read_ahead_kb) {
                control_fs.set_kernel_read_ahead(kb * 1024);
            }
            tracing::info!(bucket = %args.bucket, mountpoint = %mountpoint.display(), endpoint = %cfg.gcs.endpoint, "mounted");
            (mounted, control)
        }
        Target::Fd(fd) => {
            let raw = fd.as_raw_fd();
            let mounted = Mounted::serve_fd(fs, Driver::of(&rt), fd)
                .map_err(|e| anyhow!("cannot serve the /dev/fuse descriptor: {e}"))?;
            tracing::info!(bucket = %args.bucket, fd = raw, endpoint = %cfg.gcs.endpoint, "serving a mounted /dev/fuse descriptor");
            (mounted, None)
        }
    };
    let ended = mounted.ended();
    ready.send("ok");
    if let Some(fs) = warm_fs {
        rt.spawn(async move { fs.warm_metadata().await });
    }
    // Under systemd (Type=notify) the unit becomes active only now that the mount is live.
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Ready]);
    // Waited for as a task, not in `block_on` here: where the FUSE thread drives the runtime,
    // this thread holding it would run every request instead.
    let (stop, stopped) = std::sync::mpsc::channel();
    rt.spawn(async move {
        let signalled = tokio::select! {
            _ = sigint.recv() => true,
            _ = sigterm.recv() => true,
            _ = ended => false,
        };
        let _ = stop.send(signalled);
    });
    let signalled = stopped.recv().unwrap_or(false);
    if signalled {
        tracing::info!("signal received: flushing writes, then stopping");
    }
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
    rt.block_on(mounted.stop_writes());
    if let Err(e) = mounted.unmount() {
        tracing::warn!(error = %e, "unmount ended with an error");
    }
    drop(control);
    if let Some(emu) = emulator {
        rt.block_on(emu.shutdown());
    }
    tracing::info!("stopped");
    Ok(())
}

/// The serving daemon's runtime, for one mount or the sidecar's several.
pub(super) fn daemon_runtime(serving: Serving) -> anyhow::Result<tokio::runtime::Runtime> {
    crate::machine::serving_runtime("rapidfs", serving).context("starting the runtime")
}

/// SIGINT and SIGTERM, the signals that stop a daemon, as streams on `rt`.
pub(super) fn stop_signals(
    rt: &tokio::runtime::Runtime,
) -> anyhow::Result<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)> {
    use tokio::signal::unix::{signal, SignalKind};
    let _guard = rt.enter();
    Ok((
        signal(SignalKind::interrupt()).context("installing SIGINT handler")?,
        signal(SignalKind::terminate()).context("installing SIGTERM handler")?,
    ))
}

/// Starts the mount's control socket (hints, warm-up, stats) and says where it is; a mount
/// without one still works, so a failure is only reported.
fn start_control(
    rt: &tokio::runtime::Runtime,
    fs: Fs,
    args: &MountArgs,
    cfg: &Config,
    mountpoint: &Path,
    ready: &mut Ready,
) -> Option<crate::control::ControlServer> {
    let info = crate::control::Info {
        bucket: args.bucket.clone(),
        endpoint: cfg.gcs.endpoint.clone(),
        prefix: cfg.fs.only_dir.clone().unwrap_or_default(),
        mountpoint: mountpoint.to_path_buf(),
    };
    let _guard = rt.enter();
    match crate::control::ControlServer::start(fs, info) {
        Ok(c) => {
            tracing::info!(socket = %c.path().display(), "control socket listening");
            ready.note(&format!("control socket: {}", c.path().display()));
            Some(c)
        }
        Err(e) => {
            let path = crate::control::socket_path(mountpoint);
            tracing::warn!(socket = %path.display(), error = %e, "no control socket");
            ready.note(&format!(
                "warning: no control socket at {}: {e}",
                path.display()
            ));
            None
        }
    }
}

/// The in-process emulator over `dir` on a free loopback port.
async fn start_emulator(dir: &Path) -> anyhow::Result<Emulator> {
    let opts = EmulatorOptions {
        root: Some(dir.to_path_buf()),
        memory: false,
        zone: "us-central1-a".to_string(),
        faults: Faults::default(),
    };
    let listen = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    Emulator::start(opts, listen)
        .await
        .map_err(|e| anyhow!("cannot start the emulator over {}: {e:#}", dir.display()))
}

/// Why [`connect`] failed, kept apart for callers that classify failures (the GKE sidecar's
/// error file).
#[derive(Debug, thiserror::Error)]
pub(super) enum ConnectError {
    /// The bucket does not exist.
    #[error("bucket '{bucket}' not found at {endpoint}")]
    NoBucket { bucket: String, endpoint: String },
    /// The credentials may not use the bucket.
    #[error("cannot use bucket '{bucket}' at {endpoint}: {source}")]
    Denied {
        bucket: String,
        endpoint: String,
        source: gcs::Error,
    },
    /// Any other answer.
    #[error("cannot use bucket '{bucket}' at {endpoint}: {source}")]
    Failed {
        bucket: String,
        endpoint: String,
        source: gcs::Error,
    },
    /// No answer in time.
    #[error("cannot reach {endpoint}: no answer within {ms} ms")]
    Unreachable { endpoint: String, ms: u128 },
}

/// Connects, checks that the bucket answers and runs the zonal check, within
/// `fs.mount_timeout_ms`.
pub(super) async fn connect(
    bucket: &str,
    cfg: &Config,
) -> Result<(Fs, crate::zonal::Verdict), ConnectError> {
    let endpoint = cfg.gcs.endpoint.clone();
    let deadline = Duration::from_millis(cfg.fs.mount_timeout_ms);
    let attempt = async {
        let client = Client::connect(&cfg.gcs).await?;
        let fs = Fs::new(client.clone(), bucket, cfg);
        fs.check_bucket().await?;
        let zonal = crate::zonal::check(&client, bucket, &cfg.zonal).await;
        Ok::<_, gcs::Error>((fs, zonal.verdict))
    };
    let bucket = bucket.to_string();
    match tokio::time::timeout(deadline, attempt).await {
        Ok(Ok(found)) => Ok(found),
        Ok(Err(gcs::Error::NotFound(_))) => Err(ConnectError::NoBucket { bucket, endpoint }),
        Ok(Err(source @ gcs::Error::PermissionDenied(_))) => Err(ConnectError::Denied {
            bucket,
            endpoint,
            source,
        }),
        Ok(Err(source)) => Err(ConnectError::Failed {
            bucket,
            endpoint,
            source,
        }),
        Err(_) => Err(ConnectError::Unreachable {
            endpoint,
            ms: deadline.as_millis(),
        }),
    }
}

/// Sets the kernel read-ahead of the mount's backing device (`/sys/class/bdi/MAJ:MIN`) to
/// `kb` (0 leaves it), and returns what it is then, in KiB. Setting it needs root; a failure
/// only costs speed (the read path then reads ahead itself), so it is logged, not fatal.
fn kernel_read_ahead(mountpoint: &Path, kb: u64) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let dev = match std::fs::metadata(mountpoint) {
        Ok(m) => m.dev(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot stat the mountpoint to tune read-ahead");
            return None;
        }
    };
    let path = format!(
        "/sys/class/bdi/{}:{}/read_ahead_kb",
        libc::major(dev),
        libc::minor(dev)
    );
    if kb != 0 {
        match std::fs::write(&path, format!("{kb}\n")) {
            Ok(()) => tracing::debug!(path, kb, "kernel read-ahead set"),
            Err(e) => tracing::warn!(path, error = %e, "cannot set kernel read-ahead"),
        }
    }
    std::fs::read_to_string(&path).ok()?.trim().parse().ok()
}

/// The daemon no longer writes to the terminal of whoever started it: stdin and stdout go to
/// /dev/null, stderr (the log) to `log_file` or /dev/null.
fn detach_stdio(log_file: Option<&Path>) {
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null");
    let log = match log_file {
        Some(p) => std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p),
        None => std::fs::OpenOptions::new().write(true).open("/dev/null"),
    };
    if let (Ok(null), Ok(log)) = (null, log) {
        // SAFETY: dup2 onto the standard descriptors; the sources stay valid for the call.
        unsafe {
            libc::dup2(null.as_raw_fd(), 0);
            libc::dup2(null.as_raw_fd(), 1);
            libc::dup2(log.as_raw_fd(), 2);
        }
    }
}
