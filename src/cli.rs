//! The command line: parse it with clap, set up logging, run the chosen subcommand, and turn
//! any failure into one clear line on stderr and a non-zero exit code.

mod access;
mod check;
mod emulator;
mod finalize;
mod gke_options;
mod gke_sidecar;
mod mount;
mod mount_helper;
mod mounts;
mod prefetch;

use crate::config::LogFormat;
use clap::{CommandFactory, Parser, Subcommand};
use std::ffi::OsString;
use std::process::ExitCode;

/// rapidfs: mount a Google Cloud Storage Rapid bucket as a local directory.
#[derive(Debug, Parser)]
#[command(name = "rapidfs", version, about, long_about = None)]
pub struct Cli {
    /// Log filter (`info`, `debug`, `rapidfs=trace`, ...); `RUST_LOG` wins when set.
    #[arg(long, global = true)]
    pub log_level: Option<String>,
    /// Log line format.
    #[arg(long, global = true, value_enum)]
    pub log_format: Option<LogFormat>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve a local directory (or memory) as GCS buckets over the google.storage.v2 gRPC API.
    Emulator(emulator::EmulatorArgs),
    /// Mount a bucket on a local directory.
    Mount(Box<mount::MountArgs>),
    /// Diagnose the connection to a bucket: credentials, reachability, zones, latency.
    Check(check::CheckArgs),
    /// List objects left unfinalized (appendable), e.g. by a crashed writer.
    Unfinalized(finalize::UnfinalizedArgs),
    /// Finalize objects (files in a mount, or gs://BUCKET/OBJECT).
    Finalize(finalize::FinalizeArgs),
    /// Load files or directories of a mounted bucket into the mount's cache (warm-up).
    Prefetch(prefetch::PrefetchArgs),
    /// Serve the volumes that GKE's Cloud Storage FUSE CSI driver hands to its sidecar (the image's entrypoint).
    GkeSidecar(gke_sidecar::GkeSidecarArgs),
}

/// Entry point of the binary: never panics on bad input, always one line per error.
pub fn main() -> ExitCode {
    let argv = match mount_helper::rewrite(std::env::args_os().collect()) {
        mount_helper::Invocation::Argv(argv) => argv,
        mount_helper::Invocation::Fake => return ExitCode::SUCCESS,
    };
    let cli = match parse(argv) {
        Ok(cli) => cli,
        Err(Bad::Clap(e)) => return report_clap_error(&e),
        Err(Bad::Option(msg)) => {
            eprintln!("rapidfs: error: {msg}");
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        Command::Emulator(args) => emulator::run(args, cli.log_level, cli.log_format),
        Command::Mount(args) => mount::run(*args, cli.log_level, cli.log_format),
        Command::Check(args) => check::run(args, cli.log_level, cli.log_format),
        Command::Unfinalized(args) => {
            finalize::run_unfinalized(args, cli.log_level, cli.log_format)
        }
        Command::Finalize(args) => finalize::run_finalize(args, cli.log_level, cli.log_format),
        Command::Prefetch(args) => prefetch::run(args),
        Command::GkeSidecar(args) => gke_sidecar::run(args, cli.log_level),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rapidfs: error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// Why the command line was refused.
enum Bad {
    Clap(clap::Error),
    Option(String),
}

/// Parses `argv`; a `mount` whose `-o` list names rapidfs flags (`uid=1000`) is parsed again
/// with those flags appended, so fstab options and flags are one and the same.
fn parse(argv: Vec<OsString>) -> Result<Cli, Bad> {
    let cli = Cli::try_parse_from(&argv).map_err(Bad::Clap)?;
    let Command::Mount(args) = &cli.command else {
        return Ok(cli);
    };
    let extra = mount_option_flags(&args.options).map_err(Bad::Option)?;
    if extra.is_empty() {
        return Ok(cli);
    }
    Cli::try_parse_from(
        argv.into_iter()
            .chain(extra.into_iter().map(OsString::from)),
    )
    .map_err(Bad::Clap)
}

/// The flags that the `-o` options stand for; an option that is neither a kernel option,
/// fstab bookkeeping nor a flag is an error.
fn mount_option_flags(options: &[String]) -> Result<Vec<String>, String> {
    let cmd = Cli::command();
    let mount = cmd.find_subcommand("mount");
    let is_flag = |name: &str| {
        cmd.get_arguments()
            .chain(mount.into_iter().flat_map(|m| m.get_arguments()))
            .any(|a| a.get_long() == Some(name))
    };
    let mut flags = Vec::new();
    for opt in mount_helper::split(options) {
        if let mount_helper::MountOpt::Flag(f) = mount_helper::classify(opt, is_flag)? {
            flags.push(f);
        }
    }
    Ok(flags)
}

/// The `-o` options meant for the kernel, in order.
pub fn kernel_mount_options(options: &[String]) -> Vec<String> {
    mount_helper::split(options)
        .filter(|o| mount_helper::classify(o, |_| false) == Ok(mount_helper::MountOpt::Kernel))
        .map(str::to_string)
        .collect()
}

/// Help and version go to stdout in full; a usage error is cut to its first line.
fn report_clap_error(e: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            end_quietly_when_stdout_closes();
            print!("{e}");
            ExitCode::SUCCESS
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            eprint!("{e}");
            ExitCode::from(2)
        }
        _ => {
            let rendered = e.render().to_string();
            let first = rendered.lines().next().unwrap_or("bad command line");
            let first = first.strip_prefix("error: ").unwrap_or(first);
            eprintln!("rapidfs: error: {first} (see 'rapidfs --help')");
            ExitCode::from(2)
        }
    }
}

/// Help and version piped into `head` end as coreutils' do when the reader goes away:
/// killed by SIGPIPE, silently, instead of panicking in `print!`. Only they: a command that
/// talks to the service keeps Rust's ignored SIGPIPE, since its vectored socket writes
/// (`writev`) would raise it on a reset connection and kill it without its error line.
fn end_quietly_when_stdout_closes() {
    // SAFETY: only sets a signal's disposition to the default, before any other thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Prints a line on stdout (`outln!`). When the reader has gone (`rapidfs unfinalized | head`),
/// the command ends quietly with the status a shell gives a command SIGPIPE killed, as
/// coreutils' do, instead of panicking; any other failure (a full disk) ends it with one
/// line and a failure status, never silently.
pub fn print_line(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_fmt(line).and_then(|()| out.write_all(b"\n")) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            std::process::exit(128 + libc::SIGPIPE)
        }
        Err(e) => {
            eprintln!("rapidfs: error: cannot write to standard output: {e}");
            std::process::exit(1)
        }
    }
}

