//! Starting the ranks, forwarding their output, watching them and stopping them (Unix).

use std::ffi::OsStr;
use std::fmt;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::args::LaunchConfig;

/// How often the launcher looks at its ranks and at received signals. Short enough that a
/// failure stops the job at once, long enough to cost nothing on a busy machine.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Exit code when the program cannot be started, as a shell's "command not found".
const EXIT_CANNOT_START: u8 = 127;

/// How long a failed rank's output threads get to print its last lines before the launcher
/// reports the failure. Bounded, because processes the rank started may still hold its pipes.
const DRAIN_WAIT: Duration = Duration::from_millis(200);

/// A rank's line longer than this is printed in pieces (each with the prefix), so that a rank
/// writing without newlines cannot make the launcher buffer without bound.
const MAX_LINE: u64 = 1 << 20;

/// Held while a whole line (a rank's or the launcher's own) is written, on stdout or stderr:
/// one lock for both streams, because they are often the same file (`2>&1`), where a long
/// line may take several writes.
static OUTPUT: Mutex<()> = Mutex::new(());

/// One started rank.
struct Rank {
    /// Global rank (`RANK`).
    rank: usize,
    /// Its pid, which is also its process group id (see [`spawn`]).
    pid: libc::pid_t,
    /// The process, for `try_wait`/`wait`.
    child: Child,
    /// How it ended, once reaped.
    status: Option<ExitStatus>,
    /// The threads forwarding its stdout and stderr.
    readers: Vec<JoinHandle<()>>,
}

/// Runs the job described by `config` and returns the launcher's exit code.
pub fn run(config: &LaunchConfig) -> u8 {
    if let Err(e) = signals::install() {
        // The job can still run; only Ctrl-C would leave the ranks running.
        note(format_args!("warning: cannot install signal handlers ({e}); signals will not be forwarded"));
    }

    let mut ranks = Vec::with_capacity(config.nproc_per_node);
    for local_rank in 0..config.nproc_per_node {
        let rank = config.global_rank(local_rank);
        match spawn(config, local_rank) {
            Ok(mut child) => {
                let mut readers = Vec::with_capacity(2);
                // Both pipes are there: spawn() asked for them.
                if let Some(out) = child.stdout.take() {
                    readers.extend(forward(out, rank, Stream::Stdout));
                }
                if let Some(err) = child.stderr.take() {
                    readers.extend(forward(err, rank, Stream::Stderr));
                }
                // Pids fit pid_t: the kernel hands them out as pid_t.
                let pid = child.id() as libc::pid_t;
                ranks.push(Rank { rank, pid, child, status: None, readers });
            }
            Err(e) => {
                note(format_args!("cannot start '{}' for rank {rank}: {e}", display(&config.program)));
                stop(&mut ranks, config.grace, None);
                join(ranks);
                return EXIT_CANNOT_START;
            }
        }
    }

    let code = supervise(&mut ranks, config.grace);
    join(ranks);
    code
}

/// Starts local rank `local_rank` with torchrun's environment.
fn spawn(config: &LaunchConfig, local_rank: usize) -> io::Result<Child> {
    Command::new(&config.program)
        .args(&config.args)
        .env("RANK", config.global_rank(local_rank).to_string())
        .env("LOCAL_RANK", local_rank.to_string())
        .env("WORLD_SIZE", config.world_size().to_string())
        .env("LOCAL_WORLD_SIZE", config.nproc_per_node.to_string())
        .env("GROUP_RANK", config.node_rank.to_string())
        .env("MASTER_ADDR", &config.master_addr)
        .env("MASTER_PORT", config.master_port.to_string())
        // Ranks sharing the terminal's input would be confusing, and in a background process
        // group reading it would stop the rank (SIGTTIN) and hang the job.
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // A process group per rank, so that stopping a rank also stops what it started (a
        // shell's or wrapper's children), which would otherwise keep the output pipes open
        // and outlive the job. spawn() returns after exec, so the group exists by then.
        .process_group(0)
        .spawn()
}

