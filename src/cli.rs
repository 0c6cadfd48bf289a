//! The command line: parse it with clap, set up logging, run the chosen subcommand, and turn
//! any failure into one clear line on stderr and a non-zero exit code.

mod access;
mod check;
mod emulator;
mod mount;
mod prefetch;

use crate::config::LogFormat;
use clap::{Parser, Subcommand};
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
    /// Load files or directories of a mounted bucket into the mount's cache (warm-up).
    Prefetch(prefetch::PrefetchArgs),
}

/// Entry point of the binary: never panics on bad input, always one line per error.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return report_clap_error(&e),
    };
    let result = match cli.command {
        Command::Emulator(args) => emulator::run(args, cli.log_level, cli.log_format),
        Command::Mount(args) => mount::run(*args, cli.log_level, cli.log_format),
        Command::Check(args) => check::run(args, cli.log_level, cli.log_format),
        Command::Prefetch(args) => prefetch::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rapidfs: error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// Help and version go to stdout in full; a usage error is cut to its first line.
fn report_clap_error(e: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
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

/// An error and its causes, joined on one line.
pub fn one_line(e: &anyhow::Error) -> String {
    format!("{e:#}").replace('\n', " ")
}

/// Starts tracing: the explicit level, else `RUST_LOG`, else the config's level.
pub fn init_logging(level: &str, format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| EnvFilter::try_new(v).ok())
        .or_else(|| EnvFilter::try_new(level).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
