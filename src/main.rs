//! The `rapidfs` binary: parse the command line and run the chosen subcommand.

fn main() -> std::process::ExitCode {
    rapidfs::cli::main()
}