/// Polls the ranks until all have exited with 0, one fails, or the launcher gets a signal;
/// returns the exit code.
fn supervise(ranks: &mut [Rank], grace: Duration) -> u8 {
    loop {
        if let Some(signal) = signals::first() {
            note(format_args!("received {:#}; stopping all ranks", SignalName(signal)));
            stop(ranks, grace, None);
            return signal_exit_code(signal);
        }
        let mut running = 0;
        let mut failure = None;
        for (index, rank) in ranks.iter_mut().enumerate() {
            if rank.status.is_some() {
                continue;
            }
            match rank.child.try_wait() {
                Ok(Some(status)) => {
                    rank.status = Some(status);
                    if !status.success() && failure.is_none() {
                        failure = Some((index, status));
                    }
                }
                Ok(None) => running += 1,
                Err(e) => {
                    // Cannot happen for an unreaped child of ours (SIGCHLD is reset to its
                    // default in signals::install); without a status the job cannot be
                    // watched, so stop it rather than hang.
                    note(format_args!(
                        "cannot wait for rank {} (pid {}): {e}; stopping all ranks",
                        rank.rank, rank.pid
                    ));
                    stop(ranks, grace, None);
                    return 1;
                }
            }
        }
        if let Some((index, status)) = failure {
            let rank = &ranks[index];
            drain_output(rank);
            let action = if running > 0 { "; stopping the other ranks" } else { "" };
            note(format_args!("rank {} (pid {}) {}{action}", rank.rank, rank.pid, Describe(status)));
            stop(ranks, grace, Some(index));
            return status_exit_code(status);
        }
        if running == 0 {
            return 0;
        }
        thread::sleep(POLL_INTERVAL);
    }
}

/// Stops the ranks that are still running: SIGTERM to their process groups, up to `grace` for
/// them to exit, then SIGKILL. Reaps them and reports each one's end on stderr.
///
/// `failed` is the rank whose failure stops the job: it has exited, but what it started may
/// still run (and hold its output pipes), so its group gets the same signals.
fn stop(ranks: &mut [Rank], grace: Duration, failed: Option<usize>) {
    let targets: Vec<usize> = (0..ranks.len()).filter(|&i| ranks[i].status.is_none()).collect();
    let groups: Vec<libc::pid_t> = targets.iter().chain(&failed).map(|&i| ranks[i].pid).collect();
    for &group in &groups {
        signal_group(group, libc::SIGTERM);
    }

    // `None`: a grace period too long for the clock is as good as waiting forever.
    let deadline = Instant::now().checked_add(grace);
    let signals_before = signals::count();
    let mut cut_short = false;
    loop {
        let mut running = false;
        for &i in &targets {
            let rank = &mut ranks[i];
            if rank.status.is_none() {
                match rank.child.try_wait() {
                    Ok(Some(status)) => rank.status = Some(status),
                    // On an error, SIGKILL and the blocking wait() below settle it.
                    Ok(None) | Err(_) => running = true,
                }
            }
        }
        if !running || deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        if signals::count() != signals_before {
            note(format_args!("another signal; killing the ranks now"));
            cut_short = true;
            break;
        }
        thread::sleep(POLL_INTERVAL);
    }

    // SIGKILL also goes to the groups of ranks that did exit: what they started may have
    // ignored SIGTERM and would still hold the output pipes open. The group ids cannot have
    // been reused meanwhile: a group id stays taken while any member lives, and pids are not
    // handed out again within the moment since their leaders were reaped (which is why
    // ranks that ended earlier, perhaps long ago, are left alone).
    for &group in &groups {
        signal_group(group, libc::SIGKILL);
    }
    for &i in &targets {
        let rank = &mut ranks[i];
        let killed = rank.status.is_none();
        if killed {
            match rank.child.wait() {
                Ok(status) => rank.status = Some(status),
                Err(e) => {
                    note(format_args!("cannot wait for rank {} (pid {}): {e}", rank.rank, rank.pid));
                    continue;
                }
            }
        }
        if let Some(status) = rank.status {
            let after = match (killed, cut_short) {
                (false, _) => String::new(),
                (true, false) => format!(" after the {} s grace period", grace.as_secs_f64()),
                (true, true) => " on the second signal".to_owned(),
            };
            note(format_args!("rank {} (pid {}) {}{after}", rank.rank, rank.pid, Describe(status)));
        }
    }
}

/// Sends `signal` to the process group led by `pid`.
fn signal_group(pid: libc::pid_t, signal: libc::c_int) {
    // SAFETY: kill(2) has no memory-safety preconditions. The negative pid addresses the
    // group this rank leads. An error (ESRCH: the group is gone) means there is nothing left
    // to signal.
    unsafe {
        libc::kill(-pid, signal);
    }
}

