//! `genesis-run`: Genesis's equivalent of `torchrun` for data-parallel training across
//! processes.
//!
//! ```text
//! genesis-run --nproc-per-node N [--nnodes M --node-rank R --master-addr A --master-port P]
//!             [--timeout-grace SECS] PROGRAM ARGS...
//! ```
//!
//! It starts `PROGRAM ARGS...` once per local rank `l` in `0..N`, each with the parent's
//! environment plus torchrun's variables, so that a program runs unchanged under
//! `genesis-run` and under `torchrun --no-python`:
//!
//! | variable           | value                         |
//! |--------------------|-------------------------------|
//! | `RANK`             | `node_rank * N + l`           |
//! | `LOCAL_RANK`       | `l`                           |
//! | `WORLD_SIZE`       | `nnodes * N`                  |
//! | `LOCAL_WORLD_SIZE` | `N`                           |
//! | `GROUP_RANK`       | `node_rank`                   |
//! | `MASTER_ADDR`      | `--master-addr` (`127.0.0.1`) |
//! | `MASTER_PORT`      | `--master-port` (`29500`)     |
//!
//! Defaults are torchrun's: one node, node rank 0, port 29500. Options also take the
//! `--option=value` form; everything from `PROGRAM` on is passed through unparsed, so the
//! program's own `--flags` never reach the launcher. A multi-node job runs one `genesis-run`
//! per node with the same sizes and master address and its own `--node-rank`; the launcher
//! does no rendezvous of its own, the program's process group does (through `MASTER_ADDR`
//! and `MASTER_PORT`).
//!
//! # Output
//!
//! Each rank's stdout and stderr are piped; every line is printed on the launcher's stdout or
//! stderr with the prefix `[rank<RANK>]: `, a whole line at a time, so lines of different
//! ranks never mix. A last line without a newline is printed with one. Ranks get `/dev/null`
//! as stdin: they run in process groups of their own (below), where reading the terminal
//! would stop them.
//!
//! # Failures and signals
//!
//! When a rank exits with a non-zero code or is killed by a signal, the launcher names it on
//! stderr (`genesis-run: rank 1 (pid 1234) exited with code 3; stopping the other ranks`),
//! sends SIGTERM to the others, gives them `--timeout-grace` seconds (default 5) to exit and
//! then sends SIGKILL. It exits with the first failure's code, or 128 + S for a rank killed by
//! signal S. SIGINT, SIGTERM and SIGHUP sent to the launcher stop the ranks the same way
//! (SIGTERM, grace, SIGKILL; a second signal skips the rest of the grace period) and the
//! launcher exits with 128 + that signal. A signal the launcher was started with ignored
//! (SIGHUP under `nohup`, SIGINT for a background job of a script) stays ignored, for the
//! launcher and its ranks. When every rank exits with 0, so does the launcher.
//! A program that cannot be started is reported by name and gives exit code 127; a bad
//! command line gives 2.
//!
//! Each rank is the leader of its own process group and signals go to the whole group, so a
//! rank started through a shell or wrapper is stopped together with its children (which
//! would otherwise hold the output pipes open and outlive the job); the group of the failed
//! rank is stopped too, for what it left running. A rank that exits with 0 but leaves a
//! background process holding its stdout or stderr keeps the launcher waiting for that
//! process, as a shell pipeline would.
//!
//! # Platforms
//!
//! Unix only: process groups, `kill(2)` and `sigaction(2)` have no Windows equivalent that
//! keeps these semantics. On other platforms the binary builds and refuses to run.

// On non-Unix targets the launch half of the configuration is never read.
#[cfg_attr(not(unix), allow(dead_code))]
mod args;
#[cfg(unix)]
mod launch;

use std::io::Write;
use std::process::ExitCode;

/// Exit code for a command line that cannot be run (as most Unix tools).
const EXIT_USAGE: u8 = 2;

fn main() -> ExitCode {
    match args::parse(std::env::args_os().skip(1)) {
        Ok(args::Parsed::Help) => {
            // Not print!: it panics when stdout is closed (`genesis-run --help | head -1`).
            let _ = std::io::stdout().write_all(args::USAGE.as_bytes());
            ExitCode::SUCCESS
        }
        Ok(args::Parsed::Launch(config)) => launch(&config),
        Err(e) => {
            let _ =
                writeln!(std::io::stderr(), "genesis-run: error: {e}\nTry 'genesis-run --help' for more information.");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

/// Runs the job and turns its outcome into the launcher's exit code.
#[cfg(unix)]
fn launch(config: &args::LaunchConfig) -> ExitCode {
    ExitCode::from(launch::run(config))
}

/// Launching needs Unix process groups and signals (see the crate docs).
#[cfg(not(unix))]
fn launch(_config: &args::LaunchConfig) -> ExitCode {
    let _ = writeln!(std::io::stderr(), "genesis-run: error: launching ranks is only supported on Unix");
    ExitCode::FAILURE
}
