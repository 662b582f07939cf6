//! The command line of `genesis-run`.
//!
//! Parsed by hand: the launcher has seven options, and everything from the program on must be
//! passed through untouched (the program's own `--flags` are not the launcher's), which is
//! simplest to guarantee by stopping at the first word that is not an option.

use std::ffi::OsString;
use std::fmt;
use std::time::Duration;

/// torchrun's default rendezvous port, so that programs and scripts written for torchrun find
/// the same `MASTER_PORT`.
pub const DEFAULT_MASTER_PORT: u16 = 29500;

/// How long the ranks have, after SIGTERM, to exit on their own before they are killed.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(5);

/// The help text of `genesis-run --help`.
pub const USAGE: &str = "\
genesis-run: start one process per rank for data-parallel training (Genesis's torchrun)

Usage:
  genesis-run --nproc-per-node N [OPTIONS] PROGRAM [ARGS...]

Starts PROGRAM N times on this node with torchrun's environment variables: RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR and MASTER_PORT. Each
line a rank writes is printed with the prefix `[rank<RANK>]: `. When a rank fails, the
others are sent SIGTERM and, after the grace period, SIGKILL; genesis-run then exits with
the failed rank's exit code (128 + signal for a rank killed by a signal).

Options (also accepted as --option=value, and with `_` for `-` as torchrun does):
  --nproc-per-node N    processes (ranks) to start on this node (required, >= 1)
  --nnodes M            number of nodes in the job [default: 1]
  --node-rank R         rank of this node, 0 <= R < M [default: 0]
  --master-addr ADDR    address of the rank-0 node [default: 127.0.0.1]
  --master-port PORT    port of the rank-0 node [default: 29500]
  --timeout-grace SECS  time between SIGTERM and SIGKILL when stopping the ranks
                        [default: 5]
  -h, --help            print this help
  --                    end of options (for a PROGRAM whose name starts with `-`)

Everything from PROGRAM on is passed to it unchanged. On a multi-node job, run genesis-run
on every node with the same --nnodes, --nproc-per-node, --master-addr and --master-port and
a different --node-rank.

Exit status: 0 when every rank exits with 0; the first failed rank's code otherwise; 128 + S
when genesis-run stops the ranks on signal S (SIGINT, SIGTERM, SIGHUP); 2 for a bad command
line; 127 when PROGRAM cannot be started.
";

/// What the command line asks for.
#[derive(Debug, PartialEq)]
pub enum Parsed {
    /// `--help`: print [`USAGE`] and exit.
    Help,
    /// Start the ranks.
    Launch(LaunchConfig),
}

/// A complete, checked launch request.
#[derive(Debug, PartialEq)]
pub struct LaunchConfig {
    /// Processes on this node (`LOCAL_WORLD_SIZE`), at least 1.
    pub nproc_per_node: usize,
    /// Nodes in the job, at least 1.
    pub nnodes: usize,
    /// This node's rank (`GROUP_RANK`), below `nnodes`.
    pub node_rank: usize,
    /// `MASTER_ADDR`, not empty.
    pub master_addr: String,
    /// `MASTER_PORT`, not 0.
    pub master_port: u16,
    /// Time between SIGTERM and SIGKILL when the ranks are stopped.
    pub grace: Duration,
    /// The program every rank runs.
    pub program: OsString,
    /// Its arguments, as given.
    pub args: Vec<OsString>,
}

impl LaunchConfig {
    /// `WORLD_SIZE`: ranks in the whole job. [`parse`] checked that it does not overflow.
    pub fn world_size(&self) -> usize {
        self.nnodes * self.nproc_per_node
    }

    /// The global `RANK` of local rank `local_rank` on this node.
    pub fn global_rank(&self, local_rank: usize) -> usize {
        self.node_rank * self.nproc_per_node + local_rank
    }
}

/// A command line that cannot be run; the message says what is wrong.
#[derive(Debug, PartialEq)]
pub struct UsageError(String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// The launcher's own options.
#[derive(Clone, Copy)]
enum Opt {
    NprocPerNode,
    Nnodes,
    NodeRank,
    MasterAddr,
    MasterPort,
    TimeoutGrace,
}

impl Opt {
    /// The option a name stands for; torchrun also accepts the underscore spellings.
    fn from_name(name: &str) -> Option<Opt> {
        Some(match name {
            "--nproc-per-node" | "--nproc_per_node" => Opt::NprocPerNode,
            "--nnodes" => Opt::Nnodes,
            "--node-rank" | "--node_rank" => Opt::NodeRank,
            "--master-addr" | "--master_addr" => Opt::MasterAddr,
            "--master-port" | "--master_port" => Opt::MasterPort,
            "--timeout-grace" | "--timeout_grace" => Opt::TimeoutGrace,
            _ => return None,
        })
    }

    /// The canonical spelling, for messages.
    fn name(self) -> &'static str {
        match self {
            Opt::NprocPerNode => "--nproc-per-node",
            Opt::Nnodes => "--nnodes",
            Opt::NodeRank => "--node-rank",
            Opt::MasterAddr => "--master-addr",
            Opt::MasterPort => "--master-port",
            Opt::TimeoutGrace => "--timeout-grace",
        }
    }
}