/// The launcher's stdout or stderr.
#[derive(Clone, Copy)]
enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    /// Writes one whole line under the [`OUTPUT`] lock.
    fn write_line(self, line: &[u8]) -> io::Result<()> {
        let _guard = OUTPUT.lock().unwrap_or_else(PoisonError::into_inner);
        match self {
            Stream::Stdout => {
                let mut out = io::stdout().lock();
                out.write_all(line)?;
                out.flush()
            }
            Stream::Stderr => io::stderr().lock().write_all(line),
        }
    }
}

/// Starts a thread that prints each line of `source` (rank `rank`'s stdout or stderr) on
/// `stream` with the prefix `[rank<rank>]: `. `None` (after a warning) when no thread can be
/// started: the pipe is then closed and the rank's writes fail.
fn forward(source: impl Read + Send + 'static, rank: usize, stream: Stream) -> Option<JoinHandle<()>> {
    let spawned = thread::Builder::new().name(format!("rank{rank}-output")).spawn(move || {
        let prefix = format!("[rank{rank}]: ");
        let mut reader = BufReader::new(source);
        let mut line = Vec::new();
        loop {
            line.clear();
            line.extend_from_slice(prefix.as_bytes());
            // Bytes, not str: a rank's output need not be UTF-8.
            match reader.by_ref().take(MAX_LINE).read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            // A last line without newline, or a piece of an overlong line.
            if line.last() != Some(&b'\n') {
                line.push(b'\n');
            }
            // A write error (the launcher's stdout was closed) is not a reason to stop
            // reading: the pipe must still be drained, or the rank would block writing.
            let _ = stream.write_line(&line);
        }
    });
    match spawned {
        Ok(handle) => Some(handle),
        Err(e) => {
            note(format_args!("warning: cannot forward the output of rank {rank}: {e}"));
            None
        }
    }
}

/// Gives `rank`'s output threads up to [`DRAIN_WAIT`] to print what it wrote, so that the
/// launcher's message about its end comes after its last lines (usually the error).
fn drain_output(rank: &Rank) {
    let start = Instant::now();
    while !rank.readers.iter().all(JoinHandle::is_finished) && start.elapsed() < DRAIN_WAIT {
        thread::sleep(Duration::from_millis(5));
    }
}

/// Waits for the output threads: they end when every process holding a rank's pipes is gone.
fn join(ranks: Vec<Rank>) {
    for reader in ranks.into_iter().flat_map(|rank| rank.readers) {
        // A panicked reader has lost its remaining lines; nothing more can be done here.
        let _ = reader.join();
    }
}

/// Prints one of the launcher's own messages on stderr, as a whole line. Write errors are
/// ignored (eprintln! would panic on a closed stderr).
fn note(message: fmt::Arguments<'_>) {
    let line = format!("genesis-run: {message}\n");
    let _ = Stream::Stderr.write_line(line.as_bytes());
}

/// The program's name for messages.
fn display(program: &OsStr) -> std::borrow::Cow<'_, str> {
    program.to_string_lossy()
}

/// The launcher's exit code for a rank that failed with `status`: its exit code, or 128 + S
/// for death by signal S (as shells report it).
fn status_exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        // Exit codes are 0..=255 on Unix.
        (Some(code), _) => u8::try_from(code).unwrap_or(1),
        (None, Some(signal)) => signal_exit_code(signal),
        // Neither: stopped or continued, which wait() does not report without WUNTRACED.
        (None, None) => 1,
    }
}

/// 128 + `signal`, the shell convention for "ended by this signal".
fn signal_exit_code(signal: libc::c_int) -> u8 {
    u8::try_from(128 + signal).unwrap_or(u8::MAX)
}

/// How a rank ended, in words: `exited with code 3`, `was killed by signal 15 (SIGTERM)`.
struct Describe(ExitStatus);

impl fmt::Display for Describe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.0.code(), self.0.signal()) {
            (Some(code), _) => write!(f, "exited with code {code}"),
            (None, Some(signal)) => {
                write!(f, "was killed by {}", SignalName(signal))?;
                if self.0.core_dumped() {
                    f.write_str(" (core dumped)")?;
                }
                Ok(())
            }
            (None, None) => write!(f, "ended with status {}", self.0),
        }
    }
}