/// `println!` for the commands' output: see `print_line`.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::cli::print_line(format_args!($($arg)*))
    };
}
pub(crate) use outln;

/// An error and its causes, joined on one line.
pub fn one_line(e: &anyhow::Error) -> String {
    format!("{e:#}").replace('\n', " ")
}

/// Starts tracing on stderr: the explicit level, else `RUST_LOG`, else the config's level.
pub fn init_logging(level: &str, format: LogFormat) {
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    init_logging_to(level, format, ansi, std::io::stderr);
}

/// Starts tracing, writing each line with `writer`.
fn init_logging_to<W>(level: &str, format: LogFormat, ansi: bool, writer: W)
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    use tracing_subscriber::EnvFilter;
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| EnvFilter::try_new(v).ok())
        // fuser warns "Failed to umount" whenever the mount was already undone from outside
        // (`umount DIR`, the normal way to stop): one false alarm per unmount.
        .or_else(|| EnvFilter::try_new(format!("{level},fuser::session=error")).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(writer);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<OsString> {
        s.split_whitespace().map(OsString::from).collect()
    }

    #[test]
    fn mount_options_become_flags() {
        let cli = parse(argv(
            "rapidfs mount b /m -o ro,_netdev,uid=5,file_mode=640,log_level=debug,key_file=/k,implicit_dirs",
        ))
        .unwrap_or_else(|_| panic!("parses"));
        assert_eq!(cli.log_level.as_deref(), Some("debug"));
        let Command::Mount(m) = cli.command else {
            panic!("a mount");
        };
        assert_eq!((m.uid, m.file_mode), (Some(5), Some(0o640)));
        assert_eq!(
            m.access.key_file.as_deref(),
            Some(std::path::Path::new("/k"))
        );
        assert!(m.implicit_dirs);
        assert_eq!(kernel_mount_options(&m.options), vec!["ro".to_string()]);
    }

    #[test]
    fn unknown_or_malformed_mount_options_are_refused() {
        assert!(matches!(
            parse(argv("rapidfs mount b /m -o ro,bogus")),
            Err(Bad::Option(m)) if m.contains("'bogus'")
        ));
        assert!(matches!(
            parse(argv("rapidfs mount b /m -o uid=me")),
            Err(Bad::Clap(_))
        ));
    }
}