/// Parses the launcher's arguments (without the launcher's own name).
///
/// # Errors
///
/// A [`UsageError`] for an unknown option, a missing or malformed value, an inconsistent
/// combination (`--node-rank` not below `--nnodes`) or a missing program.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Parsed, UsageError> {
    let mut words = args.into_iter();
    let mut nproc_per_node = None;
    let mut nnodes = 1;
    let mut node_rank = 0;
    let mut master_addr = String::from("127.0.0.1");
    let mut master_port = DEFAULT_MASTER_PORT;
    let mut grace = DEFAULT_GRACE;
    let mut program = None;

    while let Some(word) = words.next() {
        // Options are ASCII, so a word that is not UTF-8 can only be the program.
        let Some(text) = word.to_str() else {
            program = Some(word);
            break;
        };
        if text == "--" {
            program = words.next();
            break;
        }
        if text == "-h" || text == "--help" {
            return Ok(Parsed::Help);
        }
        // A lone `-` is a (strange) file name, not an option.
        if !text.starts_with('-') || text == "-" {
            program = Some(word);
            break;
        }
        let (name, inline_value) = match text.split_once('=') {
            Some((name, value)) if name.starts_with("--") => (name, Some(value.to_owned())),
            _ => (text, None),
        };
        let opt = Opt::from_name(name).ok_or_else(|| UsageError(format!("unknown option '{name}'")))?;
        let value = match inline_value {
            Some(value) => value,
            None => {
                let missing = || UsageError(format!("option {} needs a value", opt.name()));
                let value = words.next().ok_or_else(missing)?;
                value.into_string().map_err(|_| UsageError(format!("the value of {} is not UTF-8", opt.name())))?
            }
        };
        match opt {
            Opt::NprocPerNode => nproc_per_node = Some(positive(opt, &value)?),
            Opt::Nnodes => nnodes = positive(opt, &value)?,
            Opt::NodeRank => node_rank = number(opt, &value, "a number")?,
            Opt::MasterAddr => {
                if value.is_empty() {
                    return Err(UsageError("--master-addr must not be empty".into()));
                }
                master_addr = value;
            }
            Opt::MasterPort => {
                master_port = number(opt, &value, "a port number from 1 to 65535")?;
                if master_port == 0 {
                    return Err(UsageError(
                        "invalid value '0' for --master-port: expected a port number from 1 to 65535".into(),
                    ));
                }
            }
            Opt::TimeoutGrace => grace = seconds(opt, &value)?,
        }
    }

    let nproc_per_node = nproc_per_node.ok_or_else(|| UsageError("missing --nproc-per-node N".into()))?;
    if node_rank >= nnodes {
        return Err(UsageError(format!("--node-rank {node_rank} must be below --nnodes {nnodes}")));
    }
    // Checked once here, so that world_size() and global_rank() cannot overflow later.
    if nnodes.checked_mul(nproc_per_node).is_none() {
        return Err(UsageError(format!("--nnodes {nnodes} x --nproc-per-node {nproc_per_node} is too many processes")));
    }
    let program = program.ok_or_else(|| UsageError("no program to run".into()))?;
    Ok(Parsed::Launch(LaunchConfig {
        nproc_per_node,
        nnodes,
        node_rank,
        master_addr,
        master_port,
        grace,
        program,
        args: words.collect(),
    }))
}

/// Parses `value` as a number of type `T`, with `expected` naming the accepted values.
fn number<T: std::str::FromStr>(opt: Opt, value: &str, expected: &str) -> Result<T, UsageError> {
    value.parse().map_err(|_| UsageError(format!("invalid value '{value}' for {}: expected {expected}", opt.name())))
}

/// Parses a count that must be at least 1.
fn positive(opt: Opt, value: &str) -> Result<usize, UsageError> {
    const EXPECTED: &str = "a positive integer";
    match number(opt, value, EXPECTED)? {
        0 => Err(UsageError(format!("invalid value '0' for {}: expected {EXPECTED}", opt.name()))),
        n => Ok(n),
    }
}