/// A signal for messages: `SIGTERM`, or `signal 15 (SIGTERM)` in [`Describe`]'s long form.
struct SignalName(libc::c_int);

impl SignalName {
    /// The usual name of the signals a rank or the launcher commonly gets. A fixed table:
    /// strsignal(3) is not thread-safe, and the numbers differ between Unixes.
    fn name(&self) -> Option<&'static str> {
        Some(match self.0 {
            libc::SIGHUP => "SIGHUP",
            libc::SIGINT => "SIGINT",
            libc::SIGQUIT => "SIGQUIT",
            libc::SIGILL => "SIGILL",
            libc::SIGTRAP => "SIGTRAP",
            libc::SIGABRT => "SIGABRT",
            libc::SIGBUS => "SIGBUS",
            libc::SIGFPE => "SIGFPE",
            libc::SIGKILL => "SIGKILL",
            libc::SIGUSR1 => "SIGUSR1",
            libc::SIGSEGV => "SIGSEGV",
            libc::SIGUSR2 => "SIGUSR2",
            libc::SIGPIPE => "SIGPIPE",
            libc::SIGALRM => "SIGALRM",
            libc::SIGTERM => "SIGTERM",
            libc::SIGXCPU => "SIGXCPU",
            _ => return None,
        })
    }
}

impl fmt::Display for SignalName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `{:#}`: the bare name, for signals the launcher receives (always one of the table's).
        match (self.name(), f.alternate()) {
            (Some(name), true) => f.write_str(name),
            (Some(name), false) => write!(f, "signal {} ({name})", self.0),
            (None, _) => write!(f, "signal {}", self.0),
        }
    }
}

/// The launcher's handler for SIGINT, SIGTERM and SIGHUP: it only records the signal; the
/// polling loops act on it.
mod signals {
    use std::io;
    use std::ptr;
    use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

    /// The first signal received (0: none), which gives the exit code.
    static FIRST: AtomicI32 = AtomicI32::new(0);
    /// Signals received so far: a second one cuts the grace period short.
    static COUNT: AtomicUsize = AtomicUsize::new(0);

    /// The signals that stop the job.
    const HANDLED: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

    extern "C" fn record(signal: libc::c_int) {
        // Lock-free atomics only: nothing else is async-signal-safe here.
        let _ = FIRST.compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst);
        COUNT.fetch_add(1, Ordering::SeqCst);
    }

    /// Installs the handler for [`HANDLED`], except for signals that are ignored: a job
    /// started under `nohup` (SIGHUP) or in the background by a script (SIGINT) was asked
    /// not to stop on them, and its ranks inherit the same. Also resets SIGCHLD to its
    /// default, since an inherited "ignore" would make the kernel reap the ranks before the
    /// launcher can read their exit status.
    pub fn install() -> io::Result<()> {
        // SAFETY: sigaction(2) with valid pointers (a zeroed sigaction is a valid value, then
        // filled in) and a handler that only touches atomics. The handlers are installed
        // before any rank is started; exec resets caught signals to their defaults in the
        // ranks.
        unsafe {
            let mut default: libc::sigaction = std::mem::zeroed();
            default.sa_sigaction = libc::SIG_DFL;
            libc::sigemptyset(&mut default.sa_mask);
            if libc::sigaction(libc::SIGCHLD, &default, ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }

            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = record as extern "C" fn(libc::c_int) as libc::sighandler_t;
            // SA_RESTART: the output threads' reads are not interrupted by the signal.
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            for signal in HANDLED {
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(signal, ptr::null(), &mut old) != 0 {
                    return Err(io::Error::last_os_error());
                }
                if old.sa_sigaction == libc::SIG_IGN {
                    continue;
                }
                if libc::sigaction(signal, &action, ptr::null_mut()) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
        }
        Ok(())
    }

    /// The first signal received, if any.
    pub fn first() -> Option<libc::c_int> {
        match FIRST.load(Ordering::SeqCst) {
            0 => None,
            signal => Some(signal),
        }
    }

    /// How many signals were received so far.
    pub fn count() -> usize {
        COUNT.load(Ordering::SeqCst)
    }
}