/// Parses a non-negative number of seconds, fractions allowed (`0.5`).
fn seconds(opt: Opt, value: &str) -> Result<Duration, UsageError> {
    let invalid = || UsageError(format!("invalid value '{value}' for {}: expected seconds (>= 0)", opt.name()));
    let secs: f64 = value.parse().map_err(|_| invalid())?;
    // try_from_secs_f64 rejects negative, NaN and overflowing values, where from_secs_f64
    // would panic.
    Duration::try_from_secs_f64(secs).map_err(|_| invalid())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_strs(words: &[&str]) -> Result<Parsed, UsageError> {
        parse(words.iter().map(OsString::from))
    }

    fn launch(words: &[&str]) -> LaunchConfig {
        match parse_strs(words) {
            Ok(Parsed::Launch(config)) => config,
            other => panic!("{words:?} gave {other:?}"),
        }
    }

    fn error(words: &[&str]) -> String {
        match parse_strs(words) {
            Err(e) => e.to_string(),
            other => panic!("{words:?} should be refused, gave {other:?}"),
        }
    }

    #[test]
    fn defaults_are_torchruns() {
        let config = launch(&["--nproc-per-node", "4", "train"]);
        assert_eq!(config.nproc_per_node, 4);
        assert_eq!(config.nnodes, 1);
        assert_eq!(config.node_rank, 0);
        assert_eq!(config.master_addr, "127.0.0.1");
        assert_eq!(config.master_port, 29500);
        assert_eq!(config.grace, Duration::from_secs(5));
        assert_eq!(config.program, "train");
        assert!(config.args.is_empty());
        assert_eq!(config.world_size(), 4);
    }

    #[test]
    fn both_value_forms_and_underscore_spellings() {
        let config = launch(&[
            "--nproc_per_node=2",
            "--nnodes",
            "3",
            "--node-rank=2",
            "--master-addr=10.0.0.1",
            "--master_port",
            "1234",
            "--timeout-grace=0.5",
            "prog",
        ]);
        assert_eq!((config.nproc_per_node, config.nnodes, config.node_rank), (2, 3, 2));
        assert_eq!((config.master_addr.as_str(), config.master_port), ("10.0.0.1", 1234));
        assert_eq!(config.grace, Duration::from_millis(500));
        assert_eq!((config.world_size(), config.global_rank(0), config.global_rank(1)), (6, 4, 5));
    }

    #[test]
    fn everything_after_the_program_is_passed_through() {
        let config = launch(&["--nproc-per-node", "1", "prog", "--nproc-per-node", "7", "--help", "--", "x"]);
        assert_eq!(config.program, "prog");
        assert_eq!(config.args, ["--nproc-per-node", "7", "--help", "--", "x"]);
        let config = launch(&["--nproc-per-node", "1", "--", "-weird", "--help"]);
        assert_eq!(config.program, "-weird");
        assert_eq!(config.args, ["--help"]);
    }

    #[test]
    fn help_wins_before_the_program() {
        assert_eq!(parse_strs(&["--help"]), Ok(Parsed::Help));
        assert_eq!(parse_strs(&["--nproc-per-node", "2", "-h", "prog"]), Ok(Parsed::Help));
    }

    #[test]
    fn bad_command_lines_say_what_is_wrong() {
        assert!(error(&[]).contains("--nproc-per-node"));
        assert!(error(&["prog"]).contains("missing --nproc-per-node"));
        assert!(error(&["--nproc-per-node", "0", "prog"]).contains("positive integer"));
        assert!(error(&["--nproc-per-node", "two", "prog"]).contains("'two'"));
        assert!(error(&["--nproc-per-node", "-1", "prog"]).contains("'-1'"));
        assert!(error(&["--nproc-per-node", "2"]).contains("no program"));
        assert!(error(&["--nproc-per-node"]).contains("needs a value"));
        assert!(error(&["--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "2", "p"]).contains("below"));
        assert!(error(&["--nproc-per-node", "2", "--nnodes", "0", "p"]).contains("--nnodes"));
        assert!(error(&["--nproc-per-node", "2", "--master-port", "70000", "p"]).contains("port"));
        assert!(error(&["--nproc-per-node", "2", "--master-port", "0", "p"]).contains("port"));
        assert!(error(&["--nproc-per-node", "2", "--master-addr=", "p"]).contains("empty"));
        assert!(error(&["--nproc-per-node", "2", "--timeout-grace", "-1", "p"]).contains("seconds"));
        assert!(error(&["--nproc-per-node", "2", "--timeout-grace", "1e300", "p"]).contains("seconds"));
        assert!(error(&["--nproc-per-node", "2", "--timeout-grace", "NaN", "p"]).contains("seconds"));
        assert!(error(&["--bogus", "p"]).contains("unknown option '--bogus'"));
        assert!(error(&["--bogus=1", "p"]).contains("unknown option '--bogus'"));
        let huge = usize::MAX.to_string();
        assert!(error(&["--nproc-per-node", &huge, "--nnodes", "2", "p"]).contains("too many"));
    }
}
